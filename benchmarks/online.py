"""Online runner: an asyncio client streaming from the OpenAI ``/v1/completions`` endpoint.

Requests of a round arrive as a Poisson process (``rate`` per second; ``inf`` sends them all at
once), at most ``max_concurrency`` in flight. A multi-turn round starts when the previous one has
finished, since its prompts contain the previous answers. Prompts go as token ids so the server
sees exactly what the offline systems see; answers come back as text and are re-tokenized to
build the next round's history, as any real chat client does.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
from dataclasses import dataclass, field

import httpx
from transformers import PreTrainedTokenizerBase

from benchmarks.hit_rate import reusable_tokens
from benchmarks.metrics import summarize
from benchmarks.results import RunResult
from benchmarks.workloads import Conversations, Workload

METRICS_SETTLE_S = 5.0  # the server publishes its counters periodically; wait this long at most


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


async def complete(client: httpx.AsyncClient, url: str, prompt: list[int], output_len: int) -> Timing:
    body = {
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    timing = Timing(start=time.perf_counter())
    parts: list[str] = []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"/v1/completions answered {response.status_code}: {(await response.aread())[:500]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                raise RuntimeError(f"server error mid-stream: {event['error']}")
            for choice in event.get("choices", []):
                if choice.get("text"):
                    timing.chunk_times.append(time.perf_counter())
                    parts.append(choice["text"])
            if event.get("usage"):
                usage = event["usage"]
                timing.prompt_tokens = usage["prompt_tokens"]
                timing.completion_tokens = usage["completion_tokens"]
                timing.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    timing.end = time.perf_counter()
    timing.text = "".join(parts)
    return timing


async def _play(
    url: str,
    workload: Workload,
    tokenizer: PreTrainedTokenizerBase,
    rate: float,
    max_concurrency: int | None,
    seed: int,
) -> tuple[list[tuple[list[int], list[int], Timing]], float]:
    rng = random.Random(seed)
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    limits = httpx.Limits(max_connections=max_concurrency or workload.num_requests)

    async def limited(client: httpx.AsyncClient, prompt: list[int]) -> Timing:
        if gate is None:
            return await complete(client, url, prompt, workload.output_len)
        async with gate:
            return await complete(client, url, prompt, workload.output_len)

    conversations = Conversations()
    records = []
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        start = time.perf_counter()
        for turns in workload.rounds:
            prompts, tasks = [], []
            for i, turn in enumerate(turns):
                if i and math.isfinite(rate):
                    await asyncio.sleep(rng.expovariate(rate))
                prompts.append(conversations.prompt(turn))
                tasks.append(asyncio.create_task(limited(client, prompts[-1])))
            for turn, prompt, timing in zip(turns, prompts, await asyncio.gather(*tasks)):
                output_ids = tokenizer.encode(timing.text, add_special_tokens=False)
                conversations.record(turn, prompt, output_ids)
                records.append((prompt, output_ids, timing))
        return records, time.perf_counter() - start


def scrape_counters(url: str) -> dict[str, float]:
    """The server's cumulative token counters from ``/metrics`` (Prometheus text format)."""
    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    found = re.findall(r"^minisgl_(prompt_tokens|cached_tokens)_total\s+(\S+)$", text, re.MULTILINE)
    return {name: float(value) for name, value in found}


def flush(url: str) -> None:
    response = httpx.post(f"{url}/flush_cache", timeout=60.0)
    if response.status_code != 200:
        raise RuntimeError(f"/flush_cache answered {response.status_code}: {response.text[:300]}")


def warm_up(url: str, vocab_size: int) -> None:
    rng = random.Random(0)

    async def go() -> None:
        async with httpx.AsyncClient(timeout=None) as client:
            prompts = [[rng.randrange(3, vocab_size) for _ in range(24)] for _ in range(2)]
            await asyncio.gather(*(complete(client, url, p, 4) for p in prompts))

    asyncio.run(go())
    flush(url)


def run_online(
    url: str,
    system: str,
    description: str,
    workload: Workload,
    tokenizer: PreTrainedTokenizerBase,
    rate: float = math.inf,
    max_concurrency: int | None = None,
    seed: int = 0,
) -> RunResult:
    flush(url)
    before = scrape_counters(url)
    records, duration = asyncio.run(_play(url, workload, tokenizer, rate, max_concurrency, seed))
    timings = [t for _, _, t in records]
    for t in timings:
        if t.completion_tokens != workload.output_len:
            raise RuntimeError(
                f"server returned {t.completion_tokens} tokens, expected {workload.output_len} (ignore_eos)"
            )
    prompt_tokens = sum(t.prompt_tokens for t in timings)
    best, _ = reusable_tokens((p, o) for p, o, _ in records)
    return RunResult(
        system=system,
        mode="online",
        workload=workload.name,
        description=f"{description}; rate={rate}/s, max_concurrency={max_concurrency or 'none'}",
        requests=len(records),
        prompt_tokens=prompt_tokens,
        output_tokens=sum(t.completion_tokens for t in timings),
        cached_tokens=sum(t.cached_tokens for t in timings),
        best_cached_tokens=best,
        duration_s=duration,
        texts=[t.text for t in timings],
        latency={
            "ttft_s": summarize([t.ttft for t in timings]),
            "itl_s": summarize([x for t in timings for x in t.itls]),
            "tpot_s": summarize([t.tpot for t in timings]),
            "e2e_s": summarize([t.end - t.start for t in timings]),
        },
        ttft_s=[t.ttft for t in timings],
        extra={"metrics_delta": _settled_delta(url, before, prompt_tokens)},
    )


def _settled_delta(url: str, before: dict[str, float], expected_prompt_tokens: int) -> dict[str, float]:
    """Counter deltas over the run, once the server has published all of its prompt tokens."""
    deadline = time.monotonic() + METRICS_SETTLE_S
    while True:
        after = scrape_counters(url)
        delta = {k: after[k] - before.get(k, 0.0) for k in after}
        if delta.get("prompt_tokens", 0.0) >= expected_prompt_tokens or time.monotonic() > deadline:
            return delta
        time.sleep(0.2)
