"""Session 52: a GGUF's load (``LLM(path)``: config, kernels, weights) with an earlier commit's minisgl against the
working tree's. Each load runs in a fresh Python process; the base runs from a git worktree of ``--base`` (its own
Python code; the C kernels' build is cached by its source, so both load the same one). ``--rounds`` pairs per
model, alternating which goes first. Each line: the load's seconds, the process's peak resident memory, and its
system CPU seconds (where a fresh page's first write is paid).

    PYTHONPATH=. python docs/benchmarks/session52-amd/load_ab.py --base fa5cdfc [--models default scale-1.7b scale-7b]
        [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.machine import load_average, machine_info
from benchmarks.scale_model import resolve_scale_model
from minisgl.models.gguf import default_model_path

LOAD = """
import json, resource, sys, time
start = time.perf_counter()
import minisgl
from minisgl.llm import LLM
assert minisgl.__file__.startswith(sys.path[1]), (minisgl.__file__, sys.path[:2])  # the package under test
llm = LLM(sys.argv[1])
seconds = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": seconds, "peak_gib": usage.ru_maxrss / 2**20, "sys_s": usage.ru_stime}))
llm.shutdown()
"""


def load_once(source: Path, model: str) -> dict[str, float]:
    """One fresh process's load of ``model`` with the minisgl package under ``source`` (its working folder too:
    ``python -c`` puts that first on the import path)."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    done = subprocess.run(
        [sys.executable, "-c", LOAD, model], env=env, cwd=source, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the commit to compare the working tree with")
    parser.add_argument("--models", nargs="+", default=["default", "scale-1.7b", "scale-7b"])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    here = Path(__file__).resolve().parents[3]
    paths = {m: str(default_model_path()) if m == "default" else resolve_scale_model(m) for m in args.models}
    print(f"# {machine_info(threads=os.cpu_count() or 1)}")
    print(f"# base {args.base}, load average at start: {load_average()}")
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(here), "worktree", "add", "--detach", str(worktree), args.base], check=True)
        try:
            sources = {"base": worktree, "new": here}
            for model, path in paths.items():
                ratios, peaks = [], {"base": [], "new": []}
                for r in range(args.rounds):
                    order = ("base", "new") if r % 2 == 0 else ("new", "base")
                    got = {name: load_once(sources[name], path) for name in order}
                    for name in order:
                        g = got[name]
                        peaks[name].append(g["peak_gib"])
                        print(f"{model} round {r + 1} {name:4} {g['seconds']:6.2f} s, peak {g['peak_gib']:.2f} GiB, "
                              f"system CPU {g['sys_s']:.2f} s")  # fmt: skip
                    ratios.append(got["base"]["seconds"] / got["new"]["seconds"])
                per_round = " ".join(f"{r:.2f}" for r in ratios)
                print(f"{model}: speed-up (base over new) per round {per_round}, median {statistics.median(ratios):.2f}; "
                      f"peak memory, median: base {statistics.median(peaks['base']):.2f} GiB, "
                      f"new {statistics.median(peaks['new']):.2f} GiB")  # fmt: skip
        finally:
            subprocess.run(["git", "-C", str(here), "worktree", "remove", "--force", str(worktree)], check=True)
    print(f"# load average at end: {load_average()}")


if __name__ == "__main__":
    main()
