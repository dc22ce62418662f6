"""Session 42: the LM head's x at one int8 digit instead of two (``QuantizedWeight.digits``), offline bursts of the
default model in one process, alternating: 16 random-id prompts of 256 tokens, and 4 system prompts of 512 random
ids with 8 questions of 32 each; 32 tokens out, caches emptied before every burst. Not kept in the engine (notes.md).

    PYTHONPATH=. python docs/benchmarks/session42-amd/lm_head_digits_ab.py [pairs]
"""

from __future__ import annotations

import sys

from benchmarks.bursts_ab import Burst, compare_bursts, random_prompts, shared_prefixes
from benchmarks.machine import load_average, machine_info
from minisgl.kernels.native import cpu_paths
from minisgl.llm import LLM


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    llm = LLM()
    head = llm.scheduler.runner.engine.model.lm_head.quantized

    def use_digits(digits: int) -> None:
        head.digits = digits
        head.__dict__.pop("c_matmul", None)  # bound again, with these digits, at the next product

    info = machine_info(2)
    print(f"# {info['cpu']}, {info['cores']} cores; {cpu_paths(head.kernels)}; load average {load_average()}")
    setups = {"two digits": lambda: use_digits(2), "one digit": lambda: use_digits(1)}
    compare_bursts(llm, setups, [Burst("random", random_prompts), Burst("shared", shared_prefixes)], pairs)
    llm.shutdown()


if __name__ == "__main__":
    main()
