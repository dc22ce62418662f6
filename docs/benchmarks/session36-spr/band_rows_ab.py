"""Session 36: the MLP's band of a prefill pass, 256 rows against 512, in one process, alternating (every
``GatedMLP``'s ``band_rows`` set before each run; a row's arithmetic does not depend on its band, so the
outputs are the same bits; the engine's own choice is ``minisgl.tuning.mlp_band_rows``). Per model:
``--rounds`` bursts of 16 random 256-token prompts, one token out, and ``--rounds`` 2,000-token prompts,
the cache flushed before each; the first round warms up.

    PYTHONPATH=. python docs/benchmarks/session36-spr/band_rows_ab.py --models default scale-1.7b
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

import torch

from benchmarks.machine import machine_info
from benchmarks.scale_model import resolve_scale_model
from minisgl.layers.mlp import GatedMLP
from minisgl.llm import LLM
from minisgl.sampling import SamplingParams

BANDS = (256, 512)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["default"])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    print(machine_info(torch.get_num_threads()))
    for name in args.models:
        llm, rng = LLM(None if name == "default" else resolve_scale_model(name)), random.Random(0)
        mlps = [m for m in gc.get_objects() if isinstance(m, GatedMLP)]
        for workload, (count, length) in {"16 x 256 tokens": (16, 256), "2,000 tokens": (1, 2000)}.items():
            times: dict[int, list[float]] = {band: [] for band in BANDS}
            for r in range(args.rounds + 1):
                for band in BANDS:
                    for m in mlps:
                        m.band_rows = band
                    llm.flush_cache()
                    batch = [[rng.randrange(10, 49000) for _ in range(length)] for _ in range(count)]
                    start = time.perf_counter()
                    llm.generate(batch, SamplingParams(max_tokens=1, ignore_eos=True), use_tqdm=False)
                    if r:
                        times[band].append(time.perf_counter() - start)
            base = times[BANDS[0]]
            for band, t in times.items():
                ratio = statistics.median(b / a for a, b in zip(t, base))
                print(f"{name}, {workload}, bands of {band}: median {statistics.median(t):.3f} s, best "
                      f"{min(t):.3f} s; speed over {BANDS[0]}, median of pairs {ratio:.3f}", flush=True)  # fmt: skip
        llm.shutdown()


if __name__ == "__main__":
    main()
