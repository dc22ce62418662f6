"""Cold start to first token: a fresh Python process that imports minisgl, loads the default model
(already converted and cached) and generates one token. Reports the best of a few runs.

Run: python -m benchmarks.cold_start [--runs 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from benchmarks.machine import load_average

SCRIPT = (
    "from minisgl import LLM, SamplingParams; "
    "LLM().generate(['Hello'], SamplingParams(max_tokens=1), use_tqdm=False)"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    subprocess.run([sys.executable, "-c", SCRIPT], check=True, capture_output=True)  # converts once if needed
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", SCRIPT], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    print(f"cold start to first token: best {min(times):.2f} s, runs {[round(t, 2) for t in times]}, load {load_average()}")


if __name__ == "__main__":
    main()
