"""``python -m benchmarks.peers setup [step ...]`` installs the peers (all steps by default);
``python -m benchmarks.peers status`` says which are ready."""

from __future__ import annotations

import argparse
import logging
import sys

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
    if args.command == "setup":
        unknown = [s for s in args.steps if s not in STEPS]
        if unknown:
            p.error(f"unknown step {', '.join(unknown)}; choose from {', '.join(STEPS)}")
        setup(args.steps or list(STEPS))
    ready = status()
    for name, ok in ready.items():
        print(f"{name}: {'ready' if ok else 'missing'}")
    return 0 if all(ready.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
