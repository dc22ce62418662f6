"""Session 47: whole offline bursts on the default model with an earlier commit's kernel build against the
working tree's, in one process (``benchmarks.many_rows.builds_to_compare``): the model's kernels are swapped
before each burst (``benchmarks.bursts_ab.swap_kernels``: its norms, its quantized weights' products and its fused
decode step, decode attention included; prefill attention stays on the working tree's build). Bursts of
random ids, caches emptied before each: 16 prompts of 256 tokens; 4 system prompts of 512 with 8 questions of
32 each; 32 tokens out. ``--pairs`` pairs, alternating which build goes first.

    PYTHONPATH=. python docs/benchmarks/session47-amd/burst_ab.py --base 9bd22e3 [--pairs 8]
"""

from __future__ import annotations

from benchmarks.bursts_ab import Burst, compare_builds, random_prompts, shared_prefixes

if __name__ == "__main__":
    compare_builds(__doc__, [Burst("random", random_prompts), Burst("shared prefix", shared_prefixes)])
