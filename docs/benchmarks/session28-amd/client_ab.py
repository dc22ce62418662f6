"""Session 28: one user through the server against offline, measured with two streaming clients.

Per round (order rotated): the single-stream workload offline (``LLM.generate``), then through the
server with httpx's streaming client (the harness's until session 28) and with aiohttp's (the
harness's since). Prints per-round walls, each server run's speed against the offline run of its
round, and the CPU that the client, the front end and the scheduler process used in each run.

    PYTHONPATH=. python docs/benchmarks/session28-amd/client_ab.py [ROUNDS]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import httpx
import psutil
from transformers import AutoTokenizer

from benchmarks.client import Timing, client_session, complete, request_body
from benchmarks.machine import machine_info, wait_for_quiet
from benchmarks.offline import run_offline, warm_up
from benchmarks.online_systems import minisgl_variant
from benchmarks.scale_model import gguf_of
from benchmarks.systems import SystemOptions, make_system
from benchmarks.workloads import Sizes, build
from minisgl.kernels.native import cpu_paths, resolve_kernels
from minisgl.models.source import resolve_model_path


async def complete_httpx(client: httpx.AsyncClient, url: str, prompt: str, output_len: int) -> Timing:
    """The harness's client before session 28."""
    timing = Timing(start=time.perf_counter())
    parts: list[str] = []
    async with client.stream("POST", f"{url}/v1/completions", json=request_body(prompt, output_len)) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            parts.append(timing.add_event(json.loads(line[len("data: ") :]), time.perf_counter()))
    timing.end = time.perf_counter()
    return timing


async def play(kind: str, url: str, prompts: list[str], output_len: int) -> float:
    if kind == "httpx":
        async with httpx.AsyncClient(timeout=None) as client:
            start = time.perf_counter()
            for p in prompts:
                await complete_httpx(client, url, p, output_len)
            return time.perf_counter() - start
    async with client_session() as session:
        start = time.perf_counter()
        for p in prompts:
            await complete(session, url, p, output_len)
        return time.perf_counter() - start


def cpu_of(front_end: psutil.Process) -> list[float]:
    """CPU seconds so far of the front end and of its children (the scheduler process and its helpers)."""
    return [sum(front_end.cpu_times()[:2]), sum(sum(c.cpu_times()[:2]) for c in front_end.children(recursive=True))]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("rounds", type=int, nargs="?", default=8)
    args = p.parse_args()
    folder = resolve_model_path(None)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    workload = build(["single-stream"], tokenizer, Sizes(), 0)[0]
    prompts = [tokenizer.decode(r[0].new_ids) for r in workload.rounds]  # single-stream: no history
    threads = psutil.cpu_count()
    print(f"machine: {machine_info(threads)}; kernels: {cpu_paths(resolve_kernels('auto'))}", flush=True)
    offline = make_system("minisgl", SystemOptions(model=None, gguf=gguf_of(None), threads=threads, hf_folder=folder,
                                                   max_seq_len=workload.max_seq_len() + 64))  # fmt: skip
    warm_up(offline, len(tokenizer))
    served = argparse.Namespace(model=None, dtype="float32", device="auto", threads=threads)
    walls: dict[str, list[float]] = {"offline": [], "httpx": [], "aiohttp": []}
    cpu: dict[str, list[list[float]]] = {"httpx": [], "aiohttp": []}
    with minisgl_variant("minisgl", served)() as server:
        front = psutil.Process(server.pid)
        kinds = ["offline", "httpx", "aiohttp"]
        for r in range(args.rounds):
            for kind in kinds[r % 3 :] + kinds[: r % 3]:
                wait_for_quiet()
                if kind == "offline":
                    walls[kind].append(run_offline(offline, workload, tokenizer).duration_s)
                    continue
                url = server.fresh()
                wait_for_quiet()
                before, mine = cpu_of(front), time.process_time()
                walls[kind].append(asyncio.run(play(kind, url, prompts, workload.output_len)))
                used = [b - a for a, b in zip(before, cpu_of(front))]
                cpu[kind].append([time.process_time() - mine, *used])
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in walls.items()), flush=True)
    offline.close()
    for kind in ("httpx", "aiohttp"):
        ratios = [o / w for o, w in zip(walls["offline"], walls[kind])]
        columns = list(zip(*cpu[kind]))
        client, front_end, scheduler = (statistics.median(c) for c in columns[:3])
        print(f"{kind}: speed vs offline per round {' / '.join(f'{x:.2f}' for x in ratios)}; "
              f"median {statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f}); "
              f"median CPU per run: client {client:.3f} s, front end {front_end:.3f} s, "
              f"scheduler process {scheduler:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
