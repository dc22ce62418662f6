"""Session 56: whole offline bursts on the 1.7B scale model (``benchmarks.scale_model``) with an earlier commit's
kernel build against the working tree's, in one process (``benchmarks.bursts_ab.compare_builds``): the model's
kernels swapped before each burst (``benchmarks.bursts_ab.swap_kernels``; prefill attention stays on the working
tree's build). Bursts of random ids, caches emptied before each, in ``benchmarks.paired --model scale-1.7b --groups 1
--prompts-per-group 16``'s shapes: one system prompt of 512 with 16 questions of 32, and 16 prompts of 256; 32
tokens out. ``--pairs`` pairs (3 by default: a random burst takes about 20 s), alternating which build goes first.

    PYTHONPATH=. python docs/benchmarks/session56-amd/burst17_ab.py --base ab592a9 [--pairs 3]
"""

from __future__ import annotations

from benchmarks.bursts_ab import Burst, compare_builds, one_system_prompt, random_prompts
from benchmarks.scale_model import resolve_scale_model

if __name__ == "__main__":
    bursts = [Burst("shared prefix, 16 questions", one_system_prompt), Burst("random", random_prompts)]
    compare_builds(__doc__, bursts, model=resolve_scale_model("scale-1.7b"), pairs=3)
