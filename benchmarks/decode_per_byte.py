"""Decode speed per weight byte across model families: one request decoding alone on models of
different shapes (by default the scale models of ``benchmarks/scale_model.py`` under 2B: SmolLM2-1.7B's
llama layers, Qwen3-1.7B's with Q/K head norms, Qwen2.5-1.5B's with Q/K/V biases, all Q4_1; ``scale-7b``
on request).

At one request a decode step reads every weight once, so *GB/s* = tok/s x weight bytes per step is
the rate the weights stream at: equal rates mean each family's layers decode equally well whatever
their size (issue #21: the same within 10%). *weight bytes/step*: what each ``Linear`` reads at one
row (``benchmarks.roofline.weight_bytes_per_step``: the quantized buffers; the embedding is a
lookup); *KV bytes/step*: the cache entries a step attends over, on average (not in GB/s: small at
these lengths). *single call*: whether every decode step of the warm-up ran the layers as one C call
(``decode_layer.c``); *read GB/s*: the higher of two streaming reads of this machine's memory
(``benchmarks.hardware_peak.memory_bandwidth``), one just before the timed decode and one just after
it, with the model loaded: a VM's bandwidth moves with its neighbours' load within minutes, so each
run is set against the reads beside it; *of bandwidth*: GB/s over that.

With ``--repeats N`` the whole sequence (every kernels choice, every model) runs N times, and a
summary gives each figure's median over the repeats: this VM's run-to-run spread is larger than the
differences the targets ask about, so a ratio is taken within one repeat (the same models one after
the other) and its median reported. *step time vs the first kernels*: the first ``--kernels``
choice's tok/s over this one's, on the same model in the same repeat (issue #21: AVX2 within 1.3x).

Run: python -m benchmarks.decode_per_byte [--models scale-1.7b scale-1.7b-qwen3 scale-1.5b-qwen2]
     [--kernels auto c:avx2 ...] [--prompt-len 64] [--output-len 128] [--repeats 1]
"""

from __future__ import annotations

import argparse
import gc
import statistics
from typing import Any

import torch

from benchmarks.hardware_peak import memory_bandwidth
from benchmarks.machine import load_average, machine_info
from benchmarks.roofline import weight_bytes_per_step
from benchmarks.scale_model import resolve_scale_model
from minisgl import LLM, SamplingParams
from minisgl.kernels.variants import KERNEL_CHOICES

WARMUP_TOKENS = 8

FAMILIES = ["scale-1.7b", "scale-1.7b-qwen3", "scale-1.5b-qwen2"]  # one of each family, at the same size


def count_single_call_steps(llm: LLM, prompt: list[int]) -> tuple[int, int]:
    """(decode steps that ran as one C call, decode steps) of generating ``WARMUP_TOKENS`` after
    ``prompt``: a warm-up, its steps counted through the model's fused decoder, which is left as it was."""
    fused = getattr(llm.scheduler.engine.model, "_fused_decoder", None)
    calls = [0]
    if fused is not None:
        run = fused.run

        def counted(*args: Any) -> Any:
            calls[0] += 1
            return run(*args)

        fused.run = counted
    before = llm.scheduler.stats.decode_steps
    try:
        llm.generate([prompt], SamplingParams(max_tokens=WARMUP_TOKENS, ignore_eos=True), use_tqdm=False)
    finally:
        if fused is not None:
            del fused.run  # the class's method again
    return calls[0], llm.scheduler.stats.decode_steps - before


