"""The scheduler process: owns the model and the KV pool, runs forward passes, speaks only token ids.

Loop: drain incoming messages (block while idle), run one ``step`` if there is work, send that step's
tokens with any held before them as one message once ``StreamPacer`` says they are due, push stats now
and then. It exits when its parent disappears, so a killed front end never leaves an orphan holding
the model's memory.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
import zmq

from minisgl.config import EngineConfig
from minisgl.sampling import RequestRejected
from minisgl.server.protocol import (
    Abort,
    CacheQuery,
    CacheReport,
    Control,
    ControlOp,
    ControlReply,
    Ready,
    Rejection,
    RequestState,
    RequestView,
    StepOutput,
    Submit,
    Token,
    ToScheduler,
)

if TYPE_CHECKING:
    from minisgl.request import Req
    from minisgl.scheduler.scheduler import Scheduler

logger = logging.getLogger("minisgl.server.scheduler")

# While idle the loop wakes this often to notice a dead parent.
IDLE_POLL_MS = 500
# Stats are pushed at most this often while busy (and once more when the work runs out).
STATS_INTERVAL_S = 0.5


class StreamPacer:
    """Holds the steps' outputs and says when they go to the front end, all held ones in one message: at
    once for answers (a stream's start or its 400), a request's first token (time to first token) and its
    last (the response's end); else once ``interval_s`` has passed since the last message. The loop also
    takes them whenever nothing more would come soon. Tokens keep their order."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.clock = interval_s, clock
        self.held = StepOutput()
        self._streaming: set[int] = set()  # requests whose first token has gone
        self._last = clock()

    def add(self, out: StepOutput) -> bool:
        """Hold ``out``; whether the held outputs are due now."""
        held = self.held
        held.tokens += out.tokens
        held.accepted += out.accepted
        held.rejected += out.rejected
        urgent = bool(out.accepted or out.rejected)
        for token in out.tokens:
            if token.finish_reason is not None:
                self._streaming.discard(token.rid)
                urgent = True
            elif token.rid not in self._streaming:
                self._streaming.add(token.rid)
                urgent = True
        return urgent or self.clock() - self._last >= self.interval_s

    def forget(self, rids: list[int]) -> None:
        """Aborted requests: no last token will come for them."""
        self._streaming.difference_update(rids)

    def take(self) -> StepOutput | None:
        """The held outputs, now due, or None if none are held."""
        out = self.held
        if not (out.tokens or out.accepted or out.rejected):
            return None
        self.held, self._last = StepOutput(), self.clock()
        return out


class SchedulerLoop:
    def __init__(
        self, scheduler: Scheduler, inbox: zmq.Socket, outbox: zmq.Socket, parent_pid: int, stream_interval_s: float
    ) -> None:
        self.scheduler, self.inbox, self.outbox, self.parent_pid = scheduler, inbox, outbox, parent_pid
        self.pacer = StreamPacer(stream_interval_s)
        self.decoder = msgspec.msgpack.Decoder(ToScheduler)
        self.encoder = msgspec.msgpack.Encoder()
        self._stats_due = True
        self._last_stats = 0.0
        # Submitted requests whose grammar compiles: answered (accepted or rejected) once it is done,
        # so that a grammar that does not compile is still a 400, before any stream starts.
        self._unanswered: dict[int, Req] = {}
        # Namespaces are shown by a keyed hash of their cache_salt: stable while this process
        # lives, and no use for guessing a short salt offline.
        self._label_key = secrets.token_bytes(16)

    def run(self) -> None:
        # The parent's death re-parents us (getppid changes); checked every iteration, at worst once per step.
        while os.getppid() == self.parent_pid:
            answers = StepOutput()
            self._drain(answers, block=not self.scheduler.has_work)
            if answers.accepted or answers.rejected:
                # Answered before the forward pass, which can be long: a 400 or a stream start waits for this.
                self.outbox.send(self.encoder.encode(answers))
            if self.scheduler.has_work:
                if self.pacer.held.tokens and self._prefill_next():
                    self._send_held()  # held tokens would otherwise wait for a whole prefill pass
                if self.pacer.add(self._step()) or not self.scheduler.has_work:
                    self._send_held()
            self._maybe_send_stats()
        logger.warning("parent process %d is gone; scheduler exits", self.parent_pid)

    def _prefill_next(self) -> bool:
        """Whether the next step may prefill: a request waits, or a running one has prompt left."""
        return bool(self.scheduler.waiting) or any(r.is_prefilling for r in self.scheduler.running)

    def _send_held(self) -> None:
        out = self.pacer.take()
        if out is not None:
            self.outbox.send(self.encoder.encode(out))

    def _drain(self, out: StepOutput, block: bool) -> None:
        timeout = IDLE_POLL_MS if block else 0
        while self.inbox.poll(timeout):
            self._handle(self.decoder.decode(self.inbox.recv()), out)
            timeout = 0

    def _handle(self, msg: Submit | Abort | Control | CacheQuery, out: StepOutput) -> None:
        if isinstance(msg, Submit):
            try:
                req = self.scheduler.make_request(msg.rid, msg.input_ids, msg.params, msg.namespace)
            except RequestRejected as e:
                out.rejected.append(Rejection(msg.rid, e.message, e.code, e.param))
                return
            self.scheduler.add(req)
            if req.pending_grammar is None:
                out.accepted.append(msg.rid)
            else:
                self._unanswered[msg.rid] = req
        elif isinstance(msg, Abort):
            for rid in msg.rids:
                # Unknown rids are normal: the request may have finished while the abort was in flight.
                self._unanswered.pop(rid, None)
                self.scheduler.abort(rid)
            self.pacer.forget(msg.rids)
        elif isinstance(msg, CacheQuery):
            self.outbox.send(self.encoder.encode(self._cache_report(msg)))
        else:
            self.outbox.send(self.encoder.encode(self._control(msg)))
        self._stats_due = True

    def _step(self) -> StepOutput:
        """One step's tokens, and the answers to the submissions whose grammar compiled meanwhile."""
        out = StepOutput()
        for o in self.scheduler.step():
            if o.finish_reason != "rejected":
                out.tokens.append(
                    Token(o.rid, o.token_id, o.finish_reason, o.cached_tokens, o.error, o.logprob, o.prompt_logprobs)
                )
                continue
            rejected = self._unanswered.pop(o.rid, None)
            if rejected is not None and rejected.rejection is not None:  # its grammar did not compile
                e = rejected.rejection
                out.rejected.append(Rejection(o.rid, e.message, e.code, e.param))
        for rid, req in list(self._unanswered.items()):
            if req.pending_grammar is None:  # compiled: it waits for admission like any request now
                del self._unanswered[rid]
                out.accepted.append(rid)
        self._stats_due = True
        return out

    def _control(self, msg: Control) -> ControlReply:
        if msg.op is ControlOp.FLUSH_CACHE:
            try:
                self.scheduler.flush_cache()
            except RuntimeError as e:
                return ControlReply(msg.call_id, False, str(e))
            return ControlReply(msg.call_id, True, "cache flushed")
        assert msg.op is ControlOp.DEBUG_KV, msg.op
        usage = {
            **self.scheduler.kv_usage(),
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.queued),
            "scheduler_pid": os.getpid(),
        }
        try:
            self.scheduler.check_accounting()
        except AssertionError as e:
            return ControlReply(msg.call_id, False, f"KV accounting is broken: {e}", usage)
        return ControlReply(msg.call_id, True, "KV accounting balanced", usage)

    def _cache_report(self, msg: CacheQuery) -> CacheReport:
        """Read-only: the tree is walked without a lookup, so nothing is split or refreshed."""
        shown = {None, msg.cache_salt}  # the shared namespace, and the caller's own
        cache = self.scheduler.cache_manager.cache
        tree = cache.snapshot(msg.max_nodes, msg.head_tokens, self._namespace_label, shown)
        requests = [
            self._request_view(req, "prefill" if req.is_prefilling else "decode") for req in self.scheduler.running
        ]
        requests += [self._request_view(req, "waiting") for req in self.scheduler.queued]
        return CacheReport(msg.call_id, tree, requests, self.scheduler.snapshot())

    def _request_view(self, req: Req, state: RequestState) -> RequestView:
        generated = req.seq_len - req.prompt_len
        namespace = self._namespace_label(req.namespace)
        return RequestView(
            req.rid, state, namespace, req.prompt_len, req.cached_prompt_tokens, generated, req.params.max_tokens
        )

    def _namespace_label(self, namespace: str | None) -> str:
        if namespace is None:
            return "shared"
        digest = hmac.new(self._label_key, namespace.encode(), hashlib.sha256).hexdigest()
        return f"salt {digest[:12]}"

    def _maybe_send_stats(self) -> None:
        now = time.monotonic()
        if not self._stats_due or (self.scheduler.has_work and now - self._last_stats < STATS_INTERVAL_S):
            return
        self.outbox.send(self.encoder.encode(self.scheduler.snapshot()))
        self._stats_due, self._last_stats = False, now


def run_scheduler(
    config: EngineConfig, inbox_addr: str, outbox_addr: str, parent_pid: int, log_level: int, stream_interval_s: float
) -> None:
    """Entry point of the spawned process. The engine is imported here, not with this module: the
    front end imports this module for the process's target and stays torch-free."""
    from minisgl.scheduler.scheduler import Scheduler

    # Ctrl-C reaches the whole process group; the front end decides when we stop (it terminates us).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s: %(message)s")
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.connect(inbox_addr)
    outbox = ctx.socket(zmq.PUSH)
    # Unbounded queue: a send must never block the loop, or it could miss its parent's death.
    outbox.setsockopt(zmq.SNDHWM, 0)
    outbox.setsockopt(zmq.LINGER, 0)
    outbox.connect(outbox_addr)
    scheduler = Scheduler.from_config(config)
    scheduler.grammars.prepare()  # once, now: the first grammar then holds up nobody
    engine = scheduler.engine
    ready = Ready(
        os.getpid(), engine.max_seq_len, scheduler.vocab_size, scheduler.cache_manager.capacity, engine.page_size
    )
    outbox.send(msgspec.msgpack.encode(ready))
    try:
        SchedulerLoop(scheduler, inbox, outbox, parent_pid, stream_interval_s).run()
    finally:
        ctx.destroy(linger=0)
