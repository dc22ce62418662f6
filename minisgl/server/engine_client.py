"""The front end's handle on the scheduler process: start it, send it requests, route its outputs.

Outputs are routed to per-HTTP-request ``asyncio.Queue``s as ``(index, event)`` pairs. Sending is
synchronous and never blocks (unbounded ZeroMQ queue), so aborts can be sent from code that is
being cancelled (a client that disconnects cancels its response task). Receiving is a reader on the
socket's descriptor that takes every queued message in one callback, the scheduler process's start-up
included; the process's sentinel is another reader, so a death while loading ends ``start`` at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path

import msgspec
import zmq

from minisgl.config import EngineConfig
from minisgl.sampling import SamplingParams
from minisgl.scheduler.stats import StatsSnapshot
from minisgl.server.ipc_dir import create_ipc_dir
from minisgl.server.protocol import (
    Abort,
    CacheQuery,
    CacheReport,
    Control,
    ControlOp,
    ControlReply,
    FromScheduler,
    Ready,
    Rejection,
    StepOutput,
    Submit,
    Token,
)
from minisgl.server.scheduler_process import run_scheduler

logger = logging.getLogger("minisgl.server")


class EngineDead(RuntimeError):
    """The scheduler process is gone; nothing more will come from it."""


@dataclass(frozen=True)
class Accepted:
    rid: int


Event = Accepted | Rejection | Token | EngineDead


class EngineClient:
    def __init__(
        self,
        config: EngineConfig,
        on_death: Callable[[], None],
        stream_interval_s: float,
        log_level: int = logging.INFO,
    ) -> None:
        """``stream_interval_s``: how long the scheduler process holds decode tokens to send them
        together (``StreamPacer``)."""
        self.config, self.on_death, self.log_level = config, on_death, log_level
        self.stream_interval_s = stream_interval_s
        self.ready: Ready | None = None
        self.stats = StatsSnapshot()
        self.dead = False
        self._rids = itertools.count()
        self._call_ids = itertools.count()
        self._routes: dict[int, tuple[asyncio.Queue[tuple[int, Event]], int]] = {}
        self._calls: dict[int, asyncio.Future[ControlReply | CacheReport]] = {}
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(FromScheduler)
        self._closing = False
        self._released = False  # sockets and ipc directory gone (``_release``)
        self.process: BaseProcess | None = None  # set by spawn()
        self._ready: asyncio.Future[Ready] | None = None  # set by start(), resolved by the Ready message
        self._dir: Path | None = None  # the ipc sockets' directory, made by spawn()
        self._sync_ctx = zmq.Context()
        self._out = self._sync_ctx.socket(zmq.PUSH)
        self._out.setsockopt(zmq.SNDHWM, 0)  # unbounded: a send never blocks the event loop
        self._in = self._sync_ctx.socket(zmq.PULL)
        self._in_fd: int = self._in.getsockopt(zmq.FD)

    # -- lifecycle -----------------------------------------------------------------------------
    def spawn(self) -> None:
        """Bind the sockets and start the scheduler process, which loads the model meanwhile: the
        front end's own start-up (its imports, the tokenizer) overlaps that. ``start`` waits for it.

        The ipc directory is made here, not earlier, so that whatever fails after it is made runs
        ``abandon`` or ``close``, which remove it."""
        self._dir = create_ipc_dir()
        try:
            to_addr, from_addr = f"ipc://{self._dir}/to_scheduler", f"ipc://{self._dir}/from_scheduler"
            self._out.bind(to_addr)  # bound before the scheduler starts: it connects to them
            self._in.bind(from_addr)
            # spawn: a fresh interpreter, no forked event-loop state. Not a daemon, because it starts
            # the tensor-parallel ranks; it exits by itself when this process goes away.
            process = mp.get_context("spawn").Process(
                target=run_scheduler,
                args=(self.config, to_addr, from_addr, os.getpid(), self.log_level, self.stream_interval_s),
                name="minisgl-scheduler",
                daemon=False,
            )
            process.start()
            self.process = process  # started: abandon() and close() may now wait for it
        except BaseException:
            self.abandon()
            raise

    async def start(self) -> Ready:
        """Wait until the scheduler process (``spawn``) has loaded its model; its outputs are routed
        from then on."""
        assert self.process is not None, "spawn() first"
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        loop.add_reader(self._in_fd, self._on_readable)
        loop.add_reader(self.process.sentinel, self._on_process_exit)
        self._on_readable()  # a message queued before the reader was added does not signal it again
        try:
            self.ready = await self._ready
        except BaseException:
            await self.close()
            raise
        return self.ready

    async def close(self) -> None:
        """Stop the scheduler process and release the sockets; safe to call more than once."""
        self._closing = True
        loop = asyncio.get_running_loop()
        if not self._released:
            loop.remove_reader(self._in_fd)
        if self.process is not None:
            loop.remove_reader(self.process.sentinel)
            await asyncio.to_thread(self._stop_process)
        self._release()

    def abandon(self) -> None:
        """``close`` without an event loop: for a start-up that failed (or ended) before or outside
        the server's loop. Blocks while the scheduler process stops; safe to call more than once."""
        self._closing = True
        if self.process is not None:
            self._stop_process()
        self._release()

    def _stop_process(self) -> None:
        assert self.process is not None
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        self._sync_ctx.destroy(linger=0)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _on_process_exit(self) -> None:
        assert self.process is not None
        asyncio.get_running_loop().remove_reader(self.process.sentinel)
        if self._closing:
            return
        self.process.join(1)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(
                RuntimeError(f"the scheduler process exited with code {self.process.exitcode} while starting")
            )
            return
        logger.error("the scheduler process died (exit code %s); failing all requests", self.process.exitcode)
        self.dead = True
        for queue, index in self._routes.values():
            queue.put_nowait((index, EngineDead("the engine process died")))
        self._routes.clear()
        for future in self._calls.values():
            if not future.done():
                future.set_exception(EngineDead("the engine process died"))
        self._calls.clear()
        self.on_death()

    # -- requests ------------------------------------------------------------------------------
    def new_rid(self) -> int:
        return next(self._rids)

    def submit(
        self,
        rid: int,
        input_ids: list[int],
        params: SamplingParams,
        namespace: str | None,
        queue: asyncio.Queue[tuple[int, Event]],
        index: int,
    ) -> None:
        """Queue a request; its events arrive on ``queue`` tagged with ``index``."""
        if self.dead:
            raise EngineDead("the engine process is not running")
        self._routes[rid] = (queue, index)
        self._send(Submit(rid, input_ids, params, namespace))

    def abort(self, rids: list[int]) -> None:
        """Forget requests and tell the scheduler to free them. Safe to call from cancelled code."""
        live = [rid for rid in rids if self._routes.pop(rid, None) is not None]
        if live and not self.dead:
            self._send(Abort(live))

    async def control(self, op: ControlOp) -> ControlReply:
        reply = await self._call(Control(next(self._call_ids), op))
        assert isinstance(reply, ControlReply)
        return reply

    async def cache_report(self, max_nodes: int, head_tokens: int, cache_salt: str | None) -> CacheReport:
        """The scheduler's read-only picture of the prefix cache and the queues (the debug page's data)."""
        reply = await self._call(CacheQuery(next(self._call_ids), max_nodes, head_tokens, cache_salt))
        assert isinstance(reply, CacheReport)
        return reply

    async def _call(self, msg: Control | CacheQuery) -> ControlReply | CacheReport:
        """Send ``msg`` and wait for the reply that carries its ``call_id``."""
        if self.dead:
            raise EngineDead("the engine process is not running")
        future: asyncio.Future[ControlReply | CacheReport] = asyncio.get_running_loop().create_future()
        self._calls[msg.call_id] = future
        self._send(msg)
        return await future

    def _send(self, msg: Submit | Abort | Control | CacheQuery) -> None:
        self._out.send(self._encoder.encode(msg), copy=False)

    # -- routing -------------------------------------------------------------------------------
    def _on_readable(self) -> None:
        # The descriptor only says that the socket's state may have changed, and reading EVENTS
        # re-arms it: take messages until EVENTS says none is left, or a later one could wait unseen.
        while self._in.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._dispatch(self._decoder.decode(self._in.recv()))

    def _dispatch(self, msg: FromScheduler) -> None:
        if isinstance(msg, StepOutput):
            self._route(msg)
        elif isinstance(msg, StatsSnapshot):
            self.stats = msg
        elif isinstance(msg, (ControlReply, CacheReport)):
            future = self._calls.pop(msg.call_id, None)
            if future is not None and not future.done():
                future.set_result(msg)
        elif isinstance(msg, Ready) and self._ready is not None and not self._ready.done():
            self._ready.set_result(msg)

    def _route(self, out: StepOutput) -> None:
        # Events for rids no longer routed belong to aborted requests and are dropped.
        for rid in out.accepted:
            if rid in self._routes:
                queue, index = self._routes[rid]
                queue.put_nowait((index, Accepted(rid)))
        for rejection in out.rejected:
            if rejection.rid in self._routes:
                queue, index = self._routes.pop(rejection.rid)
                queue.put_nowait((index, rejection))
        for token in out.tokens:
            route = self._routes.get(token.rid)
            if route is not None:
                route[0].put_nowait((route[1], token))
                if token.finish_reason is not None:
                    del self._routes[token.rid]
