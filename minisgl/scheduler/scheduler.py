"""Continuous batching: each ``step`` runs one pass, then retires finished requests at once.

A pass is a prefill pass when anything waits to be prefilled (new requests, or the next chunk of a
long prompt): the requests already decoding ride along with one token each, so a queue of prompts
never stalls their streams for longer than one pass. Otherwise it is a decode pass over every
running request."""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, replace

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from minisgl.config import EngineConfig
from minisgl.constrained.compiler import GrammarCompiler
from minisgl.engine.engine import Engine
from minisgl.engine.runner import LocalRunner, Runner
from minisgl.kvcache.registry import create_prefix_cache
from minisgl.models.loader import resolve_model_path
from minisgl.parallel.runner import TensorParallelRunner
from minisgl.request import Req
from minisgl.sampling import Sampler, SamplingParams
from minisgl.scheduler.cache_manager import CacheManager, align_up
from minisgl.scheduler.forward_pass import ForwardPass
from minisgl.scheduler.prefill import PrefillPlan, PrefillPlanner
from minisgl.scheduler.stats import EngineStats, StatsSnapshot
from minisgl.text.detokenizer import IncrementalDetokenizer

logger = logging.getLogger("minisgl.scheduler")


@dataclass(frozen=True)
class TokenOutput:
    rid: int
    token_id: int
    finish_reason: str | None  # None while running; "stop" | "length" | "abort" | "error" when finished
    error: str | None = None  # finish_reason "error": what went wrong with this request (token_id is -1)


