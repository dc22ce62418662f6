"""The 1.7B scale model offline on a shared prefix: 16 requests after one 512-token prompt, 32 tokens out
each; after two short requests, three runs, the walls of the last two. ``old``: with the C kernels of the worktree at
/tmp/s26/wt (``git worktree add /tmp/s26/wt 9f4cf56``), ``new``: this tree's.

Run, alternating: for r in 1 2 3; do for v in old new; do PYTHONPATH=. python \
docs/benchmarks/session26-amd/offline_shared_prefix.py $v; done; done"""

import random
import sys
import time
from pathlib import Path

from minisgl.kernels import native

if sys.argv[1] == "old":
    native.SOURCE_DIR = Path("/tmp/s26/wt/minisgl/kernels/cpu")

from benchmarks.scale_model import resolve_scale_model
from minisgl import LLM, SamplingParams

llm = LLM(resolve_scale_model("scale-1.7b"))
rng = random.Random(0)
prefix = [rng.randrange(1000, 40000) for _ in range(512)]
prompts = [prefix + [rng.randrange(1000, 40000) for _ in range(32)] for _ in range(16)]
params = SamplingParams(max_tokens=32, ignore_eos=True)
llm.generate(prompts[:2], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
walls = []
for _ in range(3):
    llm.flush_cache()
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    walls.append(time.perf_counter() - start)
print(sys.argv[1], " ".join(f"{w:.2f}" for w in walls[1:]), flush=True)
