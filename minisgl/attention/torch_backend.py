"""Attention with ``torch.nn.functional.scaled_dot_product_attention`` over the paged pool.

Works wherever torch does (CPU, CUDA). Prefill runs one SDPA call per request (prompts are long,
so the call overhead is small); a request with no cached prefix attends to its fresh K/V directly,
with no gather. Decode runs one SDPA call for the whole batch over KV gathered into a padded
[batch, max_len] layout, with padding masked out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minisgl.attention.base import AttentionBackend, register_backend
from minisgl.engine.batch import Batch
from minisgl.kvcache.pool import KVPool


@dataclass
class _PrefillSeq:
    q_start: int
    q_len: int
    kv_slots: torch.Tensor | None  # all KV slots incl. the cached prefix; None when there is no prefix
    mask: torch.Tensor | None  # [q_len, kv_len] causal mask shifted by the prefix length


class _PrefillContext:
    def __init__(self, pool: KVPool, out_slots: torch.Tensor, seqs: list[_PrefillSeq]) -> None:
        self.pool, self.out_slots, self.seqs = pool, out_slots, seqs

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.store(layer_id, self.out_slots, k, v)
        outs = []
        for s in self.seqs:
            qi = q[s.q_start : s.q_start + s.q_len].transpose(0, 1)
            if s.kv_slots is None:
                ki = k[s.q_start : s.q_start + s.q_len].transpose(0, 1)
                vi = v[s.q_start : s.q_start + s.q_len].transpose(0, 1)
                o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, enable_gqa=True)
            else:
                ki = self.pool.k[layer_id].index_select(0, s.kv_slots).transpose(0, 1)
                vi = self.pool.v[layer_id].index_select(0, s.kv_slots).transpose(0, 1)
                o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=s.mask, enable_gqa=True)
            outs.append(o.transpose(0, 1).flatten(1))
        return torch.cat(outs) if len(outs) > 1 else outs[0]


class _DecodeContext:
    def __init__(self, pool: KVPool, out_slots: torch.Tensor, kv_slots: torch.Tensor, mask: torch.Tensor | None) -> None:
        self.pool, self.out_slots, self.kv_slots, self.mask = pool, out_slots, kv_slots, mask
        self.batch, self.max_len = kv_slots.shape

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.store(layer_id, self.out_slots, k, v)
        shape = (self.batch, self.max_len, k.shape[1], k.shape[2])
        ki = self.pool.k[layer_id].index_select(0, self.kv_slots.view(-1)).view(shape).transpose(1, 2)
        vi = self.pool.v[layer_id].index_select(0, self.kv_slots.view(-1)).view(shape).transpose(1, 2)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), ki, vi, attn_mask=self.mask, enable_gqa=True)
        return o.flatten(1)


@register_backend("torch")
class TorchAttentionBackend(AttentionBackend):
    def prepare(self, batch: Batch) -> _PrefillContext | _DecodeContext:
        device = self.page_table.device
        if batch.is_prefill:
            seqs, q_start = [], 0
            for req, q_len in zip(batch.reqs, batch.extend_lens):
                prefix = req.device_len
                kv_slots = mask = None
                if prefix > 0:
                    kv_len = prefix + q_len
                    kv_slots = self.page_table[req.row, :kv_len]
                    mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(diagonal=prefix)
                seqs.append(_PrefillSeq(q_start, q_len, kv_slots, mask))
                q_start += q_len
            return _PrefillContext(self.pool, batch.out_slots, seqs)
        # Decode: every request adds one token; its KV length is its new sequence length.
        kv_lens = torch.tensor([r.device_len + 1 for r in batch.reqs], device=device)
        max_len = int(kv_lens.max())
        rows = torch.tensor([r.row for r in batch.reqs], device=device)
        # Entries past a request's length are stale but valid slot ids: read, then masked out.
        kv_slots = self.page_table[rows, :max_len]
        valid = torch.arange(max_len, device=device).unsqueeze(0) < kv_lens.unsqueeze(1)
        mask = None if bool(valid.all()) else valid.view(len(batch.reqs), 1, 1, max_len)
        return _DecodeContext(self.pool, batch.out_slots, kv_slots, mask)
