"""The engine runs one batch: model, KV pool, page table, attention backend and sampler."""

from __future__ import annotations

import atexit
import logging
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from minisgl.attention.base import create_backend
from minisgl.config import EngineConfig
from minisgl.distributed.sharding import max_kv_heads
from minisgl.engine.batch import Batch
from minisgl.kvcache.pool import KVPool
from minisgl.kvcache.table import TableManager
from minisgl.models.config import ModelConfig
from minisgl.models.decoder import local_heads
from minisgl.models.loader import load_model
from minisgl.sampling import Sampler

if TYPE_CHECKING:
    from minisgl.distributed.group import TPGroup
    from minisgl.distributed.supervisor import RankSupervisor
    from minisgl.distributed.sync import BatchSync

logger = logging.getLogger("minisgl.engine")


class Engine:
    """With ``config.tp_size`` > 1 this is one rank of a tensor-parallel group holding its shard of
    the model and of the KV heads; rank 0 (the default) starts the others and broadcasts each batch."""

    def __init__(self, config: EngineConfig, model_path: Path, rank: int = 0) -> None:
        self.tp: TPGroup | None = None
        self.supervisor: RankSupervisor | None = None  # the node's other ranks, on its first rank
        self.sync: BatchSync | None = None
        self._threads = torch.get_num_threads()
        if config.tp_size == 1:
            self._build(config, model_path)
            return
        from minisgl.distributed.supervisor import connect
        from minisgl.distributed.sync import BatchSync

        self.tp, self.supervisor = connect(config, model_path, rank)
        atexit.register(_shutdown_at_exit, weakref.ref(self))
        try:
            self._build(config, model_path)
            self.sync = BatchSync(self.tp, self.table.page_table, self.pool.num_slots, self.pool.k.shape[2])
            if self.supervisor is not None:
                with self.supervisor.guard():
                    self.sync.ready()
            else:
                self.sync.ready()
        except BaseException:
            self.shutdown()
            raise

    def _build(self, config: EngineConfig, model_path: Path) -> None:
        tp = self.tp
        self.device = tp.device if tp is not None else config.torch_device
        if self.device.type == "cpu":  # the cores are shared by this node's ranks
            torch.set_num_threads(config.num_threads or max(1, torch.get_num_threads() // config.tp_per_node))
        cfg = ModelConfig.from_folder(model_path)
        self.model_config = cfg
        self.max_seq_len = min(cfg.max_position_embeddings, config.max_seq_len_override or cfg.max_position_embeddings)
        self.model = load_model(model_path, config.torch_dtype, self.device, self.max_seq_len, tp)
        self.page_size = config.page_size
        heads = local_heads(cfg, tp)
        # Every rank sizes its pool for the largest KV shard, so that all ranks have the same pages.
        budget_heads = cfg.num_kv_heads if tp is None else max_kv_heads(cfg.num_heads, cfg.num_kv_heads, tp.size)
        bytes_per_token = KVPool.bytes_per_token(cfg.num_layers, budget_heads, cfg.head_dim, config.torch_dtype)
        num_pages = config.num_page_override or int(config.kv_memory_gb * 2**30) // (bytes_per_token * config.page_size)
        if num_pages < 1:
            raise ValueError(f"KV memory budget of {config.kv_memory_gb} GiB holds no page")
        self.pool = KVPool(
            cfg.num_layers, num_pages, config.page_size, heads.num_kv, cfg.head_dim, config.torch_dtype, self.device
        )
        self.table = TableManager(config.max_running_req, self.max_seq_len, self.device)
        self.attention = create_backend(
            config.attention_backend, self.pool, self.table.page_table, heads.num_q, heads.num_kv, cfg.head_dim
        )
        self.sampler = Sampler(config.seed)
        logger.info(
            "KV pool: %d pages x %d tokens = %d tokens (%.1f MiB, %s) on %s; context %d",
            num_pages, config.page_size, self.pool.num_slots, self.pool.num_slots * bytes_per_token / 2**20,
            config.dtype, self.device, self.max_seq_len,
        )  # fmt: skip

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Run the batch; returns the next token of each of ``batch.sampling_reqs`` (CPU int64).
        With tensor parallelism (rank 0 only) the batch is first broadcast so every rank runs it."""
        if self.tp is None:
            logits = self.run_model(batch)
        else:
            assert self.supervisor is not None and self.sync is not None, "only rank 0 schedules batches"
            with self.supervisor.guard():
                self.sync.send_batch(batch)
                logits = self.run_model(batch)
        reqs = batch.sampling_reqs
        return self.sampler.sample(logits, [r.params for r in reqs], [r.generator for r in reqs])

    def run_model(self, batch: Batch) -> torch.Tensor:
        """The model on this rank's shard (under inference mode); full logits on rank 0 only."""
        ctx = self.attention.prepare(batch)
        return self.model(batch.input_ids, batch.positions, ctx, batch.logit_rows)

    def check_ranks(self) -> list[dict[str, int]]:
        """Tensor parallelism: every rank's report (rank 0 first): KV heads it holds, pool slots,
        distinct slots written and their checksum, steps and tokens run. Raises ``AssertionError``
        if the ranks' pools diverged (they must have run the same batches into the same slots).
        Empty without tensor parallelism."""
        if self.tp is None:
            return []
        from minisgl.distributed.sync import REPORT_FIELDS

        assert self.supervisor is not None and self.sync is not None, "only rank 0 checks the ranks"
        with self.supervisor.guard():
            reports = self.sync.check()
        keys = [k for k in REPORT_FIELDS if k != "kv_heads"]  # a rank's KV heads may differ
        for rank, report in enumerate(reports):
            assert all(report[k] == reports[0][k] for k in keys), f"rank {rank} diverged from rank 0: {reports}"
        return reports

    def shutdown(self) -> None:
        """Stop the other ranks and leave the group (rank 0: tells them to stop first). No-op
        without tensor parallelism; safe to call twice."""
        if self.tp is None:
            return
        from minisgl.distributed.group import leave_group

        sup = self.supervisor
        if sup is not None:
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


def _shutdown_at_exit(ref: weakref.ref[Engine]) -> None:
    """An engine never shut down still stops its ranks and leaves the group before the interpreter
    exits (a live gloo group at exit aborts the process)."""
    engine = ref()
    if engine is not None:
        engine.shutdown()
