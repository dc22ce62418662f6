"""One HTTP request's worth of engine requests (``n`` samples of each prompt) and their text.

``start`` submits everything and waits until the scheduler accepted or rejected each sample, so
a bad request fails with a 400 before any response (streamed or not) begins. ``deltas`` then
yields text as it becomes final; ``close`` aborts whatever has not finished. A sample that fails
in the engine (an error of its own) fails its whole HTTP request with a 500 naming the error.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field, replace

from transformers import PreTrainedTokenizerBase

from minisgl.sampling import SamplingParams, TokenLogprob
from minisgl.server.engine_client import Accepted, EngineClient, EngineDead, Event
from minisgl.server.errors import ApiError
from minisgl.server.metrics import ServerMetrics
from minisgl.server.protocol import Rejection, Token
from minisgl.text.detokenizer import IncrementalDetokenizer


@dataclass
class Sample:
    index: int  # choice index: prompt_index * n + i
    prompt_index: int
    prompt_ids: list[int]
    params: SamplingParams
    detok: IncrementalDetokenizer
    rid: int = -1
    accepted: bool = False  # the scheduler queued it (only then can it count as aborted)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per output token, where asked for
    prompt_logprobs: list[TokenLogprob | None] | None = None  # per prompt token (the first: None), where asked for
    cached_tokens: int = 0
    finish_reason: str | None = None
    last_token_at: float | None = None

    @property
    def text(self) -> str:
        return self.detok.emitted


@dataclass(frozen=True)
class Delta:
    sample: Sample
    text: str  # newly final text, possibly empty
    finish_reason: str | None
    token_ids: list[int]  # the tokens that came (their text may still be held back)
    logprobs: list[TokenLogprob]  # theirs, where the sample asks for them


@dataclass
class _Batch:
    """The tokens of one sample that make one delta."""

    sample: Sample
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None  # set when its last token is the sample's last


class SampleFailed(RuntimeError):
    """A sample failed in the engine with an error of its own; the other requests are unaffected."""


def failure_error(exc: EngineDead | SampleFailed) -> ApiError:
    """What the client is told when its generation cannot go on."""
    if isinstance(exc, EngineDead):
        return ApiError(503, str(exc))
    return ApiError(500, f"the request failed: {exc}", code="request_failed")


class Generation:
    def __init__(
        self,
        client: EngineClient,
        tokenizer: PreTrainedTokenizerBase,
        metrics: ServerMetrics,
        prompts: list[list[int]],
        params: SamplingParams,
        n: int = 1,
        namespace: str | None = None,
    ) -> None:
        self.client, self.metrics, self.namespace = client, metrics, namespace
        self.samples = [
            Sample(p * n + i, p, ids, sp, IncrementalDetokenizer(tokenizer, sp.stop))
            for p, ids in enumerate(prompts)
            for i, sp in enumerate(sample_params(params, n))
        ]
        self.arrival = time.monotonic()
        self._queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self._pending: deque[tuple[int, Event]] = deque()  # events taken off the queue, not yet handled

    async def start(self) -> None:
        try:
            for s in self.samples:
                s.rid = self.client.new_rid()
                self.client.submit(s.rid, s.prompt_ids, s.params, self.namespace, self._queue, s.index)
            pending = len(self.samples)
            while pending:
                index, event = await self._queue.get()
                if isinstance(event, Accepted):
                    self.samples[index].accepted = True
                    pending -= 1
                elif isinstance(event, Rejection):
                    self.samples[index].finish_reason = "rejected"
                    raise ApiError(400, event.message, param=event.param, code=event.code.value)
                elif isinstance(event, EngineDead):
                    raise event
                else:
                    self._pending.append((index, event))
        except EngineDead as e:
            self.close()
            raise ApiError(503, str(e)) from None
        except BaseException:
            self.close()
            raise

    async def deltas(self) -> AsyncIterator[Delta]:
        """Text deltas of all samples as tokens arrive. The tokens of a sample that arrived together (a
        message of the scheduler's carries a stream interval's worth) make one delta, detokenized
        together, so that a response writes one event per interval and not one per token (for a fast
        decode a tenth of the events and the bytes). A sample's first token is a delta of its own, so
        that the client sees when it came. Raises ``EngineDead`` or ``SampleFailed`` after the deltas
        of the tokens before the failure."""
        unfinished = sum(s.finish_reason is None for s in self.samples)
        while unfinished:
            if not self._pending:
                self._pending.append(await self._queue.get())
            while not self._queue.empty():
                self._pending.append(self._queue.get_nowait())
            batches: list[_Batch] = []
            growing: dict[int, _Batch] = {}  # sample index -> its batch that later tokens extend
            failure: EngineDead | SampleFailed | None = None
            while self._pending and failure is None:
                index, event = self._pending.popleft()
                try:
                    token_id, logprob = self._take(index, event)
                except (EngineDead, SampleFailed) as e:
                    failure = e
                    continue
                sample = self.samples[index]
                batch = growing.get(index)
                if batch is None:
                    batch = _Batch(sample)
                    batches.append(batch)
                    if len(sample.output_ids) > 1:
                        growing[index] = batch
                batch.token_ids.append(token_id)
                if logprob is not None:
                    batch.logprobs.append(logprob)
                if sample.finish_reason is not None:  # this was its last token
                    batch.finish_reason = sample.finish_reason
                    unfinished -= 1
            for batch in batches:
                text = batch.sample.detok.push(batch.token_ids)
                if batch.finish_reason is not None:
                    text += batch.sample.detok.finish()
                yield Delta(batch.sample, text, batch.finish_reason, batch.token_ids, batch.logprobs)
            if failure is not None:
                raise failure

    def _take(self, index: int, event: Event) -> tuple[int, TokenLogprob | None]:
        """One event of sample ``index``: its token and log-probability, recorded (and the sample finished
        at its last)."""
        if isinstance(event, EngineDead):
            raise event
        assert isinstance(event, Token), event  # start() consumed every accept/reject
        sample = self.samples[index]
        if event.finish_reason == "error":
            sample.finish_reason = "error"
            self.metrics.requests.labels("error").inc()
            raise SampleFailed(event.error or "unknown error")
        self._record_latency(sample)
        sample.output_ids.append(event.token_id)
        if event.logprob is not None:
            sample.logprobs.append(event.logprob)
        if event.prompt_logprobs is not None:
            sample.prompt_logprobs = event.prompt_logprobs
        sample.cached_tokens = event.cached_tokens
        if event.finish_reason is not None:
            sample.finish_reason = event.finish_reason
            self.metrics.requests.labels(event.finish_reason).inc()
        return event.token_id, event.logprob

    async def run(self, disconnected: Awaitable[None]) -> bool:
        """Run every sample to the end; False (and everything aborted) if ``disconnected`` fires first."""

        async def drain() -> None:
            async for _ in self.deltas():
                pass

        work = asyncio.ensure_future(drain())
        watch = asyncio.ensure_future(disconnected)
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()
                self.close()
        if work.done() and not work.cancelled():
            if work.exception() is not None:
                self.close()  # one sample failed: the others of this request are aborted
            work.result()  # re-raises EngineDead or SampleFailed
            return True
        return False

    def close(self) -> None:
        """Abort unfinished samples. Synchronous: it runs in cancelled tasks too."""
        unfinished = [s for s in self.samples if s.finish_reason is None]
        for s in unfinished:
            s.finish_reason = "abort"
            if s.accepted:
                self.metrics.requests.labels("abort").inc()
        self.client.abort([s.rid for s in unfinished if s.rid >= 0])

    def usage(self) -> dict[str, int]:
        """OpenAI usage: each prompt counted once; its cached tokens are those every sample reused."""
        prompt_tokens = cached = 0
        for p in sorted({s.prompt_index for s in self.samples}):
            group = [s for s in self.samples if s.prompt_index == p]
            prompt_tokens += len(group[0].prompt_ids)
            cached += min(s.cached_tokens for s in group)
        completion = sum(len(s.output_ids) for s in self.samples)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "cached_tokens": cached,
        }

    def _record_latency(self, sample: Sample) -> None:
        now = time.monotonic()
        if sample.last_token_at is None:
            self.metrics.ttft.observe(now - self.arrival)
        else:
            self.metrics.itl.observe(now - sample.last_token_at)
        sample.last_token_at = now


def sample_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """n copies; seeded requests get seeds seed, seed+1, ... so the samples differ but reproduce."""
    if params.seed is None:
        return [params] * n
    return [replace(params, seed=params.seed + i) for i in range(n)]
