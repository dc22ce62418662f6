"""Session 28: one request's decode step at the 1.7B shape, split into the fused layers' C call
(``decode_layer.c``: every layer's products, attention and norms) and the rest of the step (the final
norm, the LM head's int8 product, sampling, the scheduler's Python), beside a streaming read of memory
measured just before each run. Speculation off: one token per step.

    PYTHONPATH=. python docs/benchmarks/session28-amd/step_split.py [RUNS]
"""

from __future__ import annotations

import statistics
import sys

import torch
from fused_prefetch_ab import kernels_of, timed_calls  # this folder's: the script's own directory is on the path

from benchmarks.hardware_peak import memory_bandwidth
from benchmarks.machine import machine_info
from benchmarks.roofline import weight_bytes_per_step
from benchmarks.scale_model import resolve_scale_model
from minisgl import LLM, SamplingParams


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    llm = LLM(resolve_scale_model("scale-1.7b"), max_running_req=1, cache_type="naive", num_page_override=400,
              speculative_algorithm="none")  # fmt: skip
    calls = timed_calls(llm)
    weight_bytes = weight_bytes_per_step(llm, rows=1)
    print(f"# {machine_info(torch.get_num_threads())['cpu']}, {torch.get_num_threads()} threads; "
          f"{weight_bytes / 1e6:.0f} MB of weights per step; {kernels_of(llm)}")  # fmt: skip
    prompt = torch.randint(1, llm.scheduler.vocab_size, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    params = SamplingParams(max_tokens=128, ignore_eos=True)
    llm.generate([prompt], params, use_tqdm=False)  # warm-up
    print("| run | read GB/s | step ms | fused call ms (median) | outside it ms per step | step GB/s of weights |")
    print("|---|---|---|---|---|---|")
    for r in range(runs):
        llm.flush_cache()
        calls.clear()
        read = memory_bandwidth(0.5) / 1e9
        before = vars(llm.scheduler.stats).copy()
        llm.generate([prompt], params, use_tqdm=False)
        steps = llm.scheduler.stats.decode_steps - before["decode_steps"]
        seconds = llm.scheduler.stats.decode_seconds - before["decode_seconds"]
        outside = (seconds - sum(calls[-steps:])) / steps
        print(f"| {r} | {read:.1f} | {seconds / steps * 1e3:.2f} | {statistics.median(calls) * 1e3:.2f} | "
              f"{outside * 1e3:.2f} | {weight_bytes * steps / seconds / 1e9:.1f} |", flush=True)  # fmt: skip
    llm.shutdown()


if __name__ == "__main__":
    main()
