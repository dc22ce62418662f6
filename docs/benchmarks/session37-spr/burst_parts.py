"""Session 37: where the default model's two bursts of #20's target 5 spend their time offline, pass by pass.
A process loads the default model, warms up, then runs each burst ``--bursts`` times, the cache flushed
before each, timing every forward pass (``runner.forward``: the model and the sampling) and the whole
``generate``:

- ``random``: 16 random-id prompts of 256 tokens, 32 tokens out (the harness's random workload, as ids);
- ``shared``: 4 random 512-token system prompts, each with 8 questions of 32 tokens, 32 tokens out (its
  shared-prefix workload, as ids).

Per burst: the prefill passes' time (every pass with a prompt token), the decode steps' (one token a
request), and the rest of ``generate`` (scheduling, detokenization); the first decode step is shown apart
(the kernels' buffers grow for its batch the first time). The first burst of each kind is left out.

    PYTHONPATH=. python docs/benchmarks/session37-spr/burst_parts.py
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from benchmarks.machine import load_average, machine_info
from minisgl.batch import Batch
from minisgl.kernels.native import cpu_paths
from minisgl.llm import LLM
from minisgl.sampler import Sampled
from minisgl.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bursts", type=int, default=6)
    args = parser.parse_args()
    print(f"# {machine_info(2)}")
    print(f"# load average at start: {load_average()}")
    llm, rng = LLM(), random.Random(0)
    print(f"# quantized products: {cpu_paths(llm.scheduler.engine.kernels)}")
    runner = llm.scheduler.runner
    passes: list[tuple[int, int, float]] = []  # (tokens, requests, seconds) of each forward pass
    forward = runner.forward

    def timed(batch: Batch) -> Sampled:
        start = time.perf_counter()
        sampled = forward(batch)
        passes.append((batch.input_ids.numel(), batch.num_reqs, time.perf_counter() - start))
        return sampled

    runner.forward = timed

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 49000) for _ in range(n)]

    llm.generate([ids(64)] * 2, SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    for burst in ("random", "shared"):
        rows = []
        for _ in range(args.bursts + 1):
            llm.flush_cache()
            passes.clear()
            if burst == "random":
                prompts = [ids(256) for _ in range(16)]
            else:
                systems = [ids(512) for _ in range(4)]
                prompts = [systems[i % 4] + ids(32) for i in range(32)]
                rng.shuffle(prompts)
            start = time.perf_counter()
            llm.generate(prompts, SamplingParams(max_tokens=32, ignore_eos=True), use_tqdm=False)
            wall = time.perf_counter() - start
            prefill = [s for tokens, reqs, s in passes if tokens != reqs]
            decode = [s for tokens, reqs, s in passes if tokens == reqs]
            rows.append((wall, sum(prefill), len(prefill), decode[0], decode[1:], wall - sum(prefill) - sum(decode)))
        print(f"\n{burst}: {len(prompts)} prompts, 32 tokens out; median of {args.bursts} bursts (the first left out)")
        rows = rows[1:]
        wall = statistics.median(r[0] for r in rows)
        prefill = statistics.median(r[1] for r in rows)
        first = statistics.median(r[3] for r in rows)
        steps = statistics.median(sum(r[4]) for r in rows)
        step = statistics.median(statistics.median(r[4]) for r in rows)
        rest = statistics.median(r[5] for r in rows)
        print(f"  wall {wall:.3f} s")
        print(f"  prefill passes: {prefill:.3f} s in {rows[0][2]} passes ({100 * prefill / wall:.0f}%)")
        print(f"  first decode step: {1000 * first:.1f} ms")
        print(f"  other decode steps: {steps:.3f} s, {len(rows[0][4])} steps of {1000 * step:.1f} ms "
              f"({100 * steps / wall:.0f}%)")  # fmt: skip
        print(f"  outside the passes: {rest:.3f} s ({100 * rest / wall:.0f}%)")
    llm.shutdown()
    print(f"\n# load average at end: {load_average()}")


if __name__ == "__main__":
    main()
