"""Session 32: the engine's passes of a shared-prefix burst at 135M, offline, split into prefill and decode:
4 system prompts of 512 random tokens, 8 questions of 32 after each (32 requests, shuffled), 32 tokens out
each, as ``benchmarks.workloads.shared_prefix`` shapes them. Three rounds after a warm-up, the cache
flushed before each; the wall of ``generate`` and the sum of each kind of pass's time.

    PYTHONPATH=. python docs/benchmarks/session32-spr/decode_passes.py [model]

notes.md runs it on two trees in turn (the commit before: a git worktree with its own PYTHONPATH).
"""

from __future__ import annotations

import random
import sys
import time

import torch

from benchmarks.machine import cpu_model, load_average
from minisgl.batch import Batch
from minisgl.kernels.native import cpu_paths
from minisgl.kernels.variants import cpu_flags
from minisgl.llm import LLM
from minisgl.sampler import Sampled
from minisgl.sampling import SamplingParams


def main() -> None:
    llm = LLM(sys.argv[1] if len(sys.argv) > 1 else None)
    engine = llm.scheduler.engine
    amx = sorted(f for f in cpu_flags() if f.startswith("amx"))
    print(f"# {cpu_model()}, AMX: {' '.join(amx) or 'none'}, {torch.get_num_threads()} threads; quantized products: "
          f"{cpu_paths(engine.kernels)}; load average {load_average()}")  # fmt: skip
    passes: list[tuple[bool, float]] = []  # (prefill?, seconds) of each pass
    forward = engine.forward

    def timed(batch: Batch) -> Sampled:
        start = time.perf_counter()
        sampled = forward(batch)
        passes.append((batch.prefill_tokens > 0, time.perf_counter() - start))
        return sampled

    engine.forward = timed  # type: ignore[method-assign]
    rng = random.Random(0)

    def prompts() -> list[list[int]]:
        out = []
        for _ in range(4):
            system = [rng.randrange(10, 49000) for _ in range(512)]
            out += [system + [rng.randrange(10, 49000) for _ in range(32)] for _ in range(8)]
        rng.shuffle(out)
        return out

    llm.generate(prompts(), SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    for _ in range(3):
        llm.flush_cache()
        passes.clear()
        start = time.perf_counter()
        llm.generate(prompts(), SamplingParams(max_tokens=32, ignore_eos=True), use_tqdm=False)
        wall = time.perf_counter() - start
        prefill = [t for is_prefill, t in passes if is_prefill]
        decode = [t for is_prefill, t in passes if not is_prefill]
        print(
            f"wall {wall:.2f} s: {len(prefill)} prefill passes {sum(prefill):.2f} s, "
            f"{len(decode)} decode steps {sum(decode):.2f} s ({sum(decode) / len(decode) * 1e3:.1f} ms each)"
        )


if __name__ == "__main__":
    main()
