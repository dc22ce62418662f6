"""Session 42: the LM head's x at one int8 digit instead of two (``QuantizedWeight.digits``), offline bursts of the
default model in one process, alternating: 16 random-id prompts of 256 tokens, and 4 system prompts of 512 random
ids with 8 questions of 32 each; 32 tokens out, caches emptied before every burst. Not kept in the engine (notes.md).

    PYTHONPATH=. python docs/benchmarks/session42-amd/lm_head_digits_ab.py [pairs]
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from benchmarks.machine import load_average, machine_info
from minisgl.kernels.native import cpu_paths
from minisgl.llm import LLM
from minisgl.sampling import SamplingParams


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    llm, rng = LLM(), random.Random(0)
    head = llm.scheduler.runner.engine.model.lm_head.quantized

    def use_digits(digits: int) -> None:
        head.digits = digits
        head.__dict__.pop("c_matmul", None)  # bound again, with these digits, at the next product

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 49000) for _ in range(n)]

    info = machine_info(2)
    print(f"# {info['cpu']}, {info['cores']} cores; {cpu_paths(head.kernels)}; load average {load_average()}")
    llm.generate([ids(64)] * 2, SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    walls: dict[tuple[str, int], list[float]] = {(kind, d): [] for kind in ("random", "shared") for d in (1, 2)}
    for i in range(pairs):
        for kind in ("random", "shared"):
            if kind == "random":
                prompts = [ids(256) for _ in range(16)]
            else:
                prompts = [system + ids(32) for system in (ids(512) for _ in range(4)) for _ in range(8)]
            for digits in (1, 2) if i % 2 else (2, 1):
                use_digits(digits)
                llm.flush_cache()
                start = time.perf_counter()
                llm.generate(prompts, SamplingParams(max_tokens=32, ignore_eos=True), use_tqdm=False)
                walls[kind, digits].append(time.perf_counter() - start)
    print("| burst | two digits, median s | one digit, median s | speed-up of the medians | median of the pairs' |")
    print("|---|---|---|---|---|")
    for kind in ("random", "shared"):
        two, one = walls[kind, 2], walls[kind, 1]
        paired = statistics.median(a / b for a, b in zip(two, one))
        print(f"| {kind} | {statistics.median(two):.3f} | {statistics.median(one):.3f} "
              f"| {statistics.median(two) / statistics.median(one):.3f}x | {paired:.3f}x |")
    print(f"# load average at end: {load_average()}")
    llm.shutdown()


if __name__ == "__main__":
    main()
