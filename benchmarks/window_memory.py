"""Sliding-window KV memory: what a windowed model holds, against full attention in every layer.

A model in Gemma 3 270M's shape (18 layers, every 6th attending fully, the others within 512
positions; hidden 640, 4 query heads and 1 KV head of 256; the default model's tokenizer and
vocabulary instead of Gemma's 262k, which only the embedding would feel) with random weights, fp32:

1. Capacity: tokens the KV budget holds with the window pool (``EngineConfig.window_kv_ratio``)
   against full attention in every layer in the same bytes (the start-up log's figure).
2. One long context: the smallest KV pool that admits one request of ``--context`` tokens, and the
   most KV bytes it held while it ran (full slots + window slots in use), against what full attention
   in every layer holds for those tokens.
3. A shared-prefix burst (``--requests`` prompts under one ``--prefix``-token system prompt, 8 more
   each, and the same prompts again): prompt tokens served from the cache, peak window slots in use,
   window KV evicted; at the default ratio and at 1 (every cached token keeps its window KV).

Run: python -m benchmarks.window_memory [--context 8192] [--requests 16] [--prefix 1000] [--kv-memory-gb 0.25]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.machine import load_average, machine_info
from minisgl import LLM, SamplingParams
from minisgl.kvcache.pool import KVPool
from minisgl.models.gguf import default_model_path, gguf_model_folder
from minisgl.tuning import WINDOW_KV_RATIO

SHAPE = {
    "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 512, "query_pre_attn_scalar": 256,
    "max_position_embeddings": 32768,
}  # fmt: skip


def write_model(folder: Path) -> Path:
    """The random Gemma 3 folder, with the default model's tokenizer files."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tokenizer = gguf_model_folder(default_model_path())
    vocab = json.loads((tokenizer / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    config = Gemma3TextConfig(**SHAPE, vocab_size=vocab, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    Gemma3ForCausalLM(config).save_pretrained(folder)
    for item in tokenizer.iterdir():
        if item.name != "config.json":
            shutil.copy(item, folder / item.name)
    return folder


def full_attention_bytes(llm: LLM, tokens: int) -> int:
    cfg = llm.scheduler.engine.model_config
    return tokens * KVPool.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.float32)


def held_bytes(llm: LLM) -> int:
    """KV bytes in slots that are not free: full slots (their layers) and window slots (theirs)."""
    engine, usage = llm.scheduler.engine, llm.scheduler.kv_usage()
    full = (usage["capacity"] - usage["free"]) * engine.pool.nbytes // engine.pool.num_slots
    window_pool = engine.window_pool
    assert window_pool is not None
    window = (usage["window_capacity"] - usage["window_free"]) * window_pool.nbytes // window_pool.num_slots
    return full + window


def run(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[int, int, int]:
    """(prompt tokens served from the cache, peak window slots in use, peak KV bytes held), step by step."""
    scheduler = llm.scheduler
    for rid, prompt in enumerate(prompts):
        scheduler.add(scheduler.make_request(rid, prompt, params))
    cached: dict[int, int] = {}
    peak_window = peak_bytes = 0
    while scheduler.has_work:
        for out in scheduler.step():
            cached[out.rid] = out.cached_tokens
        usage = scheduler.kv_usage()
        peak_window = max(peak_window, usage["window_capacity"] - usage["window_free"])
        peak_bytes = max(peak_bytes, held_bytes(llm))
    scheduler.check_accounting()
    return sum(cached.values()), peak_window, peak_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prefix", type=int, default=1000)
    parser.add_argument("--kv-memory-gb", type=float, default=0.25)
    args = parser.parse_args()
    print(machine_info(torch.get_num_threads()))
    print(f"model: random Gemma 3 270M shape {SHAPE}, fp32, window_kv_ratio default {WINDOW_KV_RATIO}")
    workdir = Path(tempfile.mkdtemp(prefix="minisgl-window-"))
    try:
        folder = write_model(workdir / "gemma3")
        g = torch.Generator().manual_seed(0)

        def tokens(n: int) -> list[int]:
            return torch.randint(10, 40000, (n,), generator=g).tolist()

        # 1. Capacity in the same budget.
        llm = LLM(str(folder), quantization="none", kv_memory_gb=args.kv_memory_gb)
        capacity = llm.scheduler.kv_usage()["capacity"]
        every_layer = int(args.kv_memory_gb * 2**30) // full_attention_bytes(llm, 1)
        print(f"\n1. KV budget {args.kv_memory_gb} GiB: {capacity} tokens with the window pool "
              f"({llm.scheduler.kv_usage()['window_capacity']} window slots), {every_layer} with full attention "
              f"in every layer: {capacity / every_layer:.2f}x")  # fmt: skip
        llm.shutdown()

        # 2. One long context in the smallest pool that admits it.
        out_len = 16
        need = args.context
        llm = LLM(str(folder), quantization="none", num_page_override=need)
        pool = llm.scheduler.engine.memory["kv_pool"]
        start = time.perf_counter()
        _, peak_window, peak = run(
            llm, [tokens(need - out_len + 1)], SamplingParams(max_tokens=out_len, ignore_eos=True)
        )
        full = full_attention_bytes(llm, need)
        print(f"\n2. one {need}-token context: KV pool {pool / 2**20:.1f} MiB, peak held {peak / 2**20:.1f} MiB "
              f"(window slots in use at most {peak_window}); full attention in every layer holds "
              f"{full / 2**20:.1f} MiB: pool {pool / full:.3f}x, held {peak / full:.3f}x "
              f"({time.perf_counter() - start:.1f} s)")  # fmt: skip
        llm.shutdown()

        # 3. The shared-prefix burst, twice.
        system = tokens(args.prefix)
        prompts = [system + tokens(8) for _ in range(args.requests)]
        total = 2 * sum(len(p) for p in prompts)
        print(f"\n3. shared prefix: {args.requests} requests x ({args.prefix} + 8) tokens, twice, 8 output tokens each")
        for ratio in (WINDOW_KV_RATIO, 1.0):
            llm = LLM(str(folder), quantization="none", kv_memory_gb=args.kv_memory_gb, window_kv_ratio=ratio)
            params = SamplingParams(max_tokens=8, ignore_eos=True)
            start = time.perf_counter()
            (first, peak_1, _), (second, peak_2, _) = run(llm, prompts, params), run(llm, prompts, params)
            usage = llm.scheduler.kv_usage()
            hits = first + second
            print(f"   window_kv_ratio {ratio}: cached {hits}/{total} prompt tokens ({hits / total:.1%}); window pool "
                  f"{usage['window_capacity']} slots, at most {max(peak_1, peak_2)} held, "
                  f"{usage['window_evicted_total']} evicted ({time.perf_counter() - start:.1f} s)")  # fmt: skip
            llm.shutdown()
        print(f"\nload average after: {load_average()}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
