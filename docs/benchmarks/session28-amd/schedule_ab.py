"""Session 28: the OpenMP schedule of the quantized products with few rows of x (decode) in the real decode
step (the 1.7B scale model by default): ``schedule(static)`` (each thread one contiguous run of tiles, as
shipped), ``schedule(dynamic, 4)`` and ``schedule(guided)``. As ``fused_prefetch_ab.py``: one LLM per
schedule, each built from a patched copy of the sources; per round a streaming read, then each decodes
one request and the fused layers' call is timed.

    PYTHONPATH=. python docs/benchmarks/session28-amd/schedule_ab.py [--rounds 16] [--model scale-1.7b]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from fused_prefetch_ab import kernels_of, layer_bytes, llm_from, patched_sources, timed_calls  # this folder's

from benchmarks.hardware_peak import memory_bandwidth
from benchmarks.machine import machine_info
from minisgl import SamplingParams

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
    names = list(SCHEDULES)
    with tempfile.TemporaryDirectory() as tmp:
        llms = {n: llm_from(model, patched_sources(Path(tmp), n, with_schedule(SCHEDULES[n]))) for n in names}
        calls = {n: timed_calls(llm) for n, llm in llms.items()}
        nbytes = layer_bytes(llms[names[0]])
        print(f"# {machine_info(torch.get_num_threads())['cpu']}, {torch.get_num_threads()} threads; "
              f"{nbytes / 1e6:.0f} MB of layer weights per step; {kernels_of(llms[names[0]])}")  # fmt: skip
        prompt = list(range(100, 164))
        params = SamplingParams(max_tokens=48, ignore_eos=True)
        for llm in llms.values():
            llm.generate([prompt], params, use_tqdm=False)  # warm-up
        print("| round | read GB/s | " + " | ".join(f"{n}: layers GB/s" for n in names) + " |")
        print("|---|---|" + "---|" * len(names))
        for r in range(args.rounds):
            read = memory_bandwidth(0.5) / 1e9
            rates = {}
            for n in names[r % len(names) :] + names[: r % len(names)]:
                llms[n].flush_cache()
                calls[n].clear()
                llms[n].generate([prompt], params, use_tqdm=False)
                rates[n] = nbytes / statistics.median(calls[n]) / 1e9
            print(f"| {r} | {read:.1f} | " + " | ".join(f"{rates[n]:.1f}" for n in names) + " |", flush=True)
        for llm in llms.values():
            llm.shutdown()


if __name__ == "__main__":
    main()
