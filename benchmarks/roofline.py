"""How close the engine gets to this machine's ceilings, with a profile of where the time goes.

1. Measures the matmul peak and memory bandwidth (``benchmarks.hardware_peak``).
2. Runs a prefill-heavy workload (distinct long prompts, 1 output token) and a decode-heavy one
   (short prompts, many output tokens, 32 at a time) for each mode (dtype and quantization), and
   reports achieved prefill FLOP/s and decode bytes/s (weights + KV read per step) as a fraction of
   the ceilings. The weight bytes are those each ``Linear`` reads at that batch: its quantized
   weight where a kernel takes the batch (the C kernels take any), its bf16 expansion past torch's ``max_kernel_rows``.
3. Profiles both workloads (torch.profiler) and prints the top operators.
4. Greedy agreement of each mode with the first (fp32 without quantization: token-exact with transformers).

Run: python -m benchmarks.roofline [--modes float32/none float32/auto bfloat16/none] [--kernels auto|torch|c:avx2 ...]
     [--out docs/benchmarks/roofline.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.hardware_peak import measure
from benchmarks.machine import load_average, machine_info
from minisgl import LLM, SamplingParams
from minisgl.kernels.variants import KERNEL_CHOICES
from minisgl.layers.linear import Linear

AGREEMENT_PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def quicksort(arr):",
    "The three laws of thermodynamics are",
    "Q: How many legs does a spider have?\nA:",
    "Once upon a time",
    "List three uses of copper:",
    "Translate 'thank you' into Spanish:",
]


def layer_params(llm: LLM) -> int:
    """Parameters every token multiplies through (all but the embedding and LM head)."""
    model = llm.scheduler.engine.model
    return sum(p.numel() for p in model.model.layers.parameters())


def weight_bytes_per_step(llm: LLM, rows: int) -> int:
    """Bytes of weights a forward pass of ``rows`` rows reads: each linear layer's quantized buffers
    where a kernel takes that many rows (the C kernels take any), else the bf16 weight it is expanded
    to, or its dense weight (the embedding is a lookup)."""
    total = 0
    for module in llm.scheduler.engine.model.modules():
        if not isinstance(module, Linear):
            continue
        q = module.quantized
        if q is not None and (q.kernels is not None or rows <= q.max_kernel_rows):
            total += sum(b.numel() * b.element_size() for b in q.buffers())
        elif q is not None:
            total += q.out_features * q.in_features * 2
        else:
            total += module.weight.numel() * module.weight.element_size()
    return total


def run_workload(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> dict[str, float]:
    llm.flush_cache()
    llm.generate(prompts[:2], params, use_tqdm=False)  # warm-up
    llm.flush_cache()
    before = vars(llm.scheduler.stats).copy()
    llm.generate(prompts, params, use_tqdm=False)
    after = vars(llm.scheduler.stats)
    return {k: after[k] - before[k] for k in before}


def profile_table(llm: LLM, prompts: list[list[int]], params: SamplingParams, rows: int = 12) -> str:
    llm.flush_cache()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        llm.generate(prompts, params, use_tqdm=False)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--modes", nargs="+", default=["float32/none", "float32/auto", "bfloat16/none"], help="dtype/quantization"
    )
    parser.add_argument(
        "--kernels", default="auto", choices=KERNEL_CHOICES, help="EngineConfig.kernels: c:avx2 forces that build"
    )
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/roofline.md"))
    args = parser.parse_args()

    lines = [
        f"# Roofline\n\nMachine: `{machine_info(torch.get_num_threads())}`\n",
        f"Kernels: {args.kernels}\n",
        f"Load average at start: {load_average()}\n",
    ]
    peak = measure()
    lines.append(
        f"Ceilings: fp32 matmul {peak['fp32_gflops']:.0f} GFLOP/s, bf16 matmul {peak['bf16_gflops']:.0f} GFLOP/s, "
        f"memory read {peak['read_gbps']:.1f} GB/s\n"
    )
    g = torch.Generator().manual_seed(0)
    lines.append(
        "| dtype / quantization | prefill tok/s | prefill GFLOP/s | of matmul peak | decode tok/s (32 running) | decode GB/s | of bandwidth | greedy agreement with the first |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    reference: list[list[int]] = []
    profiles: list[str] = []
    for mode in args.modes:
        dtype, quantization = mode.split("/")
        llm = LLM(
            dtype=dtype, quantization=quantization, num_page_override=32768, cache_type="naive", max_running_req=32,
            kernels=args.kernels, speculative_algorithm="none",  # one token per request a step: per-step figures
        )  # fmt: skip
        vocab, cfg = llm.scheduler.vocab_size, llm.scheduler.engine.model_config
        prefill_prompts = [torch.randint(100, vocab, (512,), generator=g).tolist() for _ in range(8)]
        decode_prompts = [torch.randint(100, vocab, (32,), generator=g).tolist() for _ in range(32)]
        pre = run_workload(llm, prefill_prompts, SamplingParams(max_tokens=1))
        dec = run_workload(llm, decode_prompts, SamplingParams(max_tokens=64, ignore_eos=True))
        itemsize = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
        flops = 2 * layer_params(llm) * pre["prefill_tokens"] + 2 * cfg.vocab_size * cfg.hidden_size * len(
            prefill_prompts
        )
        prefill_gflops = flops / pre["prefill_seconds"] / 1e9
        weight_bytes = weight_bytes_per_step(llm, rows=len(decode_prompts))
        kv_bytes_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize
        decode_bytes = weight_bytes * dec["decode_steps"] + kv_bytes_per_token * dec["decode_kv_tokens"]
        decode_gbps = decode_bytes / dec["decode_seconds"] / 1e9
        decode_tps = dec["decode_steps"] and dec["decode_tokens"] / dec["decode_seconds"]
        peak_key = "bf16_gflops" if dtype == "bfloat16" else "fp32_gflops"
        texts = [o["token_ids"] for o in llm.generate(AGREEMENT_PROMPTS, SamplingParams(max_tokens=32), use_tqdm=False)]
        if not reference:
            reference = texts
        agree = sum(a == b for a, b in zip(texts, reference))
        lines.append(
            f"| {mode} | {pre['prefill_tokens'] / pre['prefill_seconds']:.0f} | {prefill_gflops:.0f} | "
            f"{prefill_gflops / peak[peak_key]:.0%} | {decode_tps:.0f} | {decode_gbps:.1f} | "
            f"{decode_gbps / peak['read_gbps']:.0%} | {agree}/{len(reference)} |"
        )
        profiles.append(
            f"\n## Profile, {mode}, prefill-heavy (8 x 512 tokens)\n\n```\n{profile_table(llm, prefill_prompts, SamplingParams(max_tokens=1))}\n```"
        )
        profiles.append(
            f"\n## Profile, {mode}, decode-heavy (32 x 32 tokens -> 64)\n\n```\n{profile_table(llm, decode_prompts, SamplingParams(max_tokens=64, ignore_eos=True))}\n```"
        )
        llm.shutdown()
    lines.append(f"\nLoad average at end: {load_average()}\n")
    text = "\n".join(lines + profiles) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
