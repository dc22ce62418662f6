"""Attention with ``torch.nn.functional.scaled_dot_product_attention`` over the paged pool (CPU,
CUDA). ``prepare`` picks one strategy per batch (``prefill.py``, ``decode.py``) and builds its
metadata; the layers' calls then only run it."""

from __future__ import annotations

import torch

from minisgl.attention.base import AttentionBackend
from minisgl.attention.decode import CascadeDecode, DecodeAttention, MatmulDecode, SdpaDecode, SharedRuns, shared_groups
from minisgl.attention.ops import key_bias
from minisgl.attention.prefill import (
    CachedPrefill,
    FreshPrefill,
    PrefillAttention,
    PrefillPart,
    SingleFreshPrefill,
    padding_buckets,
)
from minisgl.batch import AttentionContext, Batch
from minisgl.kvcache.pool import KVPool


class TorchAttentionBackend(AttentionBackend):
    def __init__(self, pool: KVPool, page_table: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__(pool, page_table, num_heads, num_kv_heads, head_dim)
        # Decided once: in half precision on CPU, matmuls beat SDPA's GQA path; in fp32 its flash
        # kernel wins at long contexts, and on CUDA SDPA is the fused kernel.
        half_on_cpu = pool.k.dtype != torch.float32 and pool.k.device.type == "cpu"
        self._plain_decode: type[DecodeAttention] = MatmulDecode if half_on_cpu else SdpaDecode

    def prepare(self, batch: Batch) -> AttentionContext:
        return self._prepare_prefill(batch) if batch.is_prefill else self._prepare_decode(batch)

    def _prepare_prefill(self, batch: Batch) -> AttentionContext:
        prefixes, new_lens, rows = batch.prefix_lens.tolist(), batch.extend_lens.tolist(), batch.table_rows.tolist()
        if len(new_lens) == 1 and prefixes[0] == 0:
            return SingleFreshPrefill(self.pool, batch.out_slots)
        fresh: list[tuple[int, int]] = []
        extending: list[tuple[int, int, int, int]] = []  # (first token row, new tokens, prefix, table row)
        q_start = 0
        for prefix, n, row in zip(prefixes, new_lens, rows):
            if prefix == 0:
                fresh.append((q_start, n))
            else:
                extending.append((q_start, n, prefix, row))
            q_start += n
        parts: list[PrefillPart] = [FreshPrefill(fresh)] if fresh else []
        buckets = padding_buckets([e[1] for e in extending], [e[1] + e[2] for e in extending])
        parts += [CachedPrefill.build(self.page_table, [extending[i] for i in b]) for b in buckets]
        return PrefillAttention(self.pool, batch.out_slots, parts)

    def _prepare_decode(self, batch: Batch) -> DecodeAttention:
        device = self.page_table.device
        kv_lens = batch.kv_lens.to(device)
        slot_rows = self.page_table[batch.table_rows.to(device), : int(kv_lens.max())]
        groups = shared_groups(slot_rows, kv_lens)
        starts = torch.zeros_like(kv_lens)
        for members, run_len in groups:
            starts[members] = run_len
        # Each request's own part: from its shared run's end (or 0) to its length, left-aligned.
        own_lens = kv_lens - starts
        max_len = int(own_lens.max())
        positions = torch.arange(max_len, device=device).unsqueeze(0)
        valid = positions < own_lens.unsqueeze(1)
        # Entries past a request's length are stale but valid slot ids: read, then masked out.
        gather_at = (starts.unsqueeze(1) + positions).clamp(max=slot_rows.shape[1] - 1)
        kv_slots = torch.gather(slot_rows, 1, gather_at).contiguous()
        dtype = self.pool.k.dtype
        bias = None if bool(valid.all()) else key_bias(valid, dtype).view(batch.num_reqs, 1, 1, max_len)
        if not groups:
            return self._plain_decode(self.pool, batch.out_slots, kv_slots, bias)
        shared = SharedRuns.build([(m, slot_rows[m[0], :n]) for m, n in groups], dtype)
        return CascadeDecode(self.pool, batch.out_slots, kv_slots, bias, shared)
