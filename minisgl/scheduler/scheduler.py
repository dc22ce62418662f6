"""Continuous batching: each ``step`` runs one pass, then retires finished requests at once.

A pass is a prefill pass when anything waits to be prefilled (new requests, or the next chunk of a
long prompt): the requests already decoding ride along with one token each, so a queue of prompts
never stalls their streams for longer than one pass. Otherwise it is a decode pass over every
running request.

Grammars work off the loop, on threads: a request waits in ``compiling`` until its grammar is
compiled (it is admitted only then, and nobody else waits for it), and each token a constrained
request samples goes to its grammar on a thread; a request whose grammar is slow sits out passes
until it is done, instead of holding the step for everyone."""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from transformers import PreTrainedTokenizerBase

from minisgl.attention.registry import ATTENTION_BACKENDS
from minisgl.config import EngineConfig
from minisgl.constrained.compiler import GrammarCompiler
from minisgl.constrained.matcher import Grammar, GrammarAfterThought, GrammarMatcher
from minisgl.constrained.spec import GrammarSpec
from minisgl.engine.engine import Engine
from minisgl.engine.runner import LocalRunner, Runner
from minisgl.kernels.build import start_build
from minisgl.kvcache.registry import PREFIX_CACHES, create_prefix_cache
from minisgl.kvcache.window import WindowSlots
from minisgl.models.source import load_tokenizer, resolve_model_path
from minisgl.parallel.runner import TensorParallelRunner
from minisgl.request import Req
from minisgl.sampling import RejectionCode, RequestRejected, SamplingParams, TokenLogprob
from minisgl.scheduler.cache_manager import CacheManager, align_up
from minisgl.scheduler.forward_pass import ForwardPass
from minisgl.scheduler.prefill import PrefillPlan, PrefillPlanner, default_prefill_tokens
from minisgl.scheduler.speculative import NgramDrafter, PassCost
from minisgl.scheduler.stats import EngineStats, StatsSnapshot
from minisgl.text.detokenizer import IncrementalDetokenizer
from minisgl.tuning import MAX_SCORED_LOGITS

logger = logging.getLogger("minisgl.scheduler")

# A step waits at most this long for the grammar work of the tokens it sampled (each accepted, the
# jump-forward, the next mask: ``GrammarMatcher.advance``, on a thread); a request whose grammar takes
# longer sits out the passes until it is done, while the others go on.
GRAMMAR_STEP_WAIT_S = 0.01
# With nothing to compute until a grammar is ready, a step waits at most this long for one (so a
# server loop still reads its inbox), instead of returning at once to be called again.
GRAMMAR_IDLE_WAIT_S = 0.02
GRAMMAR_WORKERS = 2  # threads advancing grammars (xgrammar releases the GIL while it works)


@dataclass(frozen=True)
class TokenOutput:
    rid: int
    token_id: int
    # None while running; "stop" | "length" | "abort" | "error" when finished; "rejected": its grammar
    # did not compile (it was never admitted; ``error`` says why)
    finish_reason: str | None
    cached_tokens: int  # prompt tokens the request reused from the prefix cache
    error: str | None = None  # finish_reason "error": what went wrong with this request (token_id is -1)
    logprob: TokenLogprob | None = None  # a sampled token's, where the request asks for them
    # With a request's first output token, where it asks for them: its prompt tokens' (None for the first)
    prompt_logprobs: list[TokenLogprob | None] | None = None


