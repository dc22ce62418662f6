"""The scheduler process: owns the model and the KV pool, runs forward passes, speaks only token ids.

Loop: drain incoming messages (block while idle), run one ``step`` if there is work, send that
step's tokens as one message, push stats now and then. It exits when its parent disappears, so
a killed front end never leaves an orphan holding the model's memory.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import msgspec
import zmq

from minisgl.config import EngineConfig
from minisgl.request import Req
from minisgl.scheduler.scheduler import Scheduler
from minisgl.server.protocol import (
    Abort,
    Control,
    ControlReply,
    Ready,
    Rejection,
    StepOutput,
    Submit,
    Token,
    ToScheduler,
)

logger = logging.getLogger("minisgl.server.scheduler")

# While idle the loop wakes this often to notice a dead parent.
IDLE_POLL_MS = 500
# Stats are pushed at most this often while busy (and once more when the work runs out).
STATS_INTERVAL_S = 0.5


class SchedulerLoop:
    def __init__(self, scheduler: Scheduler, inbox: zmq.Socket, outbox: zmq.Socket, parent_pid: int) -> None:
        self.scheduler, self.inbox, self.outbox, self.parent_pid = scheduler, inbox, outbox, parent_pid
        self.reqs: dict[int, Req] = {}  # unfinished requests, for the cached-token count of each output
        self.decoder = msgspec.msgpack.Decoder(ToScheduler)
        self.encoder = msgspec.msgpack.Encoder()
        self._stats_due = True
        self._last_stats = 0.0

    def run(self) -> None:
        # The parent's death re-parents us (getppid changes); checked every iteration, at worst once per step.
        while os.getppid() == self.parent_pid:
            answers = StepOutput()
            self._drain(answers, block=not self.scheduler.has_work)
            if answers.accepted or answers.rejected:
                # Answered before the forward pass, which can be long: a 400 or a stream start waits for this.
                self.outbox.send(self.encoder.encode(answers))
            if self.scheduler.has_work:
                tokens = self._step()
                if tokens:
                    self.outbox.send(self.encoder.encode(StepOutput(tokens=tokens)))
            self._maybe_send_stats()
        logger.warning("parent process %d is gone; scheduler exits", self.parent_pid)

    def _drain(self, out: StepOutput, block: bool) -> None:
        timeout = IDLE_POLL_MS if block else 0
        while self.inbox.poll(timeout):
            self._handle(self.decoder.decode(self.inbox.recv()), out)
            timeout = 0

    def _handle(self, msg: Submit | Abort | Control, out: StepOutput) -> None:
        if isinstance(msg, Submit):
            try:
                req = self.scheduler.make_request(msg.rid, msg.input_ids, msg.params, msg.namespace)
            except ValueError as e:
                out.rejected.append(Rejection(msg.rid, str(e)))
                return
            self.scheduler.add(req)
            self.reqs[msg.rid] = req
            out.accepted.append(msg.rid)
        elif isinstance(msg, Abort):
            for rid in msg.rids:
                # Unknown rids are normal: the request may have finished while the abort was in flight.
                if self.reqs.pop(rid, None) is not None:
                    self.scheduler.abort(rid)
        else:
            self.outbox.send(self.encoder.encode(self._control(msg)))
        self._stats_due = True

    def _step(self) -> list[Token]:
        tokens = []
        for o in self.scheduler.step():
            req = self.reqs[o.rid]
            tokens.append(Token(o.rid, o.token_id, o.finish_reason, req.cached_prompt_tokens, o.error))
            if o.finish_reason is not None:
                del self.reqs[o.rid]
        self._stats_due = True
        return tokens

    def _control(self, msg: Control) -> ControlReply:
        if msg.op == "flush_cache":
            try:
                self.scheduler.flush_cache()
            except RuntimeError as e:
                return ControlReply(msg.call_id, False, str(e))
            return ControlReply(msg.call_id, True, "cache flushed")
        if msg.op == "debug_kv":
            usage = {
                **self.scheduler.kv_usage(),
                "running": len(self.scheduler.running),
                "waiting": len(self.scheduler.waiting),
                "scheduler_pid": os.getpid(),
            }
            try:
                self.scheduler.check_accounting()
            except AssertionError as e:
                return ControlReply(msg.call_id, False, f"KV accounting is broken: {e}", usage)
            return ControlReply(msg.call_id, True, "KV accounting balanced", usage)
        return ControlReply(msg.call_id, False, f"unknown control op {msg.op!r}")

    def _maybe_send_stats(self) -> None:
        now = time.monotonic()
        if not self._stats_due or (self.scheduler.has_work and now - self._last_stats < STATS_INTERVAL_S):
            return
        self.outbox.send(self.encoder.encode(self.scheduler.snapshot()))
        self._stats_due, self._last_stats = False, now


def run_scheduler(config: EngineConfig, inbox_addr: str, outbox_addr: str, parent_pid: int, log_level: int) -> None:
    """Entry point of the spawned process."""
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
    engine = scheduler.engine
    ready = Ready(
        os.getpid(), engine.max_seq_len, scheduler.vocab_size, scheduler.cache_manager.capacity, engine.page_size
    )
    outbox.send(msgspec.msgpack.encode(ready))
    try:
        SchedulerLoop(scheduler, inbox, outbox, parent_pid).run()
    finally:
        ctx.destroy(linger=0)
