"""Session 42: the single-call decode step (``decode_layer.c``) of a commit's build against the working tree's, in
one process on the default model, offline bursts alternating between the two (``--pairs`` pairs): the model's
fused decoder is built once from each build's kernels and swapped in before each burst; everything else (prefill,
sampling) runs the working tree's kernels in both. Bursts (random ids, caches emptied before each): 16 prompts
of 256 tokens; 4 system prompts of 512 with 8 questions of 32 each, 32 tokens out and 128.

    PYTHONPATH=. python docs/benchmarks/session42-amd/decode_step_ab.py --base 45de7d3 [--pairs 8]
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from benchmarks.machine import load_average
from benchmarks.many_rows import builds_to_compare
from minisgl.llm import LLM
from minisgl.sampling import SamplingParams


def main() -> None:
    pairs = 8
    if "--pairs" in sys.argv:
        at = sys.argv.index("--pairs")
        pairs = int(sys.argv[at + 1])
        del sys.argv[at : at + 2]
    base, new = builds_to_compare(__doc__)
    llm, rng = LLM(), random.Random(0)
    model = llm.scheduler.runner.engine.model
    layers = [layer.fused_weights() for layer in model.model.layers]
    decoders = {"base": base.fused_decoder(layers), "new": new.fused_decoder(layers)}

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 49000) for _ in range(n)]

    bursts = {"random, 32 out": 32, "shared prefix, 32 out": 32, "shared prefix, 128 out": 128}
    walls: dict[tuple[str, str], list[float]] = {(b, build): [] for b in bursts for build in decoders}
    llm.generate([ids(64)] * 2, SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    for i in range(pairs):
        for burst, out in bursts.items():
            if burst.startswith("random"):
                prompts = [ids(256) for _ in range(16)]
            else:
                prompts = [system + ids(32) for system in (ids(512) for _ in range(4)) for _ in range(8)]
            for build in ("base", "new") if i % 2 == 0 else ("new", "base"):
                model.__dict__["_fused_decoder"] = decoders[build]
                llm.flush_cache()
                start = time.perf_counter()
                llm.generate(prompts, SamplingParams(max_tokens=out, ignore_eos=True), use_tqdm=False)
                walls[burst, build].append(time.perf_counter() - start)
    print("| burst | base, median s | new, median s | speed-up of the medians | median of the pairs' |")
    print("|---|---|---|---|---|")
    for burst in bursts:
        before, after = walls[burst, "base"], walls[burst, "new"]
        paired = statistics.median(a / b for a, b in zip(before, after))
        print(f"| {burst} | {statistics.median(before):.3f} | {statistics.median(after):.3f} "
              f"| {statistics.median(before) / statistics.median(after):.3f}x | {paired:.3f}x |")  # fmt: skip
    print(f"# load average at end: {load_average()}")
    llm.shutdown()


if __name__ == "__main__":
    main()
