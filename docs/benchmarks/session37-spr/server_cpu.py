"""Session 37: the CPU each process takes while the server runs the harness's workloads at 135M (as
``python -m benchmarks`` sends them: text prompts, streamed): the front end (HTTP, tokenization, detokenizing
and streaming), the scheduler process (the model's two threads and its loop) and this client. On a 2-core
machine whatever the front end and the client take comes out of the model's cores. One server, warmed up;
each workload ``--runs`` times, the cache flushed before each; medians per run.

    PYTHONPATH=. python docs/benchmarks/session37-spr/server_cpu.py [--flags '--stream-interval-ms 50']
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shlex
import statistics

import httpx
import psutil

from benchmarks.machine import load_average, machine_info
from benchmarks.online import _play
from benchmarks.server import minisgl_server, start_warm
from benchmarks.workloads import Sizes, build
from minisgl.config import EngineConfig
from minisgl.kernels.native import cpu_paths, resolve_kernels
from minisgl.models.source import load_tokenizer


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["single-stream", "random", "shared-prefix"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--flags", default="", help="more `python -m minisgl serve` flags")
    args = parser.parse_args()
    print(f"# {machine_info(2)}")
    print(f"# load average at start: {load_average()}")
    flags = ["--cache-type", "radix", "--schedule-policy", "lpm", *shlex.split(args.flags)]
    print(f"# server: python -m minisgl serve {' '.join(flags)}")
    print(f"# its quantized products (kernels=auto here): {cpu_paths(resolve_kernels('auto'))}")
    tokenizer = load_tokenizer(EngineConfig().model)

    def text_of(ids: list[int]) -> str:  # as benchmarks.online sends a prompt
        return str(tokenizer.decode(ids, skip_special_tokens=False))

    server = minisgl_server(flags)
    url = start_warm(server)
    try:
        front = psutil.Process(server.pid)
        scheduler = front.children(recursive=True)
        me = psutil.Process()
        print("| workload | wall s | front end CPU s | scheduler process CPU s | client CPU s |")
        print("|---|---|---|---|---|")
        for workload in build(args.workloads, tokenizer, Sizes(), seed=0):
            rows = []
            for _ in range(args.runs):
                httpx.post(f"{url}/flush_cache", timeout=60).raise_for_status()
                processes = [front, *scheduler, me]
                before = [cpu_seconds(p) for p in processes]
                _, wall = asyncio.run(_play(url, workload, text_of, math.inf, None, seed=0))
                used = [cpu_seconds(p) - b for p, b in zip(processes, before)]
                rows.append((wall, used[0], sum(used[1:-1]), used[-1]))
            medians = [statistics.median(column) for column in zip(*rows)]
            print(f"| {workload.name} | " + " | ".join(f"{m:.3f}" for m in medians) + " |", flush=True)
    finally:
        server.__exit__(None, None, None)
    print(f"# load average at end: {load_average()}")


if __name__ == "__main__":
    main()
