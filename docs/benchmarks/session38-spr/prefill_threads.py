"""Session 38: how a prefill pass of the default model scales from one thread to two. Each run is a process
of its own (``LLM(num_threads=N)``) that times passes of 8 random prompts of 256 tokens (2,048 rows, as the
random burst's passes), one output token, the cache flushed before each, for ``--seconds``; runs of 1 and 2
threads alternate ``--rounds`` times. Prints ms per pass; two threads' speed over one's is the parallel share
of the pass that the threads keep (the rest: waits at the kernels' barriers, Python between the kernels).

    PYTHONPATH=. python docs/benchmarks/session38-spr/prefill_threads.py [--rounds 3] [--seconds 8]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time

from benchmarks.machine import load_average, machine_info


def run_passes(threads: int, seconds: float) -> float:
    """ms per 2,048-row prefill pass in this process, after one warm-up pass."""
    from minisgl import LLM, SamplingParams
    from minisgl.kernels.native import cpu_paths, resolve_kernels

    llm = LLM(cache_type="radix", num_threads=threads)
    print(f"# {threads} thread(s), quantized products: {cpu_paths(resolve_kernels('auto'))}", file=sys.stderr)
    rng = random.Random(0)
    params = SamplingParams(max_tokens=1, ignore_eos=True)

    def prompts() -> list[list[int]]:
        return [[rng.randrange(1000, 40000) for _ in range(256)] for _ in range(8)]

    llm.generate(prompts(), params, use_tqdm=False)
    start, passes = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        llm.flush_cache()
        llm.generate(prompts(), params, use_tqdm=False)
        passes += 1
    return (time.perf_counter() - start) / passes * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)  # a child's run
    args = parser.parse_args()
    if args.threads is not None:
        print(f"{run_passes(args.threads, args.seconds):.1f}")
        return
    print(f"# {machine_info(2)}")
    print(f"# load average at start: {load_average()}")
    times: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.rounds):
        for threads in (1, 2):
            command = [sys.executable, __file__, "--threads", str(threads), "--seconds", str(args.seconds)]
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            times[threads].append(float(out.stdout.split()[-1]))
    print(f"# paths: {out.stderr.strip().splitlines()[-1].lstrip('# ')}")
    print("| threads | ms per 2,048-row pass, median (runs) |")
    print("|---|---|")
    for threads, ms in times.items():
        print(f"| {threads} | {statistics.median(ms):.0f} ({' / '.join(f'{m:.0f}' for m in ms)}) |")
    print(f"two threads' speed over one's: {statistics.median(times[1]) / statistics.median(times[2]):.2f}x")
    print(f"# load average at end: {load_average()}")


if __name__ == "__main__":
    main()
