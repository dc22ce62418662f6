"""The engine runs one batch: model, KV pool, page table, attention backend and sampler."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from minisgl.attention.base import create_backend
from minisgl.config import EngineConfig
from minisgl.engine.batch import Batch
from minisgl.kvcache.pool import KVPool
from minisgl.kvcache.table import TableManager
from minisgl.models.loader import load_model
from minisgl.models.config import ModelConfig
from minisgl.sampling import Sampler

logger = logging.getLogger("minisgl.engine")


class Engine:
    def __init__(self, config: EngineConfig, model_path: Path) -> None:
        self.device = config.torch_device
        if self.device.type == "cpu":
            torch.set_num_threads(config.num_threads or torch.get_num_threads())
        cfg = ModelConfig.from_folder(model_path)
        self.model_config = cfg
        self.max_seq_len = min(cfg.max_position_embeddings, config.max_seq_len_override or cfg.max_position_embeddings)
        self.model = load_model(model_path, config.torch_dtype, self.device, self.max_seq_len)
        self.page_size = config.page_size
        bytes_per_token = KVPool.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, config.torch_dtype)
        num_pages = config.num_page_override or int(config.kv_memory_gb * 2**30) // (bytes_per_token * config.page_size)
        if num_pages < 1:
            raise ValueError(f"KV memory budget of {config.kv_memory_gb} GiB holds no page")
        self.pool = KVPool(
            cfg.num_layers, num_pages, config.page_size, cfg.num_kv_heads, cfg.head_dim, config.torch_dtype, self.device
        )
        self.table = TableManager(config.max_running_req, self.max_seq_len, self.device)
        self.attention = create_backend(
            config.attention_backend, self.pool, self.table.page_table, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        )
        self.sampler = Sampler(config.seed)
        logger.info(
            "KV pool: %d pages x %d tokens = %d tokens (%.1f MiB, %s) on %s; context %d",
            num_pages, config.page_size, self.pool.num_slots, self.pool.num_slots * bytes_per_token / 2**20,
            config.dtype, self.device, self.max_seq_len,
        )  # fmt: skip

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Run the batch; returns the next token of each of ``batch.sampling_reqs`` (CPU int64)."""
        ctx = self.attention.prepare(batch)
        logits = self.model(batch.input_ids, batch.positions, ctx, batch.logit_rows)
        reqs = batch.sampling_reqs
        return self.sampler.sample(logits, [r.params for r in reqs], [r.generator for r in reqs])
