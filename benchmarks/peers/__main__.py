"""``python -m benchmarks.peers setup [step ...]`` installs the peers (all steps by default);
``python -m benchmarks.peers status`` says which are ready. Both check each peer by running it."""

from __future__ import annotations

import argparse
import logging
import sys

from benchmarks.peers.amx import rule_note
from benchmarks.peers.install import STEPS, setup, status
from benchmarks.peers.paths import cache_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    go = sub.add_parser("setup", help=f"install what is missing into {cache_dir()}")
    go.add_argument("steps", nargs="*", metavar="STEP", help="of " + ", ".join(STEPS) + " (default: all)")
    sub.add_parser("status", help="which peers are ready")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        if args.command == "setup":
            unknown = [s for s in args.steps if s not in STEPS]
            if unknown:
                p.error(f"unknown step {', '.join(unknown)}; choose from {', '.join(STEPS)}")
            steps = args.steps or list(STEPS)
            setup(steps)  # raises unless every step's check passes at the end
            problems: dict[str, str | None] = dict.fromkeys(steps)
        else:
            print(rule_note())
            problems = status()
    except FileNotFoundError as e:  # the default model's GGUF, which the checks generate on
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, problem in problems.items():
        print(f"{name}: {'ready (its check passes)' if problem is None else f'not ready: {problem}'}")
    return 0 if all(problem is None for problem in problems.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
