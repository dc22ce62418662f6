"""Session 50: whole offline bursts on the default model with an earlier commit's kernel build against the working
tree's, in one process, the model's kernels swapped before each burst (``benchmarks.bursts_ab.swap_kernels``: with
its fused decode step, whose decode attention is the build's own, so decode steps run each build's attention). Bursts of random ids, caches emptied before each: one system prompt of 512 with 16 questions of
32 (``benchmarks.paired --groups 1 --prompts-per-group 16``'s shape) and 16 prompts of 256; 32 tokens out.
``--pairs`` pairs, alternating which build goes first.

    PYTHONPATH=. python docs/benchmarks/session50-amd/burst_ab.py --base 70759ff [--pairs 8]
"""

from __future__ import annotations

import sys

from benchmarks.bursts_ab import Burst, Ids, compare_bursts, random_prompts, swap_kernels
from benchmarks.many_rows import builds_to_compare
from minisgl.llm import LLM
from minisgl.models.decoder import DecoderForCausalLM


def one_system_prompt(ids: Ids) -> list[list[int]]:
    """One system prompt of 512 ids with 16 questions of 32."""
    system = ids(512)
    return [system + ids(32) for _ in range(16)]


def main() -> None:
    pairs = 8
    if "--pairs" in sys.argv:
        at = sys.argv.index("--pairs")
        pairs = int(sys.argv[at + 1])
        del sys.argv[at : at + 2]
    base, new = builds_to_compare(__doc__)
    llm = LLM()
    model = llm.scheduler.runner.engine.model
    assert isinstance(model, DecoderForCausalLM)
    setups = {"base": lambda: swap_kernels(model, base), "new": lambda: swap_kernels(model, new)}
    bursts = [Burst("shared prefix, 16 questions", one_system_prompt), Burst("random", random_prompts)]
    compare_bursts(llm, setups, bursts, pairs)
    llm.shutdown()


if __name__ == "__main__":
    main()
