"""Continuous batching: each ``step`` runs one pass, then retires finished requests at once.

A pass is a prefill pass when anything waits to be prefilled (new requests, or the next chunk of a
long prompt): the requests already decoding ride along with one token each, so a queue of prompts
never stalls their streams for longer than one pass. Otherwise it is a decode pass over every
running request."""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from minisgl.config import EngineConfig
from minisgl.engine.batch import Batch
from minisgl.engine.engine import Engine
from minisgl.kvcache.base import create_prefix_cache
from minisgl.kvcache.cache_manager import CacheManager, align_up
from minisgl.models.loader import resolve_model_path
from minisgl.request import Req
from minisgl.sampling import Sampler, SamplingParams
from minisgl.scheduler.prefill import PrefillPlanner

logger = logging.getLogger("minisgl.scheduler")


@dataclass(frozen=True)
class TokenOutput:
    rid: int
    token_id: int
    finish_reason: str | None  # None while running; "stop" | "length" | "abort" when finished


@dataclass
class EngineStats:
    prompt_tokens: int = 0  # prompt tokens of every admitted request
    cached_tokens: int = 0  # of those, reused from the prefix cache
    prefill_tokens: int = 0  # tokens actually computed in prefill passes
    generated_tokens: int = 0
    finished_requests: int = 0
    prefill_seconds: float = 0.0  # wall time of prefill passes, decode tokens riding along included
    decode_seconds: float = 0.0  # wall time of decode-only passes (forward and sampling)
    decode_steps: int = 0
    decode_tokens: int = 0  # tokens sampled by decode-only passes
    decode_kv_tokens: int = 0  # KV entries attended over all decode steps (what decode reads)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Scheduler:
    def __init__(self, engine: Engine, config: EngineConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        cache = create_prefix_cache(config.cache_type, engine.device, config.page_size)
        self.cache_manager = CacheManager(cache, engine.pool.num_pages, config.page_size, engine.table)
        self.planner = PrefillPlanner(self.cache_manager, config.schedule_policy, config.max_prefill_tokens)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.stats = EngineStats()
        eos = set(engine.model_config.eos_token_ids)
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_ids = frozenset(eos)

    @classmethod
    def from_config(cls, config: EngineConfig) -> Scheduler:
        path = resolve_model_path(config.model)
        engine = Engine(config, path)  # validates config.json before the tokenizer is looked at
        return cls(engine, config, AutoTokenizer.from_pretrained(str(path)))

    # -- requests ------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.engine.model_config.vocab_size

    def make_request(self, rid: int, input_ids: list[int], params: SamplingParams, namespace: str | None = None) -> Req:
        """Validate a request; raises ``ValueError`` naming the problem. Allocates nothing."""
        if not input_ids:
            raise ValueError("prompt is empty")
        if any(not isinstance(t, int) or not 0 <= t < self.vocab_size for t in input_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {self.vocab_size})")
        params.validate(self.vocab_size)
        max_len = self.engine.max_seq_len
        if len(input_ids) >= max_len:
            raise ValueError(f"prompt has {len(input_ids)} tokens but the context holds {max_len}")
        if len(input_ids) + params.max_tokens > max_len:
            raise ValueError(
                f"prompt ({len(input_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the context of {max_len} tokens"
            )
        req = Req(rid, list(input_ids), params, namespace, generator=Sampler.generator_for(params))
        if align_up(req.max_kv_len, self.engine.page_size) > self.cache_manager.capacity:
            raise ValueError(
                f"request needs {req.max_kv_len} KV slots but the pool holds {self.cache_manager.capacity}"
            )
        return req

    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def abort(self, rid: int) -> bool:
        """Drop a request wherever it is; its KV goes back at once. False if it is unknown."""
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                return True
        for req in self.running:
            if req.rid == rid:
                self._retire(req, "abort")
                return True
        return False

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the loop ------------------------------------------------------------------------------
    def step(self) -> list[TokenOutput]:
        batch = self._prefill_batch() or self._decode_batch()
        if batch is None:
            return []
        prefilling = [r.is_prefilling for r in batch.reqs]
        start = time.perf_counter()
        next_ids = self.engine.forward(batch).tolist()
        elapsed = time.perf_counter() - start
        for req, n in zip(batch.reqs, batch.extend_lens):
            req.device_len += n
        if batch.is_prefill:
            self.stats.prefill_seconds += elapsed
            self.stats.prefill_tokens += sum(n for n, p in zip(batch.extend_lens, prefilling) if p)
            for req, p in zip(batch.reqs, prefilling):
                if p:
                    self.cache_manager.commit(req, finished=False)
        else:
            self.stats.decode_seconds += elapsed
            self.stats.decode_steps += 1
            self.stats.decode_tokens += len(batch.reqs)
            self.stats.decode_kv_tokens += sum(r.device_len for r in batch.reqs)
        outputs = []
        for req, token in zip(batch.sampling_reqs, next_ids):
            req.token_ids.append(token)
            self.stats.generated_tokens += 1
            reason = self._finish_reason(req, token)
            outputs.append(TokenOutput(req.rid, token, reason))
            if reason is not None:
                self._retire(req, reason)
        return outputs

    def _prefill_batch(self) -> Batch | None:
        admitted_before = len(self.running)
        reqs, lens = self.planner.plan(self.waiting, self.running)
        for req in self.running[admitted_before:]:
            self.stats.prompt_tokens += req.prompt_len
            self.stats.cached_tokens += req.cached_prompt_tokens
        if not reqs:
            return None
        decoding = [r for r in self.running if not r.is_prefilling]
        reqs, lens = reqs + decoding, lens + [1] * len(decoding)
        self.cache_manager.allocate(reqs, [r.device_len + n for r, n in zip(reqs, lens)])
        return Batch.build(reqs, lens, True, self.engine.table.page_table)

    def _decode_batch(self) -> Batch | None:
        reqs = [r for r in self.running if not r.is_prefilling]
        if not reqs:
            return None
        self.cache_manager.allocate(reqs, [r.seq_len for r in reqs])
        return Batch.build(reqs, [1] * len(reqs), False, self.engine.table.page_table)

    def _finish_reason(self, req: Req, token: int) -> str | None:
        params = req.params
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_ids):
            return "stop"
        if params.stop and self._ends_with_stop_string(req):
            return "stop"
        if len(req.output_ids) >= params.max_tokens:
            return "length"
        return None

    def _ends_with_stop_string(self, req: Req) -> bool:
        # A stop string of n characters spans at most ~4n tokens (byte-level pieces of one character),
        # so decoding that tail is enough; earlier text was checked on earlier steps.
        window = 4 * max(len(s) for s in req.params.stop) + 4
        tail = self.tokenizer.decode(req.output_ids[-window:], skip_special_tokens=True)
        return any(s in tail for s in req.params.stop)

    def _retire(self, req: Req, reason: str) -> None:
        req.finish_reason = reason
        self.cache_manager.commit(req, finished=True)
        self.running.remove(req)
        self.stats.finished_requests += 1

    # -- cache control -------------------------------------------------------------------------
    def flush_cache(self) -> None:
        if self.has_work:
            raise RuntimeError(
                f"cannot flush the cache while {len(self.running)} requests run and {len(self.waiting)} wait"
            )
        self.cache_manager.flush()

    def check_accounting(self) -> None:
        self.cache_manager.check_accounting(self.running)
        self.engine.check_ranks()  # tensor parallelism: every rank's pool saw the same writes

    def kv_usage(self) -> dict[str, int]:
        evictable, protected = self.cache_manager.cache.size_info
        return {
            "capacity": self.cache_manager.capacity,
            "free": self.cache_manager.free_size,
            "evictable": evictable,
            "protected": protected,
            "in_use": len(self.cache_manager.owned_slots(self.running)),
            "evicted_total": self.cache_manager.evicted_tokens,
        }
