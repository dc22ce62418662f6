"""Session 47: whole offline bursts on the default model with an earlier commit's kernel build against the
working tree's, in one process (``benchmarks.many_rows.builds_to_compare``): the model's kernels are swapped
before each burst (its norms, its quantized weights' products and its fused decode step; attention stays on
the working tree's build, so the A/B is meaningful for changes to the products and norms only). Bursts of
random ids, caches emptied before each: 16 prompts of 256 tokens; 4 system prompts of 512 with 8 questions of
32 each; 32 tokens out. ``--pairs`` pairs, alternating which build goes first.

    PYTHONPATH=. python docs/benchmarks/session47-amd/burst_ab.py --base 9bd22e3 [--pairs 8]
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from benchmarks.machine import load_average
from benchmarks.many_rows import builds_to_compare
from minisgl.kernels.native import CpuKernels
from minisgl.layers.quant import QuantizedWeight
from minisgl.llm import LLM
from minisgl.models.decoder import DecoderForCausalLM
from minisgl.sampling import SamplingParams


def swap_kernels(model: DecoderForCausalLM, kernels: CpuKernels) -> None:
    """``kernels`` wherever the model runs them, its products' bindings and fused decoder made anew."""
    model.use_kernels(kernels)
    for module in model.modules():
        if isinstance(module, QuantizedWeight):
            module.__dict__.pop("c_matmul", None)
    model.__dict__.pop("_fused_decoder", None)


def main() -> None:
    pairs = 8
    if "--pairs" in sys.argv:
        at = sys.argv.index("--pairs")
        pairs = int(sys.argv[at + 1])
        del sys.argv[at : at + 2]
    builds = dict(zip(("base", "new"), builds_to_compare(__doc__)))
    llm, rng = LLM(), random.Random(0)
    model = llm.scheduler.runner.engine.model
    assert isinstance(model, DecoderForCausalLM)

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 49000) for _ in range(n)]

    params = SamplingParams(max_tokens=32, ignore_eos=True)
    for build in builds.values():  # each build's warm-up
        swap_kernels(model, build)
        llm.generate([ids(64)] * 2, SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    bursts = ("random", "shared prefix")
    walls: dict[tuple[str, str], list[float]] = {(b, name): [] for b in bursts for name in builds}
    for i in range(pairs):
        for burst in bursts:
            if burst == "random":
                prompts = [ids(256) for _ in range(16)]
            else:
                prompts = [system + ids(32) for system in (ids(512) for _ in range(4)) for _ in range(8)]
            for name in ("base", "new") if i % 2 == 0 else ("new", "base"):
                swap_kernels(model, builds[name])
                llm.flush_cache()
                start = time.perf_counter()
                llm.generate(prompts, params, use_tqdm=False)
                walls[burst, name].append(time.perf_counter() - start)
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
