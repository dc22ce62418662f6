"""Online runner: any OpenAI-compatible server loaded through the streaming client (``benchmarks.client``).

Traffic follows ``vllm bench serve`` / ``sglang.bench_serving``: conversations start as a Poisson
process (``rate`` per second; ``inf`` starts them all at once), at most ``max_concurrency``
requests are in flight (a workload may cap it lower: single-stream is one at a time), and each
conversation sends its turns in order, the next one as soon as the previous answer is complete,
resending the history: the prompt so far plus the answer as the server gave it.
Prompts are the workload's token ids decoded to text; the hit rate's best possible is computed
from the same texts re-tokenized, which is what a server sees.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable

import aiohttp
from transformers import PreTrainedTokenizerBase

from benchmarks.client import Timing, client_session, complete
from benchmarks.hit_rate import reusable_tokens
from benchmarks.metrics import summarize
from benchmarks.results import RunResult
from benchmarks.systems.base import OnlineSystem
from benchmarks.workloads import Turn, Workload

METRICS_SETTLE_S = 5.0  # minisgl publishes its counters periodically; wait this long at most


def _sessions(workload: Workload) -> dict[int, list[tuple[int, Turn]]]:
    """Each conversation's turns in order, with each turn's position in the workload (the report's order)."""
    sessions: dict[int, list[tuple[int, Turn]]] = {}
    for i, turn in enumerate(t for r in workload.rounds for t in r):
        sessions.setdefault(turn.conversation, []).append((i, turn))
    return sessions


def _concurrency_cap(workload: Workload, max_concurrency: int | None) -> int | None:
    caps = [c for c in (max_concurrency, workload.max_concurrency) if c]
    return min(caps) if caps else None


async def _play(
    url: str,
    workload: Workload,
    decode: Callable[[list[int]], str],
    rate: float,
    max_concurrency: int | None,
    seed: int,
) -> tuple[list[tuple[str, Timing]], float]:
    """(prompt text, timing) of every request, in workload order, and the wall time of the whole run."""
    rng = random.Random(seed)
    cap = _concurrency_cap(workload, max_concurrency)
    gate = asyncio.Semaphore(cap) if cap else None
    records: dict[int, tuple[str, Timing]] = {}

    async def request(client: aiohttp.ClientSession, prompt: str) -> Timing:
        if gate is None:
            return await complete(client, url, prompt, workload.output_len)
        async with gate:
            return await complete(client, url, prompt, workload.output_len)

    async def session(client: aiohttp.ClientSession, turns: list[tuple[int, Turn]], delay: float) -> None:
        await asyncio.sleep(delay)
        history = ""
        for index, turn in turns:
            prompt = history + decode(turn.new_ids)
            timing = await request(client, prompt)
            records[index] = (prompt, timing)
            history = prompt + timing.text

    sessions = _sessions(workload)
    starts, t = [], 0.0
    for _ in sessions:
        starts.append(t)
        t += rng.expovariate(rate) if math.isfinite(rate) else 0.0
    async with client_session(cap or len(sessions)) as client:
        start = time.perf_counter()
        await asyncio.gather(*(session(client, turns, s) for turns, s in zip(sessions.values(), starts)))
        duration = time.perf_counter() - start
    return [records[i] for i in sorted(records)], duration


def run_online(
    system: OnlineSystem,
    url: str,
    workload: Workload,
    tokenizer: PreTrainedTokenizerBase,
    rate: float = math.inf,
    max_concurrency: int | None = None,
    seed: int = 0,
) -> RunResult:
    """One workload against ``system`` at ``url``, whose caches ``fresh()`` has just emptied."""
    before = system.counters()

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=False))

    records, duration = asyncio.run(_play(url, workload, decode, rate, max_concurrency, seed))
    timings = [t for _, t in records]
    for t in timings:
        if t.completion_tokens != workload.output_len:
            raise RuntimeError(
                f"{system.name} returned {t.completion_tokens} tokens, expected {workload.output_len} (ignore_eos)"
            )
    prompt_tokens = sum(t.prompt_tokens for t in timings)
    sent = [(tokenizer.encode(p, add_special_tokens=False), tokenizer.encode(t.text, add_special_tokens=False))
            for p, t in records]  # fmt: skip
    best, _ = reusable_tokens(sent)
    extra = {"metrics_delta": _settled_delta(system, before, prompt_tokens)} if before else {}
    return RunResult(
        system=system.name,
        mode="online",
        workload=workload.name,
        description=system.description,
        requests=len(records),
        prompt_tokens=prompt_tokens,
        output_tokens=sum(t.completion_tokens for t in timings),
        cached_tokens=sum(t.cached_tokens for t in timings),
        best_cached_tokens=min(best, prompt_tokens),
        duration_s=duration,
        texts=[t.text for t in timings],
        latency={
            "ttft_s": summarize([t.ttft for t in timings]),
            "itl_s": summarize([x for t in timings for x in t.itls]),
            "tpot_s": summarize([t.tpot for t in timings]),
            "e2e_s": summarize([t.end - t.start for t in timings]),
        },
        ttft_s=[t.ttft for t in timings],
        extra=extra,
    )


def _settled_delta(system: OnlineSystem, before: dict[str, float], expected_prompt_tokens: int) -> dict[str, float]:
    """Counter deltas over the run, once the server has published all of its prompt tokens."""
    deadline = time.monotonic() + METRICS_SETTLE_S
    while True:
        after = system.counters()
        delta = {k: after[k] - before.get(k, 0.0) for k in after}
        if delta.get("prompt_tokens", 0.0) >= expected_prompt_tokens or time.monotonic() > deadline:
            return delta
        time.sleep(0.2)
