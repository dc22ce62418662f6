"""Tensor parallelism around the engine: ``TensorParallelRunner`` owns spawning the node's other
ranks, the per-step broadcast and their liveness, so the ``Engine`` it drives is the same plain
object every rank holds.

Failure handling (nothing may hang) is the supervisor's: every step runs under its guard, and a
broken group stays failed (every later step raises the same error)."""

from __future__ import annotations

import atexit
import logging
import weakref
from dataclasses import replace
from pathlib import Path

import torch

from minisgl.batch import Batch
from minisgl.config import EngineConfig
from minisgl.distributed.group import TPGroup
from minisgl.engine.engine import Engine
from minisgl.models.source import resolve_model_path
from minisgl.parallel.rendezvous import init_group, leave_group, local_init_method
from minisgl.parallel.supervisor import RankSupervisor
from minisgl.parallel.sync import REPORT_FIELDS, BatchSync
from minisgl.sampler import Sampled

logger = logging.getLogger("minisgl.parallel")


class TensorParallelRunner:
    """The first rank of a node (global rank 0 on node 0, which schedules): it spawns the node's
    other ranks, joins the group with them, and on rank 0 broadcasts every batch before running it."""

    def __init__(self, config: EngineConfig, model_path: Path, rank: int = 0) -> None:
        if rank == 0 and config.node_rank != 0:
            raise ValueError("node_rank > 0 runs rank processes only: start it with the CLI (--node-rank)")
        if config.torch_device.type == "cuda" and torch.cuda.device_count() < config.tp_per_node:
            raise ValueError(
                f"tensor parallelism on CUDA needs one GPU per rank: {config.tp_per_node} ranks on this node, "
                f"{torch.cuda.device_count()} GPUs visible"
            )
        self._threads = torch.get_num_threads()  # the engine shares the cores out among the ranks
        self.sync: BatchSync | None = None
        self.supervisor, self.tp = _spawn_and_join(config, model_path, rank)
        atexit.register(_shutdown_at_exit, weakref.ref(self))
        try:
            self.engine = Engine(config, model_path, self.tp)
            self.sync = BatchSync(self.tp, self.engine)
            with self.supervisor.guard():
                self.sync.ready()
        except BaseException:
            self.shutdown()
            raise

    def forward(self, batch: Batch) -> Sampled:
        sync = self._sync()
        with self.supervisor.guard():
            sync.send_batch(batch)
            logits = self.engine.run_model(batch)
        return self.engine.sample(batch, logits)

    def check_ranks(self) -> list[dict[str, int]]:
        """Every rank's report (rank 0 first): KV heads it holds, pool slots, distinct slots
        written and their checksum, steps and tokens run. Raises ``AssertionError`` if the ranks'
        pools diverged (they must have run the same batches into the same slots)."""
        sync = self._sync()
        with self.supervisor.guard():
            reports = sync.check()
        keys = [k for k in REPORT_FIELDS if k != "kv_heads"]  # a rank's KV heads may differ
        for rank, report in enumerate(reports):
            assert all(report[k] == reports[0][k] for k in keys), f"rank {rank} diverged from rank 0: {reports}"
        return reports

    def serve(self) -> None:
        """The first rank of a node other than node 0: run rank 0's batches until it stops the group."""
        self._sync().serve()

    def shutdown(self) -> None:
        """Stop the other ranks and leave the group (rank 0 tells them to stop first). Safe to call twice."""
        sup = self.supervisor
        if self.tp.rank == 0 and sup.failure is None and self.sync is not None and self.sync.is_ready:
            try:
                sup.check_alive()
                self.sync.send_shutdown(timeout_s=10)
            except RuntimeError as e:
                logger.warning("shutting down a broken tensor-parallel group: %s", e)
        if sup.failure is None:
            sup.failure = "the tensor-parallel engine is shut down"
        sup.stop()
        leave_group()
        torch.set_num_threads(self._threads)

    def _sync(self) -> BatchSync:
        assert self.sync is not None, "the tensor-parallel group is not ready"
        return self.sync


def _spawn_and_join(config: EngineConfig, model_path: Path, rank: int) -> tuple[RankSupervisor, TPGroup]:
    """Spawn this node's other ranks, then join the group with them (watching them meanwhile: a
    rank that dies first makes this raise). On a single node the rendezvous is a free local port."""
    if config.dist_init_addr is None:
        config = replace(config, dist_init_addr=local_init_method().removeprefix("tcp://"))
    supervisor = RankSupervisor.spawn(config, model_path)
    try:
        tp = supervisor.run_watched(lambda: init_group(config, rank, f"tcp://{config.dist_init_addr}"))
    except BaseException:
        supervisor.stop(timeout=0)
        raise
    return supervisor, tp


def _shutdown_at_exit(ref: weakref.ref[TensorParallelRunner]) -> None:
    """A runner never shut down still stops its ranks and leaves the group before the interpreter
    exits (a live gloo group at exit aborts the process)."""
    runner = ref()
    if runner is not None:
        runner.shutdown()


def run_node(config: EngineConfig) -> None:
    """A node other than node 0 (``--node-rank`` > 0): its ranks only, no scheduler, no front end.
    The process runs the node's first rank itself and spawns the others."""
    rank = config.node_rank * config.tp_per_node
    runner = TensorParallelRunner(config, resolve_model_path(config.model), rank)
    logger.info("node %d: ranks %d..%d serving", config.node_rank, rank, rank + config.tp_per_node - 1)
    try:
        runner.serve()
    finally:
        runner.shutdown()
