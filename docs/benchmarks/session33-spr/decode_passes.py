"""Session 33: the engine's passes of a shared-prefix burst, offline, split into prefill and decode, as
``benchmarks.workloads.shared_prefix`` shapes it: ``--groups`` system prompts of 512 random tokens, each
followed by ``--per-group`` questions of 32 (shuffled), 32 tokens out each. Rounds after a warm-up, the cache
flushed before each; the wall of ``generate`` and the sum of each kind of pass's time.

    PYTHONPATH=. python docs/benchmarks/session33-spr/decode_passes.py [--model M] [--groups 4] [--per-group 8]

Its defaults are session 32's shape and passes (session 32 ran it as its own script). notes.md runs it on two
trees in turn (the commit before: a git worktree with its own PYTHONPATH).
"""

from __future__ import annotations

import argparse
import random
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a GGUF or folder (default: the default model)")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--per-group", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    llm = LLM(args.model)
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
        for _ in range(args.groups):
            system = [rng.randrange(10, 49000) for _ in range(512)]
            out += [system + [rng.randrange(10, 49000) for _ in range(32)] for _ in range(args.per_group)]
        rng.shuffle(out)
        return out

    llm.generate(prompts(), SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    for _ in range(args.rounds):
        llm.flush_cache()
        passes.clear()
        start = time.perf_counter()
        llm.generate(prompts(), SamplingParams(max_tokens=32, ignore_eos=True), use_tqdm=False)
        wall = time.perf_counter() - start
        prefill = [t for is_prefill, t in passes if is_prefill]
        decode = [t for is_prefill, t in passes if not is_prefill]
        print(
            f"wall {wall:.2f} s: {len(prefill)} prefill passes {sum(prefill):.2f} s, "
            f"{len(decode)} decode steps {sum(decode):.2f} s ({sum(decode) / len(decode) * 1e3:.1f} ms each)",
            flush=True,
        )


if __name__ == "__main__":
    main()
