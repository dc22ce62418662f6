"""The OpenAI-compatible streaming client every online system is measured with (``/v1/completions``).

Prompts go as text, as a user's client sends them, so every server tokenizes them itself; answers
come back as text. Any server that follows the OpenAI streaming format (minisgl, llama-server,
vLLM) works: usage and cached prompt tokens come from the final ``usage`` chunk.

The client is aiohttp's, as in vLLM's own serving benchmark: on a 2-core machine the client's CPU is
taken from the server it measures, and httpx's streaming took about three times aiohttp's CPU per run
(``docs/benchmarks/session28-amd/client_ab.py`` measures both).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

WARMUP_PROMPTS = ("Warm-up request: say hello.", "A second warm-up request, about the weather.")


@dataclass
class Timing:
    start: float
    end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk that carried text
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.start if self.chunk_times else math.nan

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    @property
    def tpot(self) -> float:
        """Decode time per output token after the first (NaN for one-token answers)."""
        if self.completion_tokens < 2 or not self.chunk_times:
            return math.nan
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.completion_tokens - 1)

    def add_event(self, event: dict[str, Any], now: float) -> str:
        """Records one parsed ``data:`` event; returns the text it carried."""
        if "error" in event:
            raise RuntimeError(f"server error mid-stream: {event['error']}")
        text = "".join(c.get("text") or "" for c in event.get("choices", []))
        if text:
            self.chunk_times.append(now)
        usage = event.get("usage")
        if usage:
            self.prompt_tokens = usage["prompt_tokens"]
            self.completion_tokens = usage["completion_tokens"]
            self.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return text


def request_body(prompt: str, output_len: int) -> dict[str, Any]:
    """Greedy, exactly ``output_len`` tokens (``ignore_eos``: minisgl, llama-server and vLLM all read it)."""
    return {
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def client_session(connections: int = 0, timeout_s: float | None = None) -> aiohttp.ClientSession:
    """A client session with at most ``connections`` open at once (0: no limit), each request given
    ``timeout_s`` in all (None: no limit)."""
    # A connection per request: llama-server (cpp-httplib) drops kept-alive connections while other streams run, and
    # the next request written on one failed ("Can not write request body") in the multi-turn workload (session 43).
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, force_close=True),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        read_bufsize=2**20,  # a line (one event) must fit: a reader that falls behind gets many tokens in one
    )


async def complete(client: aiohttp.ClientSession, url: str, prompt: str, output_len: int) -> Timing:
    timing = Timing(start=time.perf_counter())
    parts: list[str] = []
    async with client.post(f"{url}/v1/completions", json=request_body(prompt, output_len)) as response:
        if response.status != 200:
            raise RuntimeError(f"/v1/completions answered {response.status}: {(await response.read())[:500]!r}")
        async for raw in response.content:  # one line at a time
            if not raw.startswith(b"data: "):
                continue
            line = raw.rstrip(b"\r\n")
            if line == b"data: [DONE]":
                break
            parts.append(timing.add_event(json.loads(line[len(b"data: ") :]), time.perf_counter()))
    timing.end = time.perf_counter()
    timing.text = "".join(parts)
    return timing


def warm_up(url: str) -> None:
    """First requests pay for lazy initialisation (allocator, kernels, thread pools); keep it off the clock."""

    async def go() -> None:
        async with client_session() as client:
            await asyncio.gather(*(complete(client, url, p, 4) for p in WARMUP_PROMPTS))

    asyncio.run(go())
