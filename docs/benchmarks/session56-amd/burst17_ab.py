"""Session 56: whole offline bursts on the 1.7B scale model (``benchmarks.scale_model``) with an earlier commit's
kernel build against the working tree's, in one process (``benchmarks.bursts_ab.compare_bursts``): the model's
kernels swapped before each burst (``benchmarks.bursts_ab.swap_kernels``; prefill attention stays on the working
tree's build). Bursts of random ids, caches emptied before each, in ``benchmarks.paired --model scale-1.7b --groups 1
--prompts-per-group 16``'s shapes: one system prompt of 512 with 16 questions of 32, and 16 prompts of 256; 32
tokens out. ``--pairs`` pairs (3 by default: a random burst takes about 20 s), alternating which build goes first.

    PYTHONPATH=. python docs/benchmarks/session56-amd/burst17_ab.py --base ab592a9 [--pairs 3]
"""

from __future__ import annotations

from benchmarks.bursts_ab import Burst, Ids, compare_bursts, pairs_from_argv, random_prompts, swap_kernels
from benchmarks.many_rows import builds_to_compare
from benchmarks.scale_model import resolve_scale_model
from minisgl.llm import LLM
from minisgl.models.decoder import DecoderForCausalLM


def one_system_prompt(ids: Ids) -> list[list[int]]:
    """One system prompt of 512 ids with 16 questions of 32."""
    system = ids(512)
    return [system + ids(32) for _ in range(16)]


def main() -> None:
    pairs = pairs_from_argv(3)
    base, new = builds_to_compare(__doc__)
    llm = LLM(resolve_scale_model("scale-1.7b"))
    model = llm.scheduler.runner.engine.model
    assert isinstance(model, DecoderForCausalLM)
    bursts = [Burst("shared prefix, 16 questions", one_system_prompt), Burst("random", random_prompts)]
    compare_bursts(
        llm, {"base": lambda: swap_kernels(model, base), "new": lambda: swap_kernels(model, new)}, bursts, pairs
    )
    llm.shutdown()


if __name__ == "__main__":
    main()
