"""Time to first token under a heavy mixed load: do short prompts wait behind long prefills?

All requests arrive at once (a burst) in a shuffled order, with prompt lengths spread geometrically
from ``--min-len`` to ``--max-len`` tokens of random ids (no prefix sharing), and each generates
``--output-len`` tokens. The scheduler runs in this process; TTFT is measured from the burst to the
step that returns a request's first token. Prints p50 / p99 TTFT by prompt-length bucket, in seconds
and in passes (forward passes until the first token: the scheduling itself, whatever the machine's load).

Run: python -m benchmarks.mixed_load [--requests 64] [--min-len 20] [--max-len 7221] [--output-len 8]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from benchmarks.machine import load_average, machine_info
from minisgl import LLM, SamplingParams

BUCKETS = [(0, 128), (128, 1024), (1024, 4096), (4096, 1 << 30)]


def prompt_lengths(n: int, low: int, high: int) -> list[int]:
    return [round(low * (high / low) ** (i / max(1, n - 1))) for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder or GGUF (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=20)
    parser.add_argument("--max-len", type=int, default=7221)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--max-prefill-tokens", type=int, default=None, help="default: the engine's")
    parser.add_argument("--kv-memory-gb", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    print(machine_info(torch.get_num_threads()))
    print(f"load average before: {load_average()}")
    llm = LLM(args.model, max_prefill_tokens=args.max_prefill_tokens, kv_memory_gb=args.kv_memory_gb)
    rng = random.Random(args.seed)
    lengths = prompt_lengths(args.requests, args.min_len, args.max_len)
    rng.shuffle(lengths)
    vocab = llm.scheduler.vocab_size
    prompts = [[rng.randrange(100, vocab) for _ in range(n)] for n in lengths]
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
    llm.generate([prompts[0][:32]], params, use_tqdm=False)  # warm-up
    llm.flush_cache()

    scheduler = llm.scheduler
    reqs = [scheduler.make_request(10_000 + i, p, params) for i, p in enumerate(prompts)]
    start = time.perf_counter()
    for req in reqs:
        scheduler.add(req)
    ttft: dict[int, float] = {}
    first_pass: dict[int, int] = {}
    passes = 0
    while scheduler.has_work:
        outputs = scheduler.step()
        passes += 1
        now = time.perf_counter() - start
        for out in outputs:
            ttft.setdefault(out.rid, now)
            first_pass.setdefault(out.rid, passes)
    total = time.perf_counter() - start
    print(f"\n{args.requests} requests, prompts {args.min_len}..{args.max_len} tokens ({sum(lengths)} in all), "
          f"{args.output_len} output tokens, max_prefill_tokens {llm.scheduler.planner.max_prefill_tokens}: "
          f"{total:.1f} s, {passes} passes")  # fmt: skip
    print(f"{'prompt tokens':>15} {'requests':>8} {'p50 TTFT s':>11} {'p99 TTFT s':>11} {'p50 passes':>11} {'p99 passes':>11}")
    for low, high in BUCKETS:
        bucket = [r for r in reqs if low <= r.prompt_len < high]
        if bucket:
            times = [ttft[r.rid] for r in bucket]
            counts = [float(first_pass[r.rid]) for r in bucket]
            label = f"{low}-{high - 1}" if high < 1 << 30 else f">={low}"
            print(f"{label:>15} {len(bucket):>8} {statistics.median(times):>11.2f} {percentile(times, 0.99):>11.2f} "
                  f"{statistics.median(counts):>11.0f} {percentile(counts, 0.99):>11.0f}")  # fmt: skip
    shortest = min(reqs, key=lambda r: r.prompt_len)
    print(f"shortest prompt ({shortest.prompt_len} tokens): TTFT {ttft[shortest.rid]:.2f} s, pass {first_pass[shortest.rid]}")
    print(f"load average after: {load_average()}")
    llm.shutdown()


if __name__ == "__main__":
    main()
