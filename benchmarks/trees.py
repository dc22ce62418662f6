"""A/B runs of two source trees on one machine: an earlier commit checked out beside the working tree, and a
command run in either with that tree's ``minisgl`` and ``benchmarks`` on its path (the docs' ``*_ab.py``
scripts alternate the two, so that the machine's drift falls on both)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def commit_tree(commit: str) -> Iterator[Path]:
    """A detached git worktree of ``commit``, removed on the way out."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT, check=True,
                       capture_output=True)  # fmt: skip
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=True)


def run_in(tree: Path, command: list[str]) -> str:
    """``command``'s standard output, run in ``tree`` with ``tree`` first on the Python path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=True).stdout.strip()