def measure(model: str, kernels: str, prompt_len: int, output_len: int, seed: int = 0) -> dict[str, Any]:
    """One request's decode on ``model`` (a path or a scale model's name) with ``kernels``: tok/s, the
    weight and KV bytes a step reads, and whether the steps ran as one C call each."""
    llm = LLM(
        resolve_scale_model(model), kernels=kernels, max_running_req=1, cache_type="naive",
        num_page_override=prompt_len + max(output_len, WARMUP_TOKENS) + 1,
        speculative_algorithm="none",  # one token a step: the bytes a step reads are per token
    )  # fmt: skip
    try:
        engine = llm.scheduler.engine
        g = torch.Generator().manual_seed(seed)
        prompt = torch.randint(1, llm.scheduler.vocab_size, (prompt_len,), generator=g).tolist()
        llm.flush_cache()
        fused_steps, warm_steps = count_single_call_steps(llm, prompt)
        llm.flush_cache()
        read_before = memory_bandwidth(0.5)
        before = vars(llm.scheduler.stats).copy()
        llm.generate([prompt], SamplingParams(max_tokens=output_len, ignore_eos=True), use_tqdm=False)
        stats = {k: v - before[k] for k, v in vars(llm.scheduler.stats).items()}
        read_after = memory_bandwidth(0.5)
        cfg = engine.model_config
        kv_bytes_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * engine.pool.k.element_size()
        weight_bytes = weight_bytes_per_step(llm, rows=1)
        variant = engine.kernels.variant.description if engine.kernels is not None else "torch's (no C kernels)"
    finally:
        llm.shutdown()
        gc.collect()  # the next model loads into the memory this one held
    steps, seconds = stats["decode_steps"], stats["decode_seconds"]
    weight_gbps = weight_bytes * steps / seconds / 1e9
    read_gbps = max(read_before, read_after) / 1e9
    return {
        "kernels": variant,
        "single_call": warm_steps > 0 and fused_steps == warm_steps,
        "tok_s": stats["decode_tokens"] / seconds,
        "weight_bytes": weight_bytes,
        "kv_bytes": kv_bytes_per_token * stats["decode_kv_tokens"] / steps,
        "weight_gbps": weight_gbps,
        "read_gbps": read_gbps,
        "of_bandwidth": weight_gbps / read_gbps,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=FAMILIES, help="scale model names or GGUF paths")
    parser.add_argument("--kernels", nargs="+", default=["auto"], choices=KERNEL_CHOICES, help="EngineConfig.kernels")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1, help="times the whole sequence runs; medians summarised")
    args = parser.parse_args(argv)
    args.models = list(dict.fromkeys(args.models))  # each once: a repeat runs them all

    for model in args.models:  # write missing scale models first: off the clock and before the bandwidth
        resolve_scale_model(model)
    print(machine_info(torch.get_num_threads()))
    print(f"load average before: {load_average()}")
    print(f"one request: {args.prompt_len}-token prompt -> {args.output_len} tokens")
    results = {
        (repeat, kernels, model): measure(model, kernels, args.prompt_len, args.output_len)
        for repeat in range(args.repeats)
        for kernels in args.kernels
        for model in args.models
    }

    def per_byte(repeat: int, kernels: str, model: str) -> float:  # against the first model, same repeat
        return results[repeat, kernels, model]["weight_gbps"] / results[repeat, kernels, args.models[0]]["weight_gbps"]

    print(
        "| repeat | model | kernels | single call | decode tok/s | weight bytes/step | KV bytes/step | GB/s "
        "| read GB/s | of bandwidth | GB/s vs the first model |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for (repeat, kernels, model), r in results.items():
        print(
            f"| {repeat + 1} | {model} | {kernels}: {r['kernels']} | {'yes' if r['single_call'] else 'no'} | "
            f"{r['tok_s']:.1f} | {r['weight_bytes'] / 1e6:.0f} MB | {r['kv_bytes'] / 1e6:.1f} MB | "
            f"{r['weight_gbps']:.2f} | {r['read_gbps']:.1f} | {r['of_bandwidth']:.0%} | "
            f"{per_byte(repeat, kernels, model):.2f} |"
        )
    repeats = range(args.repeats)
    print(
        f"\nmedians over {args.repeats} repeat(s)\n| model | kernels | decode tok/s | of bandwidth (range) | GB/s vs the "
        "first model | step time vs the first kernels (range) |\n|---|---|---|---|---|---|"
    )
    for kernels in args.kernels:
        for model in args.models:
            tok_s = statistics.median(results[i, kernels, model]["tok_s"] for i in repeats)
            shares = [results[i, kernels, model]["of_bandwidth"] for i in repeats]
            slower = [
                results[i, args.kernels[0], model]["tok_s"] / results[i, kernels, model]["tok_s"] for i in repeats
            ]
            share = f"{statistics.median(shares):.0%} ({min(shares):.0%}-{max(shares):.0%})"
            print(
                f"| {model} | {kernels} | {tok_s:.1f} | {share} | "
                f"{statistics.median(per_byte(i, kernels, model) for i in repeats):.2f} | "
                f"{statistics.median(slower):.2f}x ({min(slower):.2f}-{max(slower):.2f}) |"
            )
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
