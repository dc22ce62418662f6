"""Start the rank processes of this node and watch them.

Failure handling (nothing may hang): rank 0 checks its children's exit codes before and after every
step; a peer that dies mid-collective closes its sockets, so gloo raises at once and the error is
turned into ``RuntimeError("tensor-parallel rank N died (exit code X)")``; a watchdog thread exits
the process if a step is still stuck well after a child died (NCCL, which may not notice); a peer
alive but stuck is bounded by the collective timeout. Children exit when their parent is gone.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TypeVar

import torch.multiprocessing as mp

from minisgl.config import EngineConfig
from minisgl.parallel.rendezvous import leave_group
from minisgl.parallel.worker import run_worker

logger = logging.getLogger("minisgl.parallel")
T = TypeVar("T")

# After a child died, a step still in flight this much later is considered stuck.
STUCK_AFTER_DEATH_S = 15.0
POLL_S = 0.1


class RankDied(RuntimeError):
    def __init__(self, rank: int, exitcode: int) -> None:
        super().__init__(f"tensor-parallel rank {rank} died (exit code {exitcode})")
        self.rank, self.exitcode = rank, exitcode


class RankSupervisor:
    """The other ranks of this node, spawned by its first rank (global rank 0 on node 0)."""

    def __init__(self, processes: dict[int, BaseProcess]) -> None:
        self.processes = processes
        self.failure: str | None = None  # set once the group is broken: every later step raises it
        self._busy_since: float | None = None
        self._closed = threading.Event()
        threading.Thread(target=self._watchdog, name="minisgl-tp-watchdog", daemon=True).start()

    @classmethod
    def spawn(cls, config: EngineConfig, model_path: Path) -> RankSupervisor:
        if multiprocessing.current_process().daemon:
            raise RuntimeError(
                "tensor parallelism starts rank processes, which a daemonic process cannot do: "
                "run the engine in a non-daemonic process"
            )
        ctx = mp.get_context("spawn")
        level = logging.getLogger("minisgl").getEffectiveLevel()
        first = config.node_rank * config.tp_per_node
        processes: dict[int, BaseProcess] = {}
        for rank in range(first + 1, first + config.tp_per_node):
            p = ctx.Process(
                target=run_worker,
                args=(rank, config, str(model_path), os.getpid(), level),
                name=f"minisgl-tp-rank{rank}",
                daemon=True,  # terminated if this process exits without shutting down
            )
            p.start()
            processes[rank] = p
        return cls(processes)

    @property
    def pids(self) -> dict[int, int]:
        return {rank: p.pid for rank, p in self.processes.items() if p.pid is not None}

    # -- liveness --------------------------------------------------------------------------------
    def dead_rank(self) -> RankDied | None:
        for rank, p in self.processes.items():
            if p.exitcode is not None:
                return RankDied(rank, p.exitcode)
        return None

    def check_alive(self) -> None:
        if self.failure is not None:
            raise RuntimeError(self.failure)
        died = self.dead_rank()
        if died is not None:
            self.fail(died)
            raise died

    def run_watched(self, fn: Callable[[], T]) -> T:
        """Run a blocking call (the rendezvous) in a thread while watching the children: a child
        that dies first makes this raise instead of waiting for the call's timeout."""
        result: list[T] = []
        error: list[BaseException] = []

        def target() -> None:
            try:
                result.append(fn())
            except BaseException as e:  # noqa: BLE001 (handed to the caller)
                error.append(e)

        thread = threading.Thread(target=target, name="minisgl-tp-rendezvous", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(POLL_S)
            died = self.dead_rank()
            if died is not None and thread.is_alive():
                self.fail(died)
                raise died
        if error:
            raise error[0]
        return result[0]

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Around every step that involves collectives: liveness before and after; any error
        inside breaks the group (the ranks are out of step), tears it down and is reported with
        the rank that died, if one did."""
        self.check_alive()
        self._busy_since = time.monotonic()
        try:
            yield
        except BaseException as e:
            reported = self.fail(e)
            if reported is e:
                raise
            raise reported from e
        finally:
            self._busy_since = None
        self.check_alive()

    def fail(self, error: BaseException) -> BaseException:
        """Tear the group down after ``error``; returns the exception to raise in its place."""
        if self.failure is not None:
            return RuntimeError(self.failure) if isinstance(error, RuntimeError) else error
        died = error if isinstance(error, RankDied) else self._wait_for_death(2.0)
        reported: BaseException
        if died is not None:
            reported = died
            self.failure = str(died)
        elif isinstance(error, RuntimeError):
            reported = RuntimeError(f"tensor-parallel group failed: {error}")
            self.failure = str(reported)
        else:
            reported = error
            self.failure = f"tensor-parallel group stopped after {type(error).__name__}: {error}"
        logger.error("%s; stopping the other ranks", self.failure)
        self.stop(timeout=0)
        leave_group()
        return reported

    def _wait_for_death(self, timeout: float) -> RankDied | None:
        """A collective failed: usually because a peer just died; give its exit a moment to land."""
        deadline = time.monotonic() + timeout
        while True:
            died = self.dead_rank()
            if died is not None or time.monotonic() > deadline:
                return died
            time.sleep(0.05)

    def _watchdog(self) -> None:
        death_seen: float | None = None
        while not self._closed.wait(0.5):
            if self.dead_rank() is None:
                continue
            death_seen = death_seen or time.monotonic()
            busy = self._busy_since
            if busy is not None and time.monotonic() - max(busy, death_seen) > STUCK_AFTER_DEATH_S:
                sys.stderr.write(f"minisgl: {self.dead_rank()} and rank 0 is stuck in a collective; exiting\n")
                sys.stderr.flush()
                os._exit(1)

    # -- shutdown --------------------------------------------------------------------------------
    def stop(self, timeout: float = 10.0) -> None:
        """Wait for the children to exit (after a shutdown message), then make them."""
        self._closed.set()
        deadline = time.monotonic() + timeout
        for p in self.processes.values():
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.processes.values():
            if p.exitcode is None:
                p.terminate()
                p.join(2.0)
            if p.exitcode is None:
                p.kill()
                p.join(2.0)

