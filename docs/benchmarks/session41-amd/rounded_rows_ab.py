"""Session 41: prefill passes with the norms and SwiGLU handing their rows to the integer products rounded
(``RoundedRows``: ``rms_norm_rounded``, ``silu_mul_rounded``) against the same passes with fp32 rows that
each product rounds itself, in one process, alternating (``QuantizedWeight.takes_rounded`` switched off for
the second). Each round runs one burst of each: ``--prompts`` random-id prompts of 256 tokens, one token out,
the cache flushed first; only passes of more than 1,000 tokens are timed (the forward pass alone). Prints the
machine, both medians and the median of the per-pass ratios, and checks that both ways sample the same
first tokens.

    PYTHONPATH=. python docs/benchmarks/session41-amd/rounded_rows_ab.py --rounds 40
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from benchmarks.machine import load_average, machine_info
from minisgl.batch import Batch
from minisgl.kernels.native import cpu_paths
from minisgl.layers.quant import QuantizedWeight
from minisgl.llm import LLM
from minisgl.sampler import Sampled
from minisgl.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument(
        "--prompts", type=int, default=8, help="prompts of 256 tokens a burst (8: one 2,048-token pass)"
    )
    args = parser.parse_args()
    print(f"# {machine_info(2)}")
    print(f"# load average at start: {load_average()}")
    llm, rng = LLM(), random.Random(0)
    print(f"# quantized products: {cpu_paths(llm.scheduler.engine.kernels)}")
    runner, rounded = llm.scheduler.runner, QuantizedWeight.takes_rounded
    forward, passes = runner.forward, []

    def timed(batch: Batch) -> Sampled:
        start = time.perf_counter()
        sampled = forward(batch)
        if batch.input_ids.numel() > 1000:
            passes.append(time.perf_counter() - start)
        return sampled

    runner.forward = timed

    def burst(prompts: list[list[int]], fused: bool) -> list[int]:
        QuantizedWeight.takes_rounded = rounded if fused else lambda self, prefill_rows: False
        llm.flush_cache()
        outputs = llm.generate(prompts, SamplingParams(max_tokens=1, ignore_eos=True), use_tqdm=False)
        return [o["token_ids"][0] for o in outputs]

    def prompts() -> list[list[int]]:
        return [[rng.randrange(10, 49000) for _ in range(256)] for _ in range(args.prompts)]

    warm = prompts()
    assert burst(warm, True) == burst(warm, False), "rounded rows changed a sampled token"
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.rounds):
        batch = prompts()
        for fused in (True, False) if r % 2 == 0 else (False, True):
            passes.clear()
            burst(batch, fused)
            times[fused] += passes
    QuantizedWeight.takes_rounded = rounded
    fused, plain = times[True], times[False]
    ratios = [p / f for p, f in zip(plain, fused)]
    print(f"\n{len(fused)} passes each; ms a pass, median (range)")
    print(f"- fp32 rows, rounded by each product: {1e3 * statistics.median(plain):.1f} "
          f"({1e3 * min(plain):.1f}-{1e3 * max(plain):.1f})")  # fmt: skip
    print(
        f"- rows handed over rounded: {1e3 * statistics.median(fused):.1f} ({1e3 * min(fused):.1f}-{1e3 * max(fused):.1f})"
    )
    print(f"- speed-up: {statistics.median(plain) / statistics.median(fused):.3f}x of the medians, "
          f"{statistics.median(ratios):.3f}x the median of the pairs' ratios")  # fmt: skip
    print(f"# load average at end: {load_average()}")


if __name__ == "__main__":
    main()
