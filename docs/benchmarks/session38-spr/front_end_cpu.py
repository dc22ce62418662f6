"""Session 38: the CPU each thread of the server takes per single-stream run of the default model, at each
stream interval: the front end's main thread (HTTP, detokenizing, streaming) and its ZeroMQ I/O thread, the
scheduler process's threads (the model's two and ZeroMQ's), and this client, with the run's wall time. Read
from /proc's per-thread schedstat (nanoseconds) around ``--runs`` runs, the cache flushed before each; one
server per interval, warmed up, one after the other.

    PYTHONPATH=. python docs/benchmarks/session38-spr/front_end_cpu.py [--intervals 0 20 50 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
from collections import defaultdict

import httpx
import psutil

from benchmarks.machine import load_average, machine_info
from benchmarks.online import _play
from benchmarks.server import minisgl_server, start_warm
from benchmarks.workloads import Sizes, build
from minisgl.config import EngineConfig
from minisgl.kernels.native import cpu_paths, resolve_kernels
from minisgl.models.source import load_tokenizer


def thread_cpu(pid: int) -> dict[str, float]:
    """Seconds on CPU so far of each thread of ``pid``, keyed by its name (numbered where names repeat)."""
    seen: dict[str, int] = defaultdict(int)
    out = {}
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except OSError:  # the thread ended meanwhile
            continue
        seen[name] += 1
        out[f"{name}#{seen[name]}"] = ns / 1e9
    return out


def children_cpu(pids: list[int]) -> dict[str, float]:
    return {f"{pid}:{name}": cpu for pid in pids for name, cpu in thread_cpu(pid).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--intervals", type=int, nargs="+", default=[0, 20, 50, 1000], help="--stream-interval-ms")
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_args()
    print(f"# {machine_info(2)}")
    print(f"# load average at start: {load_average()}")
    print(f"# quantized products (kernels=auto): {cpu_paths(resolve_kernels('auto'))}")
    tokenizer = load_tokenizer(EngineConfig().model)
    workload = build(["single-stream"], tokenizer, Sizes(), seed=0)[0]

    def text_of(ids: list[int]) -> str:  # as benchmarks.online sends a prompt
        return str(tokenizer.decode(ids, skip_special_tokens=False))

    print("| interval ms | wall s | front end: main | front end: ZeroMQ | scheduler process: model threads | "
          "scheduler process: ZeroMQ | client |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for interval in args.intervals:
        server = minisgl_server(
            ["--cache-type", "radix", "--schedule-policy", "lpm", "--stream-interval-ms", str(interval)]
        )
        url = start_warm(server)
        try:
            front = server.pid
            children = [c.pid for c in psutil.Process(front).children(recursive=True)]  # with mp's resource tracker
            rows = []
            for _ in range(args.runs):
                httpx.post(f"{url}/flush_cache", timeout=60).raise_for_status()
                before = thread_cpu(front), children_cpu(children), thread_cpu(os.getpid())
                _, wall = asyncio.run(_play(url, workload, text_of, math.inf, None, seed=0))
                after = thread_cpu(front), children_cpu(children), thread_cpu(os.getpid())
                used = [{k: a[k] - b.get(k, 0.0) for k in a} for a, b in zip(after, before)]
                zmq = [sum(v for k, v in u.items() if "ZMQ" in k) for u in used[:2]]
                rows.append(
                    (wall, used[0]["python#1"], zmq[0], sum(used[1].values()) - zmq[1], zmq[1], sum(used[2].values()))
                )
            medians = [statistics.median(column) for column in zip(*rows)]
            print(f"| {interval} | " + " | ".join(f"{m:.3f}" for m in medians) + " |", flush=True)
        finally:
            server.__exit__(None, None, None)
    print(f"# load average at end: {load_average()}")


if __name__ == "__main__":
    main()
