"""Session 47: whole offline bursts on the default model with an earlier commit's kernel build against the
working tree's, in one process (``benchmarks.many_rows.builds_to_compare``): the model's kernels are swapped
before each burst (``benchmarks.bursts_ab.swap_kernels``: its norms, its quantized weights' products and its fused
decode step, decode attention included; prefill attention stays on the working tree's build). Bursts of
random ids, caches emptied before each: 16 prompts of 256 tokens; 4 system prompts of 512 with 8 questions of
32 each; 32 tokens out. ``--pairs`` pairs, alternating which build goes first.

    PYTHONPATH=. python docs/benchmarks/session47-amd/burst_ab.py --base 9bd22e3 [--pairs 8]
"""

from __future__ import annotations

import sys

from benchmarks.bursts_ab import Burst, compare_bursts, random_prompts, shared_prefixes, swap_kernels
from benchmarks.many_rows import builds_to_compare
from minisgl.llm import LLM
from minisgl.models.decoder import DecoderForCausalLM


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
    compare_bursts(llm, setups, [Burst("random", random_prompts), Burst("shared prefix", shared_prefixes)], pairs)
    llm.shutdown()


if __name__ == "__main__":
    main()
