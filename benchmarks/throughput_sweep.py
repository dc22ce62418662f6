"""Offline throughput of ``LLM.generate`` for N prompts at a few batch sizes.

Every prompt is distinct (no prefix reuse), so this measures the engine itself: continuous batching,
prefill and batched decode. For prefix-heavy workloads and peers, see ``python -m benchmarks``.
*decode tok/s*: tokens sampled by decode-only passes over the time in them (forward and sampling);
its ratio between batch sizes is the decode scaling. Decode tokens that ride along in a prefill
pass are left out: that pass's time is mostly prefill.

Run: python -m benchmarks.throughput_sweep [--prompts 32] [--prompt-len 128] [--output-len 32] [--batch-sizes 1 4 16 32]
     [--dtype float32] [--quantization auto]
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.machine import load_average, machine_info
from minisgl import LLM, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder or GGUF (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--quantization", default="auto", help="EngineConfig.quantization (auto: a GGUF in its own precision)"
    )
    args = parser.parse_args()

    print(machine_info(torch.get_num_threads()))
    print(f"load average before: {load_average()}")
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
    pages = args.prompts * (args.prompt_len + args.output_len)
    print(
        f"\n{args.prompts} prompts x {args.prompt_len} tokens -> {args.output_len} tokens, {args.dtype}, quantization {args.quantization}"
    )
    print(f"{'batch':>5} {'seconds':>8} {'req/s':>7} {'prompt tok/s':>13} {'gen tok/s':>10} {'decode tok/s':>13}")
    prompts: list[list[int]] = []
    decode_rates: dict[int, float] = {}
    for batch_size in args.batch_sizes:
        llm = LLM(
            args.model, dtype=args.dtype, quantization=args.quantization, cache_type="naive",
            max_running_req=batch_size, num_page_override=pages,
            speculative_algorithm="none",  # one token per request a step: decode throughput by batch, undrafted
        )  # fmt: skip
        if not prompts:
            vocab = llm.scheduler.vocab_size
            prompts = [torch.randint(100, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.prompts)]
        llm.generate(prompts[:batch_size], params, use_tqdm=False)  # warm-up at this batch size
        before = vars(llm.scheduler.stats).copy()
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        stats = {k: v - before[k] for k, v in vars(llm.scheduler.stats).items()}
        n = args.prompts
        decode_rates[batch_size] = stats["decode_tokens"] / stats["decode_seconds"]
        print(
            f"{batch_size:>5} {seconds:>8.2f} {n / seconds:>7.2f} {n * args.prompt_len / seconds:>13.1f} "
            f"{n * args.output_len / seconds:>10.1f} {decode_rates[batch_size]:>13.1f}"
        )
        llm.shutdown()
    low, high = min(decode_rates), max(decode_rates)
    print(f"decode scaling, batch {high} vs batch {low}: {decode_rates[high] / decode_rates[low]:.1f}x")
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
