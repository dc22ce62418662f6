"""Session 32: the CPU the server's processes spend for one user at 135M (the default model, default flags),
read from /proc before and after each run: the front end (HTTP, tokenizing, streaming), the scheduler
process (the model: its two threads keep both cores busy, spinning included) and this client (aiohttp,
as benchmarks/client.py). Runs of 24 streamed completions of 128 tokens and of 200 of 2 tokens, one
request at a time, twice each after a warm-up. The front end's CPU per request comes from the 2-token
runs; per streamed token, from the 128-token runs less that.

    PYTHONPATH=. python docs/benchmarks/session32-spr/front_end_cpu.py
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import torch

from benchmarks.machine import cpu_model, load_average
from minisgl.kernels.variants import cpu_flags

PORT = 19193
URL = f"http://127.0.0.1:{PORT}"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(session: aiohttp.ClientSession, model: str, requests: int, tokens: int) -> None:
    for i in range(requests):
        body = {
            "model": model,
            "prompt": f"Request {i}: tell me a story about a dragon and a knight who became friends.",
            "max_tokens": tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
        async with session.post(f"{URL}/v1/completions", json=body) as response:
            response.raise_for_status()
            async for _ in response.content:
                pass


async def measure(front: int, scheduler: int) -> None:
    async with aiohttp.ClientSession() as session:
        while True:  # the scheduler is up; the HTTP server may still be starting
            try:
                async with session.get(f"{URL}/health") as response:
                    if response.status == 200:
                        break
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.2)
        async with session.get(f"{URL}/v1/models") as response:
            model = (await response.json())["data"][0]["id"]
        await run(session, model, 8, 128)  # warm-up
        for _ in range(2):
            for requests, tokens in ((24, 128), (200, 2)):
                before = cpu_seconds(front), cpu_seconds(scheduler), time.process_time()
                start = time.perf_counter()
                await run(session, model, requests, tokens)
                wall = time.perf_counter() - start
                after = cpu_seconds(front), cpu_seconds(scheduler), time.process_time()
                front_cpu, scheduler_cpu, client_cpu = (b - a for a, b in zip(before, after))
                print(
                    f"| {requests} x {tokens} tokens | {wall:.2f} | {front_cpu:.2f} | {scheduler_cpu:.2f} | "
                    f"{client_cpu:.2f} |",
                    flush=True,
                )


def main() -> None:
    amx = " ".join(sorted(f for f in cpu_flags() if f.startswith("amx"))) or "none"
    print(f"# {cpu_model()}, AMX: {amx}, {torch.get_num_threads()} threads; load average {load_average()}")
    server = subprocess.Popen(
        [sys.executable, "-m", "minisgl", "serve", "--port", str(PORT)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        for line in server.stderr:  # the start-up log names the scheduler process once it is serving
            match = re.search(r"scheduler pid (\d+)", line)
            if match:
                scheduler = int(match.group(1))
                break
        else:
            raise RuntimeError("the server exited before serving")
        # Its log keeps coming (a line per request): read on, so that the pipe never fills and blocks it.
        threading.Thread(target=server.stderr.read, daemon=True).start()
        print("| run | wall s | front end CPU s | scheduler CPU s | client CPU s |")
        print("|---|---|---|---|---|")
        asyncio.run(measure(server.pid, scheduler))
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