class Scheduler:
    def __init__(self, runner: Runner, config: EngineConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        self.runner, self.engine, self.tokenizer = runner, runner.engine, tokenizer
        engine = runner.engine
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
        self.grammars = GrammarCompiler(tokenizer, engine.model_config.vocab_size, sorted(self.eos_ids))
        self.jump_forward = config.jump_forward

    @classmethod
    def from_config(cls, config: EngineConfig) -> Scheduler:
        path = resolve_model_path(config.model)
        # The engine validates config.json before the tokenizer is looked at.
        runner = LocalRunner(Engine(config, path)) if config.tp_size == 1 else TensorParallelRunner(config, path)
        return cls(runner, config, AutoTokenizer.from_pretrained(str(path)))

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
        stop_text = IncrementalDetokenizer(self.tokenizer, params.stop) if params.stop else None
        spec = params.grammar
        grammar = self.grammars.matcher(spec) if spec is not None else None  # compiled, or ValueError
        req = Req(
            rid, list(input_ids), params, namespace, generator=Sampler.generator_for(params), grammar=grammar, stop_text=stop_text
        )
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
        plan = self.planner.plan(self.waiting, self.running)
        self._admit(plan)
        work = self._prefill_pass(plan) if plan.reqs else self._decode_pass()
        if work is None:
            return []
        start = time.perf_counter()
        sampled = self.runner.forward(work.batch)  # an exception here is the engine's: every request fails
        self._record_pass(work, plan, time.perf_counter() - start)
        next_ids = sampled.next_ids.tolist()
        outputs: list[TokenOutput] = []
        for row, req in enumerate(work.sampled):
            error = sampled.errors.get(row)
            outputs += [self._fail(req, error)] if error is not None else self._process_token(req, next_ids[row])
        return outputs

    def _admit(self, plan: PrefillPlan) -> None:
        for req in plan.admitted:
            self.waiting.remove(req)
            self.running.append(req)
            self.stats.prompt_tokens += req.prompt_len
            self.stats.cached_tokens += req.cached_prompt_tokens

    def _prefill_pass(self, plan: PrefillPlan) -> ForwardPass:
        decoding = [r for r in self.running if not r.is_prefilling]
        # A decoding request has one new token, or more after a jump-forward.
        reqs, lens = plan.reqs + decoding, plan.lens + [r.extend_len for r in decoding]
        self.cache_manager.allocate(reqs, [r.device_len + n for r, n in zip(reqs, lens)])
        return ForwardPass.build(reqs, lens, True, self.engine.table.page_table)

    def _decode_pass(self) -> ForwardPass | None:
        reqs = [r for r in self.running if not r.is_prefilling]
        if not reqs:
            return None
        self.cache_manager.allocate(reqs, [r.seq_len for r in reqs])
        lens = [r.extend_len for r in reqs]
        # A request that jumped forward has several new tokens: computed in an extend (prefill) pass.
        return ForwardPass.build(reqs, lens, any(n > 1 for n in lens), self.engine.table.page_table)

    def _record_pass(self, work: ForwardPass, plan: PrefillPlan, elapsed: float) -> None:
        """The KV is computed: advance every request, hand prefilled KV to the cache, count."""
        self.stats.forward_passes += 1
        for req, n in zip(work.reqs, work.batch.extend_lens.tolist()):
            req.device_len += n
        if work.batch.is_prefill:
            self.stats.prefill_seconds += elapsed
            self.stats.prefill_tokens += sum(plan.lens)
            for req in plan.reqs:
                self.cache_manager.commit(req, finished=False)
        else:
            self.stats.decode_seconds += elapsed
            self.stats.decode_steps += 1
            self.stats.decode_tokens += len(work.reqs)
            self.stats.decode_kv_tokens += sum(r.device_len for r in work.reqs)

    def _process_token(self, req: Req, token: int) -> list[TokenOutput]:
        """Everything done per request with its sampled token: append it (and the tokens its
        grammar forces after it), check whether the request finished, retire it if so. One output
        per appended token, the last carrying the finish reason."""
        kept = len(req.token_ids)
        req.token_ids.append(token)
        try:
            forced = self._advance_grammar(req, token)
            req.token_ids.extend(forced)
            tokens = [token, *forced]
            reason = self._finish_reason(req, tokens)
        except Exception as e:  # noqa: BLE001 - its grammar or stop handling failed: only this request fails
            del req.token_ids[kept:]  # the tokens it failed on are not its output (and have no KV)
            return [self._fail(req, f"token handling failed: {type(e).__name__}: {e}")]
        self.stats.generated_tokens += len(tokens)
        if reason is not None:
            self._retire(req, reason)
        return [TokenOutput(req.rid, t, reason if i == len(tokens) - 1 else None) for i, t in enumerate(tokens)]

    def _advance_grammar(self, req: Req, token: int) -> list[int]:
        """Feed the sampled token to the request's grammar; returns the tokens the grammar forces next
        (jump-forward), appended without sampling and computed together in the next pass. Raises if
        the grammar rejects the token (the mask makes that a bug): that request alone fails."""
        if req.grammar is None:
            return []
        if not req.grammar.accept(token):
            raise RuntimeError(f"sampled token {token} is outside the request's grammar")
        if not self.jump_forward or req.grammar.is_terminated:
            return []
        return req.grammar.jump_forward(self.tokenizer, req.params.max_tokens - len(req.output_ids))

    def _finish_reason(self, req: Req, tokens: list[int]) -> str | None:
        """``tokens``: just appended, the first sampled, the rest forced by the grammar."""
        params = req.params
        if req.grammar is not None and req.grammar.is_terminated:
            return "stop"
        sampled = tokens[0]
        if sampled in params.stop_token_ids or (not params.ignore_eos and sampled in self.eos_ids):
            return "stop"
        if req.stop_text is not None:
            for token in tokens:
                req.stop_text.push(token)
            if req.stop_text.stopped:
                return "stop"
        if len(req.output_ids) >= params.max_tokens:
            return "length"
        return None

    def _fail(self, req: Req, error: str) -> TokenOutput:
        """End a request because of an error of its own: its KV goes back, the others go on."""
        logger.error("request %s failed: %s", req.rid, error)
        req.error = error
        self._retire(req, "error")
        return TokenOutput(req.rid, -1, "error", error)

    def _retire(self, req: Req, reason: str) -> None:
        req.finish_reason = reason
        self.cache_manager.commit(req, finished=True)
        self.running.remove(req)
        self.stats.finished_requests += 1

    # -- cache control, accounting, stats ------------------------------------------------------
    def flush_cache(self) -> None:
        if self.has_work:
            raise RuntimeError(
                f"cannot flush the cache while {len(self.running)} requests run and {len(self.waiting)} wait"
            )
        self.cache_manager.flush()

    def check_accounting(self) -> None:
        self.cache_manager.check_accounting(self.running)
        self.runner.check_ranks()  # tensor parallelism: every rank's pool saw the same writes

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

    def snapshot(self) -> StatsSnapshot:
        return StatsSnapshot(replace(self.stats), len(self.running), len(self.waiting), self.kv_usage())

    def shutdown(self) -> None:
        """Abort everything still queued and stop the runner (tensor parallelism: the other ranks)."""
        for req in list(self.waiting) + list(self.running):
            self.abort(req.rid)
        self.runner.shutdown()
