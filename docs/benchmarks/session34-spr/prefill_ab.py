"""Session 34: the engine's prefill of one long prompt, an earlier commit against the working tree, each in
its own process (``python -m benchmarks.prefill_speed``: best of ``--repeats`` after a warm-up, the cache
flushed before each), the two trees alternating ``--rounds`` times so that the VM's drift falls on both.
The earlier commit runs from a git worktree of its own.

    PYTHONPATH=. python docs/benchmarks/session34-spr/prefill_ab.py --base dc2cccd [--models default scale-1.7b]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.trees import ROOT, commit_tree, run_in


def run(tree: Path, models: list[str], repeats: int) -> str:
    command = [sys.executable, "-m", "benchmarks.prefill_speed", "--models", *models, "--modes", "auto/float32",
               "--repeats", str(repeats)]  # fmt: skip
    return run_in(tree, command)  # the machine, the load average and the table, as prefill_speed prints them


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the commit to compare the working tree with")
    parser.add_argument("--models", nargs="+", default=["default", "scale-1.7b"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with commit_tree(args.base) as base:
        for r in range(args.rounds):
            for name, tree in (("base " + args.base, base), ("working tree", ROOT)):
                print(f"## round {r + 1}: {name}\n{run(tree, args.models, args.repeats)}", flush=True)


if __name__ == "__main__":
    main()