class Scheduler:
    def __init__(self, runner: Runner, config: EngineConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        self.runner, self.engine, self.tokenizer = runner, runner.engine, tokenizer
        engine = runner.engine
        window = None
        if engine.window_pool is not None and engine.window is not None:  # sliding-window layers' own slots
            window = WindowSlots(engine.pool.num_slots, engine.window_pool.num_slots - 1, engine.window)
        match_limit = partial(window.usable_len, page_size=config.page_size) if window is not None else None
        cache = create_prefix_cache(config.cache_type, engine.device, config.page_size, match_limit)
        self.cache_manager = CacheManager(
            cache, engine.pool.num_pages, config.page_size, engine.table,
            window, engine.window_per_request,
        )  # fmt: skip
        budget = config.max_prefill_tokens or default_prefill_tokens(engine.model_config.hidden_size)
        scored = max(1, MAX_SCORED_LOGITS // engine.model_config.vocab_size)
        self.planner = PrefillPlanner(self.cache_manager, config.schedule_policy, budget, scored)
        logger.info("prefill: at most %d tokens per pass (longer prompts are chunked)", budget)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.compiling: list[Req] = []  # added, waiting for their grammar before they may be admitted
        self.stats = EngineStats()
        eos = set(engine.model_config.eos_token_ids)
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_ids = frozenset(eos)
        self.grammars = GrammarCompiler(tokenizer, engine.model_config.vocab_size, sorted(self.eos_ids))
        self.jump_forward = config.jump_forward
        self.drafter: NgramDrafter | None = None
        if config.speculative_algorithm == "ngram":
            self.drafter = NgramDrafter(
                cache,
                config.speculative_max_draft,
                config.speculative_ngram_min,
                config.speculative_ngram_max,
                PassCost(),
            )
        self._grammar_steps = ThreadPoolExecutor(GRAMMAR_WORKERS, "minisgl-grammar-step")
        # Running requests whose grammar is taking their last sampled token; they sit out the passes.
        self._advancing: dict[Req, Future[list[int]]] = {}

    @classmethod
    def from_config(cls, config: EngineConfig) -> Scheduler:
        # Names the config cannot check without loading torch: unknown ones fail before the model is looked at.
        PREFIX_CACHES.get(config.cache_type)
        ATTENTION_BACKENDS.get(config.attention_backend)
        if config.torch_device.type == "cpu":  # a first start compiles the kernels while a GGUF's folder is written
            start_build(config.kernels)
        path = resolve_model_path(config.model)
        # The engine validates config.json before the tokenizer is looked at.
        runner = LocalRunner(Engine(config, path)) if config.tp_size == 1 else TensorParallelRunner(config, path)
        return cls(runner, config, load_tokenizer(config.model, config.chat_template))

    # -- requests ------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.engine.model_config.vocab_size

    def make_request(self, rid: int, input_ids: list[int], params: SamplingParams, namespace: str | None = None) -> Req:
        """Validate a request; raises ``RequestRejected`` naming the problem. Allocates nothing; its
        grammar, if any, starts compiling off the loop (``add`` holds it until compiled)."""
        if not input_ids:
            raise RequestRejected("prompt is empty", RejectionCode.INVALID_PROMPT)
        if any(not isinstance(t, int) or not 0 <= t < self.vocab_size for t in input_ids):
            message = f"prompt token ids must be integers in [0, {self.vocab_size})"
            raise RequestRejected(message, RejectionCode.INVALID_PROMPT)
        params.validate(self.vocab_size)
        max_len = self.engine.max_seq_len
        if len(input_ids) >= max_len:
            message = f"prompt has {len(input_ids)} tokens but the context holds {max_len}"
            raise RequestRejected(message, RejectionCode.CONTEXT_LENGTH_EXCEEDED)
        if len(input_ids) + params.max_tokens > max_len:
            message = f"prompt ({len(input_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the context of {max_len} tokens"
            raise RequestRejected(message, RejectionCode.CONTEXT_LENGTH_EXCEEDED)
        stop_text = IncrementalDetokenizer(self.tokenizer, params.stop) if params.stop else None
        req = Req(rid, list(input_ids), params, namespace, stop_text=stop_text)
        if align_up(req.max_kv_len, self.engine.page_size) > self.cache_manager.capacity:
            message = f"request needs {req.max_kv_len} KV slots but the pool holds {self.cache_manager.capacity}"
            raise RequestRejected(message, RejectionCode.KV_CAPACITY_EXCEEDED)
        spec = params.grammar
        if spec is not None:  # last: a request refused anyway starts no compile
            self._start_grammar(req, spec)
        return req

    def _start_grammar(self, req: Req, spec: GrammarSpec) -> None:
        """Its grammar's cheap checks run now; the compile runs off the loop. A grammar already
        compiled (or known not to compile) is settled now."""
        try:
            pending = self.grammars.submit(spec)
            if pending.done():
                req.grammar = _grammar(req, pending.matcher())
            else:
                req.pending_grammar = pending
        except ValueError as e:
            raise _grammar_rejected(spec, e) from None

    def wait_for_grammar(self, req: Req) -> None:
        """Block until ``req``'s grammar is compiled, for a caller with nothing to run meanwhile (offline
        ``generate``, before it queues anything); ``RequestRejected`` if it does not compile in time."""
        pending, req.pending_grammar = req.pending_grammar, None
        if pending is not None:
            try:
                req.grammar = _grammar(req, pending.matcher(block=True))
            except ValueError as e:
                raise _grammar_rejected(pending.spec, e) from None

    def add(self, req: Req) -> None:
        (self.compiling if req.pending_grammar is not None else self.waiting).append(req)

    def abort(self, rid: int) -> bool:
        """Drop a request wherever it is; its KV goes back at once. False if it is unknown."""
        for req in self.compiling:
            if req.rid == rid:
                self.compiling.remove(req)
                self._drop_pending_grammar(req)
                req.finish_reason = "abort"
                return True
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
        return bool(self.waiting or self.running or self.compiling)

    @property
    def queued(self) -> list[Req]:
        """Every request not admitted yet, those whose grammar still compiles too: what "waiting" counts."""
        return [*self.compiling, *self.waiting]

    # -- the loop ------------------------------------------------------------------------------
    def step(self) -> list[TokenOutput]:
        outputs = self._settle_grammars()
        work = self._next_pass()
        if work is None and (self.compiling or self._advancing):
            # Nothing to compute until a grammar is ready: wait for one rather than spin.
            wait(self._grammar_futures(), timeout=GRAMMAR_IDLE_WAIT_S, return_when=FIRST_COMPLETED)
            outputs += self._settle_grammars()
            work = self._next_pass()
        if work is None:
            return outputs
        start = time.perf_counter()
        sampled = self.runner.forward(work.batch)  # an exception here is the engine's: every request fails
        self._record_pass(work, time.perf_counter() - start)
        self._take_prompt_logprobs(work, sampled.prompt_logprobs)
        next_ids = sampled.next_ids.tolist()
        row = 0
        for req in work.sampled:
            draft = work.drafts.get(req, [])
            rows = range(row, row + len(draft) + 1)
            row = rows.stop
            errors = [sampled.errors.get(r) for r in rows]
            logprobs = [sampled.logprobs.get(r) for r in rows]
            outputs += self._take_sampled(req, draft, [next_ids[r] for r in rows], errors, logprobs)
        # Grammar work takes microseconds for most grammars: waited for, so their tokens go out now.
        wait([self._advancing[r] for r in work.sampled if r in self._advancing], timeout=GRAMMAR_STEP_WAIT_S)
        return outputs + self._take_advanced()

    def _next_pass(self) -> ForwardPass | None:
        plan = self.planner.plan(self.waiting, self.running)
        self._admit(plan)
        return self._forward_pass(plan)

    def _admit(self, plan: PrefillPlan) -> None:
        for req in plan.admitted:
            self.waiting.remove(req)
            self.running.append(req)
            self.stats.prompt_tokens += req.prompt_len
            self.stats.cached_tokens += req.cached_prompt_tokens

    def _forward_pass(self, plan: PrefillPlan) -> ForwardPass | None:
        """The planned prefill chunks and every decoding request (one new token, or more after a
        jump-forward), with their KV slots allocated; None if there is nothing to compute."""
        decoding = [r for r in self.running if not r.is_prefilling and r not in self._advancing]
        if not plan.reqs and not decoding:
            return None
        drafts = self.drafter.drafts(decoding) if self.drafter is not None else {}
        chunk_ends = [r.device_len + n for r, n in zip(plan.reqs, plan.lens)]
        decode_ends = [r.seq_len + len(drafts.get(r, ())) for r in decoding]
        self.cache_manager.allocate(plan.reqs + decoding, chunk_ends + decode_ends)
        return ForwardPass.build(plan.reqs, plan.lens, decoding, self.engine.table.page_table, drafts)

    def _record_pass(self, work: ForwardPass, elapsed: float) -> None:
        """The KV is computed: advance every request (a draft token's KV counts once it is kept),
        hand prefilled KV to the cache, count."""
        kv_read = int(work.batch.kv_lens.sum())
        for req, n in zip(work.reqs, work.new_tokens):
            req.device_len += n - len(work.drafts.get(req, ()))
        for req in work.prefilled:
            self.cache_manager.commit(req, finished=False)
        if self.drafter is not None and self.drafter.cost is not None and work.prefill_tokens == 0:
            self.drafter.cost.observe(work.decode_tokens, elapsed)
        self.stats.record_pass(work.prefill_tokens, work.decode_tokens, kv_read, len(work.sampled), elapsed)

    @staticmethod
    def _take_prompt_logprobs(work: ForwardPass, scores: list[TokenLogprob]) -> None:
        """The scored rows' log-probabilities (in ``work.scored``'s order) to their requests, each cut to the
        alternatives it asks for."""
        rows = iter(scores)
        for req, count in work.scored:
            top = req.params.prompt_logprobs or 0
            taken = itertools.islice(rows, count)
            req.prompt_token_logprobs += [TokenLogprob(lp.logprob, lp.top[:top]) for lp in taken]

    def _take_sampled(
        self,
        req: Req,
        draft: list[int],
        tokens: list[int],
        errors: list[str | None],
        logprobs: list[TokenLogprob | None],
    ) -> list[TokenOutput]:
        """The tokens sampled for ``req``: after its last token, then after each of its draft tokens.
        Draft token i is kept when the token sampled before it is the same (scheduler/speculative.py
        says why that leaves the output's distribution unchanged); the first sampled token that
        differs from the draft, or the one after the whole draft, is the last taken. Each goes the
        per-token path (``_process_token``), which may finish the request anywhere in the draft."""
        outputs: list[TokenOutput] = []
        accepted = 0
        for i, (token, error, logprob) in enumerate(zip(tokens, errors, logprobs)):
            if error is not None:
                outputs.append(self._fail(req, error))
                break
            kept = i < len(draft) and token == draft[i]
            accepted += kept
            outputs += self._process_token(req, token, logprob)
            if not kept or req.finish_reason is not None:
                break
            req.device_len += 1  # the pass computed this draft token's KV: it is a token of the request now
        if draft:
            self.stats.draft_tokens += len(draft)
            self.stats.accepted_draft_tokens += accepted
            if req.finish_reason is None:
                assert self.drafter is not None
                self.drafter.verified(req, len(draft), accepted)
        return outputs

    def _process_token(self, req: Req, token: int, logprob: TokenLogprob | None) -> list[TokenOutput]:
        """Everything done per request with its sampled token starts here: append it (and its
        log-probability, if asked for); a request with a grammar then hands the token to it on a thread
        (``GrammarMatcher.advance``: accept it, the jump-forward, the next mask) and is finished when
        that is done (``_take_advanced``)."""
        req.token_ids.append(token)
        if logprob is not None:
            req.output_logprobs.append(logprob)
        if req.grammar is None:
            return self._finish_token(req, None)
        # No jump-forward for a request that asks for log-probabilities: every token it outputs is sampled.
        jumps = self.jump_forward and req.params.logprobs is None
        jump_limit = req.params.max_tokens - len(req.output_ids) if jumps else 0
        self._advancing[req] = self._grammar_steps.submit(req.grammar.advance, token, self.tokenizer, jump_limit)
        return []

    def _finish_token(self, req: Req, grammar_step: Future[list[int]] | None) -> list[TokenOutput]:
        """The rest, once its grammar (if any) took the sampled token (the last of ``token_ids``):
        append the tokens the grammar forces after it (jump-forward, computed together in the next
        pass), check whether the request finished, retire it if so. One output per appended token,
        the last carrying the finish reason. A grammar that rejects the token (the mask makes that a
        bug) or a failing stop check fails this request alone."""
        kept = len(req.token_ids) - 1
        try:
            forced = grammar_step.result() if grammar_step is not None else []
            req.token_ids.extend(forced)
            tokens = req.token_ids[kept:]
            reason = self._finish_reason(req, tokens)
            logprob = req.output_logprobs[kept - req.prompt_len] if req.params.logprobs is not None else None
            prompt = req.prompt_token_logprobs if req.scores_prompt and kept == req.prompt_len else None
        except Exception as e:  # noqa: BLE001 - its grammar or stop handling failed: only this request fails
            del req.token_ids[kept:]  # the tokens it failed on are not its output (and have no KV)
            del req.output_logprobs[kept - req.prompt_len :]
            return [self._fail(req, f"token handling failed: {type(e).__name__}: {e}")]
        self.stats.generated_tokens += len(tokens)
        if reason is not None:
            self._retire(req, reason)
        last = len(tokens) - 1
        return [
            TokenOutput(req.rid, t, reason if i == last else None, req.cached_prompt_tokens, None, logprob, prompt)
            for i, t in enumerate(tokens)
        ]

    # -- grammars off the loop -----------------------------------------------------------------
    def _settle_grammars(self) -> list[TokenOutput]:
        """Requests whose grammar compiled join ``waiting``; those whose grammar failed (or ran out of
        time) are rejected, with an output; tokens whose grammar work is done are finished."""
        outputs: list[TokenOutput] = []
        for req in [r for r in self.compiling if r.pending_grammar is not None and r.pending_grammar.done()]:
            self.compiling.remove(req)
            pending, req.pending_grammar = req.pending_grammar, None
            try:
                req.grammar = _grammar(req, pending.matcher())
            except ValueError as e:
                req.rejection = _grammar_rejected(pending.spec, e)
                req.finish_reason, req.error = "rejected", str(e)
                outputs.append(TokenOutput(req.rid, -1, "rejected", 0, req.error))
            else:
                self.waiting.append(req)
        return outputs + self._take_advanced()

    def _take_advanced(self) -> list[TokenOutput]:
        outputs: list[TokenOutput] = []
        for req, future in list(self._advancing.items()):
            if future.done():
                del self._advancing[req]
                outputs += self._finish_token(req, future)
        return outputs

    def _grammar_futures(self) -> list[Future[Any]]:
        compiles = [r.pending_grammar.future for r in self.compiling if r.pending_grammar is not None]
        return [*compiles, *self._advancing.values()]

    def _drop_pending_grammar(self, req: Req) -> None:
        if req.pending_grammar is not None:
            req.pending_grammar.release()  # a compile nobody waits for any more is dropped if not started
            req.pending_grammar = None

    def _finish_reason(self, req: Req, tokens: list[int]) -> str | None:
        """``tokens``: just appended, the first sampled, the rest forced by the grammar."""
        params = req.params
        if req.grammar is not None and req.grammar.is_terminated:
            return "stop"
        sampled = tokens[0]
        if sampled in params.stop_token_ids or (not params.ignore_eos and sampled in self.eos_ids):
            return "stop"
        if req.stop_text is not None:
            req.stop_text.push(tokens)
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
        return TokenOutput(req.rid, -1, "error", req.cached_prompt_tokens, error)

    def _retire(self, req: Req, reason: str) -> None:
        req.finish_reason = reason
        self._advancing.pop(req, None)  # aborted while its grammar took a token: the result is dropped
        self.cache_manager.commit(req, finished=True)
        self.running.remove(req)
        if self.drafter is not None:
            self.drafter.forget(req)
        self.stats.finished_requests += 1

    # -- cache control, accounting, stats ------------------------------------------------------
    def flush_cache(self) -> None:
        if self.has_work:
            waiting = len(self.queued)
            raise RuntimeError(f"cannot flush the cache while {len(self.running)} requests run and {waiting} wait")
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
            **self.cache_manager.window_usage(self.running),
        }

    def snapshot(self) -> StatsSnapshot:
        return StatsSnapshot(
            replace(self.stats),
            len(self.running),
            len(self.queued),
            self.kv_usage(),
            dict(self.engine.memory),
        )

    def shutdown(self) -> None:
        """Abort everything still queued and stop the runner (tensor parallelism: the other ranks)."""
        for req in [*self.compiling, *self.waiting, *self.running]:
            self.abort(req.rid)
        self.grammars.shutdown()
        self._grammar_steps.shutdown(wait=False, cancel_futures=True)
        self.runner.shutdown()


def _grammar(req: Req, matcher: GrammarMatcher) -> Grammar:
    """The request's grammar: its matcher, held only after the reasoning block where the request names the
    model's reasoning tags."""
    tags = req.params.think_tags
    if tags is None:
        return matcher
    return GrammarAfterThought(matcher, tags, tags.opened_by(req.token_ids[: req.prompt_len]))


def _grammar_rejected(spec: GrammarSpec, error: ValueError) -> RequestRejected:
    return RequestRejected(str(error), RejectionCode.INVALID_GRAMMAR, spec.kind)
