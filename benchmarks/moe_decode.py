"""Decode throughput of a sparse MoE model (Qwen3-MoE layout, random weights) at 1 and 16 running
requests, with the parameter bytes decode reads against this machine's memory bandwidth.

*active params/token*: the dense part (attention, norms, routers, LM head) plus top-k experts per
MoE layer, what one token needs. *bytes/step*: what a decode step actually reads: the dense part
once plus every expert that received a token in that step (counted with hooks: with 16 requests
most experts are hit, so a step reads far more than one token's active parameters). *GB/s*:
bytes/step x decode steps / decode time, against a streaming read's bandwidth.

Run: python -m benchmarks.moe_decode [--batch-sizes 1 16] [--experts 32 --top-k 4 ...]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, models
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3MoeConfig

from benchmarks.hardware_peak import memory_bandwidth
from benchmarks.machine import load_average, machine_info
from minisgl import LLM, SamplingParams
from minisgl.layers.moe import SparseMoE


def random_moe_folder(folder: Path, args: argparse.Namespace) -> Path:
    cfg = Qwen3MoeConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=2, head_dim=args.hidden // 8,
        num_experts=args.experts, num_experts_per_tok=args.top_k, moe_intermediate_size=args.expert_size,
        norm_topk_prob=True, max_position_embeddings=4096, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    word = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))  # prompts are token ids
    PreTrainedTokenizerFast(tokenizer_object=word, unk_token="<unk>", eos_token="<unk>").save_pretrained(folder)
    return folder


def count_expert_calls(llm: LLM, max_decode_rows: int) -> list[int]:
    """Hooks that append, for every MoE block run on at most ``max_decode_rows`` tokens (a decode
    pass: prefill passes carry whole prompts), how many experts received a token."""
    log: list[int] = []
    for layer in llm.scheduler.engine.model.model.layers:
        if not isinstance(layer.mlp, SparseMoE):
            continue
        calls = [0]
        for expert in layer.mlp.experts:
            expert.register_forward_hook(lambda *_, c=calls: c.__setitem__(0, c[0] + 1))

        def block_done(_: object, inputs: tuple[torch.Tensor], __: object, c: list[int] = calls) -> None:
            if inputs[0].shape[0] <= max_decode_rows:
                log.append(c[0])
            c[0] = 0

        layer.mlp.register_forward_hook(block_done)
    return log


def param_bytes(llm: LLM) -> tuple[int, int, int]:
    """(bytes of the dense part, of one expert, number of MoE layers) of the loaded model."""
    model = llm.scheduler.engine.model
    expert_bytes, dense, moe_layers = 0, 0, 0
    for layer in model.model.layers:
        if isinstance(layer.mlp, SparseMoE):
            moe_layers += 1
            expert_bytes = sum(p.numel() * p.element_size() for p in layer.mlp.experts[0].parameters())
    experts = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    dense = sum(p.numel() * p.element_size() for p in model.parameters()) - experts
    dense -= model.model.embed_tokens.weight.numel() * model.model.embed_tokens.weight.element_size()  # rows only
    return dense, expert_bytes, moe_layers


def measure(folder: Path, batch: int, prompt_len: int, output_len: int, seed: int = 0) -> dict[str, float]:
    """Decode of ``batch`` requests on the model in ``folder``: tok/s, active params per token,
    bytes read per decode step, and those bytes per second."""
    llm = LLM(
        str(folder), cache_type="naive", max_running_req=batch, num_page_override=batch * (prompt_len + output_len),
        speculative_algorithm="none",  # one token per request a step: the bytes a step reads are per token
    )  # fmt: skip
    try:
        moe = llm.scheduler.engine.model.config.moe
        assert moe is not None, "not a MoE model"
        dense, expert, moe_layers = param_bytes(llm)
        g = torch.Generator().manual_seed(seed)
        prompts = [torch.randint(1, llm.scheduler.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(batch)]
        params = SamplingParams(max_tokens=output_len, ignore_eos=True)
        llm.generate(prompts, params, use_tqdm=False)  # warm-up
        log = count_expert_calls(llm, batch)
        before = vars(llm.scheduler.stats).copy()
        llm.generate(prompts, params, use_tqdm=False)
        stats = {k: v - before[k] for k, v in vars(llm.scheduler.stats).items()}
    finally:
        llm.shutdown()
    steps, seconds = stats["decode_steps"], stats["decode_seconds"]
    bytes_per_step = dense + expert * sum(log) / steps
    return {
        "tok_s": stats["decode_tokens"] / seconds,
        "active_params": (dense + expert * moe.top_k * moe_layers) / 4,  # fp32
        "bytes_per_step": bytes_per_step,
        "bytes_s": bytes_per_step * steps / seconds,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--expert-size", type=int, default=384, help="moe_intermediate_size")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    args = parser.parse_args(argv)

    print(machine_info(torch.get_num_threads()))
    print(f"load average before: {load_average()}")
    bandwidth = memory_bandwidth(0.5)
    with tempfile.TemporaryDirectory() as tmp:
        folder = random_moe_folder(Path(tmp), args)
        print(
            f"\nrandom Qwen3-MoE: {args.layers} layers, hidden {args.hidden}, {args.experts} experts top-{args.top_k} "
            f"(expert intermediate {args.expert_size}), fp32; {args.prompt_len}-token prompts -> {args.output_len} tokens; "
            f"streaming read {bandwidth / 1e9:.1f} GB/s"
        )
        print("| running | decode tok/s | active params/token | bytes/step | GB/s | of bandwidth |")
        print("|---|---|---|---|---|---|")
        for batch in args.batch_sizes:
            r = measure(folder, batch, args.prompt_len, args.output_len)
            print(
                f"| {batch} | {r['tok_s']:.1f} | {r['active_params'] / 1e6:.1f}M | {r['bytes_per_step'] / 1e6:.0f} MB | "
                f"{r['bytes_s'] / 1e9:.2f} | {r['bytes_s'] / bandwidth:.0%} |"
            )
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
