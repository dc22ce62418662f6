"""Session 50: whole offline bursts on the default model with an earlier commit's kernel build against the working
tree's, in one process, the model's kernels swapped before each burst (``benchmarks.bursts_ab.swap_kernels``: with
its fused decode step, whose decode attention is the build's own, so decode steps run each build's attention). Bursts of random ids, caches emptied before each: one system prompt of 512 with 16 questions of
32 (``benchmarks.paired --groups 1 --prompts-per-group 16``'s shape) and 16 prompts of 256; 32 tokens out.
``--pairs`` pairs, alternating which build goes first.

    PYTHONPATH=. python docs/benchmarks/session50-amd/burst_ab.py --base 70759ff [--pairs 8]
"""

from __future__ import annotations

from benchmarks.bursts_ab import Burst, compare_builds, one_system_prompt, random_prompts

if __name__ == "__main__":
    compare_builds(__doc__, [Burst("shared prefix, 16 questions", one_system_prompt), Burst("random", random_prompts)])
