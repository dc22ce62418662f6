"""Session 28: the OpenMP schedule of the quantized products with few rows of x (decode) in the real decode
step (the 1.7B scale model by default): ``schedule(static)`` (each thread one contiguous run of tiles, as
shipped), ``schedule(dynamic, 4)`` and ``schedule(guided)``. As ``fused_prefetch_ab.py``: one LLM per
schedule, each built from a patched copy of the sources; per round a streaming read, then each decodes
one request and the fused layers' call is timed.

    PYTHONPATH=. python docs/benchmarks/session28-amd/schedule_ab.py [--rounds 16] [--model scale-1.7b]
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path

from fused_prefetch_ab import llm_from, patched_sources, race  # this folder's

# The few-rows loop's parallel for (quant_gemm.c's gemm, rows <= GEMM_ROWS).
LOOP = (
    "#pragma omp parallel for num_threads(threads) schedule(static)\n"
    "        for (int64_t b = 0; b < blocks; b++)\n"
    "            for (int64_t t = b * block;"
)
SCHEDULES = {"static": "static", "dynamic4": "dynamic, 4", "guided": "guided"}


def with_schedule(schedule: str) -> Callable[[str], str]:
    """A patch for ``patched_sources``: the few-rows loop with ``schedule``."""

    def patch(text: str) -> str:
        if text.count(LOOP) != 1:
            raise ValueError("quant_gemm.c's few-rows loop is not where this script expects it")
        return text.replace(LOOP, LOOP.replace("schedule(static)", f"schedule({schedule})"))

    return patch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--model", default="scale-1.7b", help="a scale model's name, or none for the default model")
    args = p.parse_args()
    model = None if args.model == "none" else args.model
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        race(
            {n: llm_from(model, patched_sources(root, n, with_schedule(c))) for n, c in SCHEDULES.items()}, args.rounds
        )


if __name__ == "__main__":
    main()
