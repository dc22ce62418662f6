"""The engine runs one batch: model, KV pool, page table, attention backend and sampler.

It is the same plain object on every tensor-parallel rank (holding that rank's shard of the model
and of the KV heads) and knows nothing of processes: ``minisgl.parallel`` drives the ranks."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from minisgl.attention.base import AttentionBackend
from minisgl.attention.registry import ATTENTION_BACKENDS
from minisgl.batch import Batch
from minisgl.config import EngineConfig
from minisgl.distributed.sharding import max_kv_heads
from minisgl.heap import retain_freed_memory
from minisgl.kernels.native import attention_products, cpu_paths, resolve_kernels
from minisgl.kvcache.pool import KVPool
from minisgl.kvcache.table import TableManager
from minisgl.kvcache.window import full_slots_in_budget, sliding_window, slots_per_request, window_pool_slots
from minisgl.layers.quant import QuantizedWeight
from minisgl.models.config import ModelConfig
from minisgl.models.decoder import local_heads
from minisgl.models.loader import load_model, memory_bytes
from minisgl.models.source import resolve_gguf_file
from minisgl.sampler import Sampled, Sampler

if TYPE_CHECKING:
    from minisgl.distributed.group import TPGroup

logger = logging.getLogger("minisgl.engine")


class Engine:
    def __init__(self, config: EngineConfig, model_path: Path, tp: TPGroup | None = None) -> None:
        self.device = tp.device if tp is not None else config.torch_device
        if self.device.type == "cpu":  # the cores are shared by this node's ranks
            torch.set_num_threads(config.num_threads or max(1, torch.get_num_threads() // config.tp_per_node))
        # The kernel choice, made once here and handed to the model and the attention backend.
        self.kernels = resolve_kernels(config.kernels) if self.device.type == "cpu" else None
        cfg = ModelConfig.from_folder(model_path)
        self.model_config = cfg
        self.max_seq_len = min(cfg.max_position_embeddings, config.max_seq_len_override or cfg.max_position_embeddings)
        self.model = load_model(
            model_path, config.torch_dtype, self.device, self.max_seq_len, tp,
            config.quantization, resolve_gguf_file(config.model), self.kernels,
        )  # fmt: skip
        self.page_size = config.page_size
        heads = local_heads(cfg, tp)
        # Every rank sizes its pool for the largest KV shard, so that all ranks have the same pages.
        budget_heads = cfg.num_kv_heads if tp is None else max_kv_heads(cfg.num_heads, cfg.num_kv_heads, tp.size)
        quantized = any(isinstance(m, QuantizedWeight) for m in self.model.modules())
        kv_dtype = config.kv_torch_dtype(quantized)
        # Sliding-window layers keep their KV in a pool of their own, sized by ``window_kv_ratio``.
        self.window = sliding_window(cfg.layer_windows, self.max_seq_len)
        num_windowed = sum(w is not None for w in cfg.layer_windows) if self.window is not None else 0
        full_bytes = KVPool.bytes_per_token(cfg.num_layers - num_windowed, budget_heads, cfg.head_dim, kv_dtype)
        window_bytes = KVPool.bytes_per_token(num_windowed, budget_heads, cfg.head_dim, kv_dtype)
        # The window slots one request holds at most: the window pool's least size, what admission reserves.
        self.window_per_request = slots_per_request(self.window, config.max_draft) if self.window is not None else 0
        ratio, least = config.window_kv_ratio, self.window_per_request
        if config.num_page_override:
            num_pages = config.num_page_override
        else:
            budget = int(config.kv_memory_gb * 2**30)
            full_slots = full_slots_in_budget(budget, full_bytes, window_bytes, ratio, least)
            num_pages = full_slots // config.page_size
        if num_pages < 1:
            raise ValueError(f"KV memory budget of {config.kv_memory_gb} GiB holds no page")
        num_slots = num_pages * config.page_size
        num_window_slots = window_pool_slots(num_slots, ratio, least) if num_windowed else 0
        num_full = cfg.num_layers - num_windowed
        self.pool = KVPool(num_full, num_pages, config.page_size, heads.num_kv, cfg.head_dim, kv_dtype, self.device)
        # Slot 0 of the window pool is the scratch slot (``window.ABSENT``), never handed out.
        self.window_pool = (
            KVPool(num_windowed, num_window_slots + 1, 1, heads.num_kv, cfg.head_dim, kv_dtype, self.device)
            if num_windowed
            else None
        )
        self.table = TableManager(config.max_running_req, self.max_seq_len, self.device, windowed=bool(num_windowed))
        self.attention = ATTENTION_BACKENDS.get(config.attention_backend)(
            self.pool, self.table.page_table, heads.num_q, heads.num_kv, cfg.head_dim, cfg.layer_windows,
            config.torch_dtype, self.kernels, self.window_pool, self.table.window_table,
        )
        self.sampler = Sampler(config.seed, self.kernels)
        # Bytes by part, fixed from here on (the start-up log, ``/metrics``, ``LLM.stats()``).
        kv_bytes = self.pool.nbytes + (self.window_pool.nbytes if self.window_pool is not None else 0)
        self.memory = {**memory_bytes(self.model), "kv_pool": kv_bytes}
        logger.info(
            "KV pool: %d pages x %d tokens = %d tokens (%.1f MiB, %s) on %s; context %d",
            num_pages, config.page_size, num_slots, kv_bytes / 2**20,
            str(kv_dtype).removeprefix("torch."), self.device, self.max_seq_len,
        )  # fmt: skip
        if num_windowed:
            every_layer = (num_slots * full_bytes + num_window_slots * window_bytes) // (full_bytes + window_bytes)
            logger.info(
                "sliding-window layers (%d of %d, window %d): %d window slots (%.1f MiB); %d tokens fit, "
                "%.1fx the %d of full attention in every layer in the same memory",
                num_windowed, cfg.num_layers, self.window, num_window_slots, (kv_bytes - self.pool.nbytes) / 2**20,
                num_slots, num_slots / max(1, every_layer), every_layer,
            )  # fmt: skip
        logger.info(
            "memory: weights %.1f MiB, KV pool %.1f MiB, dequantization buffer %.1f MiB",
            *(self.memory[part] / 2**20 for part in ("weights", "kv_pool", "dequant_buffer")),
        )
        if self.device.type == "cpu":
            kernels = self.kernels.variant.description if self.kernels is not None else "none (torch's kernels)"
            logger.info("C kernels (kernels=%s): %s", config.kernels, kernels)
            for kind, products in attention_products(self.kernels).items():
                logger.info("%s attention's products over a bf16 KV pool: %s", kind, products)
        if quantized and self.device.type == "cpu":
            logger.info("quantized products: %s", "; ".join(f"{k}: {v}" for k, v in cpu_paths(self.kernels).items()))
        if self.device.type == "cpu":  # after the load: its temporaries go back to the kernel first
            retain_freed_memory()

    def scoring_attention(self, tokens: int) -> AttentionBackend:
        """An attention backend like the engine's over a pool of its own, ``tokens`` slots of the engine's
        KV dtype with page-table row 0 holding them in order: a sequence scored through it
        (``models/perplexity.py``) attends as the engine's passes do, without touching the engine's pool."""
        a = self.attention
        layers = self.model_config.num_layers
        pool = KVPool(layers, tokens, 1, a.num_kv_heads, a.head_dim, self.pool.k.dtype, self.device)
        table = torch.arange(tokens, device=self.device).unsqueeze(0)
        return type(a)(pool, table, a.num_heads, a.num_kv_heads, a.head_dim, a.layer_windows, a.dtype, a.kernels)

    @torch.inference_mode()
    def run_model(self, batch: Batch) -> torch.Tensor:
        """The model on this rank's shard; logits of ``batch.logit_rows`` (full vocabulary on rank 0)."""
        ctx = self.attention.prepare(batch)
        return self.model(batch.input_ids, batch.positions, ctx, batch.logit_rows, batch.prefill_tokens)

    @torch.inference_mode()
    def sample(self, batch: Batch, logits: torch.Tensor) -> Sampled:
        """The next token of each sampled row (CPU int64), the rows whose own sampling failed, and what the
        scored rows give (``Sampled.prompt_logprobs``)."""
        sampled = batch.sample_rows.numel()
        result = self.sampler.sample(logits[:sampled], batch.sampling)
        if not batch.score_rows.numel():
            return result
        return replace(result, prompt_logprobs=self.sampler.prompt_logprobs(logits[sampled:], batch.scoring))

    def forward(self, batch: Batch) -> Sampled:
        return self.sample(batch, self.run_model(batch))
