"""Session 36: offline bursts at 135M, an earlier commit against the working tree, each in its own process,
the two trees alternating ``--rounds`` times so that the VM's drift falls on both. A process loads the
default model, warms up, then times ``--bursts`` bursts, the cache flushed before each:

- ``random``: 16 random prompts of 256 tokens, one token out (two prefill passes of 2,048 tokens);
- ``shared``: 32 prompts of one random 600-token prefix and 30 tokens of their own, 32 tokens out.

It prints each process's median and best burst (the first, which builds the kernels' buffers, left out).

    PYTHONPATH=. python docs/benchmarks/session36-spr/burst_ab.py --base d5bb0a6
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time


def bursts(workload: str, count: int) -> list[float]:
    from minisgl.llm import LLM
    from minisgl.sampling import SamplingParams

    llm, rng = LLM(), random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 49000) for _ in range(n)]

    llm.generate([ids(64)] * 2, SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    times = []
    for _ in range(count + 1):
        llm.flush_cache()
        if workload == "random":
            prompts, out = [ids(256) for _ in range(16)], 1
        else:
            prefix = ids(600)
            prompts, out = [prefix + ids(30) for _ in range(32)], 32
        start = time.perf_counter()
        llm.generate(prompts, SamplingParams(max_tokens=out, ignore_eos=True), use_tqdm=False)
        times.append(time.perf_counter() - start)
    llm.shutdown()
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", help="the commit to compare the working tree with")
    parser.add_argument("--workloads", nargs="+", default=["random", "shared"])
    parser.add_argument("--bursts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one process's bursts of this workload
    args = parser.parse_args()
    if args.child:
        print(" ".join(f"{t:.3f}" for t in bursts(args.child, args.bursts)))
        return
    # Imported here: a child runs in the base tree, which may not have these modules.
    from benchmarks.machine import machine_info
    from benchmarks.trees import ROOT, commit_tree, run_in

    print(machine_info(2))
    with commit_tree(args.base) as base:
        for r in range(args.rounds):
            for workload in args.workloads:
                for name, tree in ((f"base {args.base}", base), ("working tree", ROOT)):
                    command = [sys.executable, __file__, "--child", workload, "--bursts", str(args.bursts)]
                    times = [float(t) for t in run_in(tree, command).split()]
                    print(f"round {r + 1} {workload} {name}: median {statistics.median(times):.3f} s, "
                          f"best {min(times):.3f} s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
