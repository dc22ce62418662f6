"""Session 57: the default model's offline bursts with a commit's kernel build against the working tree's, in one
process (``benchmarks.bursts_ab.swap_kernels`` before each burst), timing both the whole burst and the fused decode
steps inside it (``FusedDecoder.run``, where decode attention runs): 16 prompts of 256 random ids, and 4 system
prompts of 512 with 8 questions of 32 each; 32 tokens out. ``--pairs`` pairs alternating which build goes first;
medians without the first pair. In the session, 0b6294c against ``decode_attention_tiles.patch`` (this folder; not
kept), which puts the amx build's decode attention on the tile unit:

    git apply docs/benchmarks/session57-spr/decode_attention_tiles.patch
    PYTHONPATH=. python docs/benchmarks/session57-spr/fused_steps_ab.py --base 0b6294c [--pairs 6]
"""

from __future__ import annotations

import random
import statistics
import time

import torch

from benchmarks.bursts_ab import pairs_from_argv, random_prompts, shared_prefixes, swap_kernels
from benchmarks.many_rows import builds_to_compare
from minisgl.kernels.native import FusedDecoder
from minisgl.llm import LLM
from minisgl.models.decoder import DecoderForCausalLM
from minisgl.sampling import SamplingParams


def main() -> None:
    pairs = pairs_from_argv(6)
    base, new = builds_to_compare(__doc__)
    llm, rng = LLM(), random.Random(0)
    model = llm.scheduler.runner.engine.model
    assert isinstance(model, DecoderForCausalLM)

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 49000) for _ in range(n)]

    fused: list[float] = []
    run = FusedDecoder.run

    def timed_run(self: FusedDecoder, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        out = run(self, *args)
        fused.append(time.perf_counter() - start)
        return out

    FusedDecoder.run = timed_run  # type: ignore[method-assign]
    bursts = {"random": random_prompts, "shared prefix": shared_prefixes}
    builds = {"base": base, "new": new}
    steps: dict[tuple[str, str], list[float]] = {(b, k): [] for b in bursts for k in builds}
    walls: dict[tuple[str, str], list[float]] = {(b, k): [] for b in bursts for k in builds}
    for i in range(pairs + 1):
        for burst, prompts_of in bursts.items():
            prompts = prompts_of(ids)
            for name in ("base", "new") if i % 2 else ("new", "base"):
                swap_kernels(model, builds[name])
                llm.flush_cache()
                fused.clear()
                start = time.perf_counter()
                llm.generate(prompts, SamplingParams(max_tokens=32, ignore_eos=True), use_tqdm=False)
                if i > 0:
                    walls[burst, name].append(time.perf_counter() - start)
                    steps[burst, name].append(sum(fused))
    print("| burst | base: fused steps, wall (s) | new: fused steps, wall (s) | steps' speed-up | wall's speed-up |")
    print("|---|---|---|---|---|")
    for burst in bursts:
        (sb, sn), (wb, wn) = ([statistics.median(m[burst, k]) for k in builds] for m in (steps, walls))
        print(f"| {burst} | {sb:.3f}, {wb:.3f} | {sn:.3f}, {wn:.3f} | {sb / sn:.3f}x | {wb / wn:.3f}x |")


if __name__ == "__main__":
    main()
