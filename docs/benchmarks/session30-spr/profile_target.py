"""Session 30: the passes behind notes.md's profiles, at the 1.7B scale model (random weights, Q4_1 GGUF), run
in a loop for ``perf record`` to attach to once the model is loaded (its pid is printed then):

- ``prefill``: 16 random prompts of 256 tokens, one token out (passes of 1,024 prefill tokens), three times;
- ``decode-random``: 16 random prompts of 300 tokens, cached, then 100 tokens out each (16-row decode steps);
- ``decode-shared``: the same after one shared 512-token prefix with 32 tokens each (shared-prefix decode).

    PYTHONPATH=. python docs/benchmarks/session30-spr/profile_target.py decode-shared &
    perf record -F 499 -g -p <pid> -- sleep 10; perf report --no-children --sort dso,sym
"""

from __future__ import annotations

import argparse
import os
import random
import time

from benchmarks.scale_model import resolve_scale_model
from minisgl.llm import LLM
from minisgl.sampling import SamplingParams


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 49000) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", choices=("prefill", "decode-random", "decode-shared"))
    args = parser.parse_args()
    llm = LLM(resolve_scale_model("scale-1.7b"))
    rng = random.Random(0)
    if args.target == "prefill":
        llm.generate([random_ids(rng, 64)] * 2, SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
        print(f"pid {os.getpid()}: loaded", flush=True)
        for _ in range(3):
            llm.flush_cache()
            start = time.perf_counter()
            prompts = [random_ids(rng, 256) for _ in range(16)]
            llm.generate(prompts, SamplingParams(max_tokens=1, ignore_eos=True), use_tqdm=False)
            print(f"{16 * 256 / (time.perf_counter() - start):.0f} prefill tok/s", flush=True)
        return
    if args.target == "decode-random":
        prompts = [random_ids(rng, 300) for _ in range(16)]
    else:
        prefix = random_ids(rng, 512)
        prompts = [prefix + random_ids(rng, 32) for _ in range(16)]
    llm.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)  # cached from here on
    print(f"pid {os.getpid()}: loaded", flush=True)
    start = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=100, ignore_eos=True), use_tqdm=False)
    print(f"{(time.perf_counter() - start) / 100 * 1e3:.1f} ms a step", flush=True)


if __name__ == "__main__":
    main()
