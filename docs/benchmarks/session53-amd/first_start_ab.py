"""First-ever and cached server start of two source trees, alternated round by round (the VM's speed drifts):
``python -m minisgl serve`` to a 200 from ``/health`` with an empty cache folder (the C kernels compiled, a
GGUF's config and tokenizer written), then once more with that folder (``benchmarks.cold_start``'s timer).

Run: python docs/benchmarks/session53-amd/first_start_ab.py BASE_TREE NEW_TREE [--model scale-1.7b] [--rounds 3]
(BASE_TREE: e.g. a ``git worktree`` of the commit before; each tree's own ``minisgl`` and ``benchmarks`` run)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

TIMER = """
import sys, tempfile
from pathlib import Path
from benchmarks.cold_start import start_server
from benchmarks.scale_model import resolve_scale_model
model = resolve_scale_model(sys.argv[1]) or ""
with tempfile.TemporaryDirectory(prefix="minisgl-first-") as cache:
    first, _ = start_server(model, 1.0, Path(cache))
    cached, _ = start_server(model, 1.0, Path(cache))
print(f"{first:.2f} {cached:.2f}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base")
    parser.add_argument("new")
    parser.add_argument(
        "--model",
        default="",
        help="a scale model's name (benchmarks/scale_model.py) or a GGUF; default: the default model",
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from benchmarks.machine import code_path, first_writes, load_average, machine_info

    print(
        f"# {machine_info(os.cpu_count() or 1)['cpu']}; {code_path()}; model {args.model or 'default'}; load at start "
        f"{load_average()}; {first_writes()}"
    )
    print("| round | tree | first ever (s) | cached (s) |\n|---|---|---|---|")
    for round_ in range(1, args.rounds + 1):
        for name, tree in (("base", args.base), ("new", args.new)):
            env = {**os.environ, "PYTHONPATH": tree}
            out = subprocess.run(
                [sys.executable, "-c", TIMER, args.model], cwd=tree, env=env, check=True, capture_output=True, text=True
            )
            first, cached = out.stdout.split()
            print(f"| {round_} | {name} | {first} | {cached} |", flush=True)
    print(f"# load at end {load_average()}; {first_writes()}")


if __name__ == "__main__":
    main()
