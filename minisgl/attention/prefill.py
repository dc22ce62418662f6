"""Prefill strategies. A request with nothing in the KV pool attends to its fresh K/V directly
(one causal call each, no gather); requests that extend KV already in the pool (a cached prefix, an
earlier chunk, or a decode token riding along) are gathered into padded calls with a shifted
causal mask, bucketed so that one long extension does not pad many short ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from minisgl.attention.ops import sdpa
from minisgl.batch import PagedKV
from minisgl.kernels.native import CpuKernels
from minisgl.kvcache.pool import KVPool
from minisgl.tuning import MAX_PADDING_COST


class PrefillPart(Protocol):
    """Attends some of the pass's tokens and writes their rows of the output."""

    def write(
        self, out: torch.Tensor, pool: KVPool, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """``k``, ``v``: the pass's new K/V, rounded as the pool holds them."""


@dataclass(frozen=True)
class FreshPrefill:
    """Requests with no KV in the pool before this pass: causal attention over their own K/V."""

    runs: list[tuple[int, int]]  # (first row in the pass's tokens, tokens) of each request

    def write(
        self, out: torch.Tensor, pool: KVPool, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        for start, n in self.runs:
            end = start + n
            out[start:end] = sdpa(q[start:end], k[start:end], v[start:end], is_causal=True).flatten(1)


@dataclass(frozen=True)
class CachedPrefill:
    """Requests that extend KV in the pool, attended in one padded call: [batch, max_new, max_kv]."""

    q_index: torch.Tensor  # [batch * max_new] row of each padded query in the pass's tokens
    kv_slots: torch.Tensor  # [batch, max_kv] KV slots of each request (prefix + new tokens; the window's)
    # Where the new tokens' keys sit in the flattened [batch * max_kv] layout: they are taken fresh
    # from the pass, not read back from the pool, so a windowed layer needs a slot only for the new
    # tokens a later pass still sees (``kvcache/window.py``); the others are written to a scratch slot.
    new_kv_index: torch.Tensor
    mask: torch.Tensor  # [batch, 1, max_new, max_kv] causal (and window) mask shifted by each prefix
    valid: torch.Tensor  # positions in the padded [batch * max_new] layout that are real tokens
    rows: torch.Tensor  # their rows in the pass's tokens

    @classmethod
    def build(
        cls, page_table: torch.Tensor, reqs: list[tuple[int, int, int, int]], window: int | None = None
    ) -> CachedPrefill:
        """``reqs``: (first row in the pass's tokens, new tokens, prefix, page-table row) each. With a
        ``window``, each request's keys start at the first one its first query sees."""
        device = page_table.device
        starts, new_lens, prefixes, rows = (list(column) for column in zip(*reqs))
        firsts = [first_key(p, window) for p in prefixes]
        start_t, new_t, prefix_t, first_t = (
            torch.tensor(x, device=device) for x in (starts, new_lens, prefixes, firsts)
        )
        max_new, max_kv = max(new_lens), max(p + n - f for p, n, f in zip(prefixes, new_lens, firsts))
        i = torch.arange(max_new, device=device)
        j = torch.arange(max_kv, device=device)
        real = i.unsqueeze(0) < new_t.unsqueeze(1)  # [batch, max_new]
        q_pos = (prefix_t.unsqueeze(1) + i.unsqueeze(0)).unsqueeze(2)  # [batch, max_new, 1]
        k_pos = first_t.unsqueeze(1) + j.unsqueeze(0)  # [batch, max_kv]
        # Query i of a request sees keys up to its own position (prefix + i), within the window.
        mask = k_pos.unsqueeze(1) <= q_pos
        if window is not None:
            mask &= k_pos.unsqueeze(1) > q_pos - window
        # Padded queries see key 0 only, so that no row is fully masked (they are dropped afterwards).
        mask = torch.where(real.unsqueeze(2), mask, (j == 0).view(1, 1, -1))
        q_rows = start_t.unsqueeze(1) + i.unsqueeze(0) * real
        new_cols = (torch.arange(len(reqs), device=device) * max_kv + prefix_t - first_t).unsqueeze(1) + i.unsqueeze(0)
        # Columns past a request's keys are masked out; clamped so that they stay inside the table.
        cols = k_pos.clamp(max=page_table.shape[1] - 1)
        return cls(
            q_index=q_rows.flatten(),
            kv_slots=page_table[torch.tensor(rows, device=device).unsqueeze(1), cols].contiguous(),
            mask=mask.unsqueeze(1),
            valid=real.flatten().nonzero().squeeze(1),
            rows=q_rows[real],
            new_kv_index=new_cols[real],
        )

    def write(
        self, out: torch.Tensor, pool: KVPool, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        batch, max_kv = self.kv_slots.shape
        qi = q.index_select(0, self.q_index).view(batch, -1, *q.shape[1:]).transpose(1, 2)
        kv_shape = (batch, max_kv, *k.shape[1:])
        ki, vi = (
            cache[layer_id]
            .index_select(0, self.kv_slots.view(-1))
            .index_copy_(0, self.new_kv_index, new.index_select(0, self.rows).to(cache.dtype))
            .view(kv_shape)
            .transpose(1, 2)
            .to(q.dtype)
            for cache, new in ((pool.k, k), (pool.v, v))
        )
        o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=self.mask, enable_gqa=True)
        out.index_copy_(0, self.rows, o.transpose(1, 2).flatten(2).flatten(0, 1).index_select(0, self.valid))


def first_key(prefix: int, window: int | None) -> int:
    """The first position that the first new token after ``prefix`` cached ones attends to."""
    return 0 if window is None else max(0, prefix - window + 1)


def padding_buckets(new_lens: list[int], kv_lens: list[int]) -> list[list[int]]:
    """Split requests into padded calls: sorted by new tokens, a bucket grows while its padded
    size (count x max new x max keys) stays within MAX_PADDING_COST of its real work. One long
    extension among many short ones then no longer pads all of them to its length."""
    buckets: list[list[int]] = []
    work = max_new = max_kv = 0
    for i in sorted(range(len(new_lens)), key=lambda i: (new_lens[i], kv_lens[i])):
        n, kv = new_lens[i], kv_lens[i]
        grown = (len(buckets[-1]) + 1) * max(max_new, n) * max(max_kv, kv) if buckets else 0
        if buckets and grown <= MAX_PADDING_COST * (work + n * kv):
            buckets[-1].append(i)
            work, max_new, max_kv = work + n * kv, max(max_new, n), max(max_kv, kv)
        else:
            buckets.append([i])
            work, max_new, max_kv = n * kv, n, kv
    return buckets


class PrefillAttention:
    """A prefill pass: every part writes its tokens' rows of one output."""

    paged: PagedKV | None = None

    def __init__(self, pool: KVPool, out_slots: torch.Tensor, parts: list[PrefillPart]) -> None:
        self.pool, self.out_slots, self.parts = pool, out_slots, parts

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.store(layer_id, self.out_slots, k, v)
        k, v = self.pool.rounded(k), self.pool.rounded(v)
        out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
        for part in self.parts:
            part.write(out, self.pool, layer_id, q, k, v)
        return out


class SingleFreshPrefill:
    """The whole pass is one request with nothing cached: one causal call, no output copy."""

    paged: PagedKV | None = None

    def __init__(self, pool: KVPool, out_slots: torch.Tensor) -> None:
        self.pool, self.out_slots = pool, out_slots

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.store(layer_id, self.out_slots, k, v)
        return sdpa(q, self.pool.rounded(k), self.pool.rounded(v), is_causal=True).flatten(1)


@dataclass(frozen=True)
class DecodeRows:
    """Rows of an extend pass that attend as decode queries: each row's keys are the first ``kv_lens``
    of its ``kv_slots`` row ([rows, n]), itself the last of them."""

    rows: torch.Tensor  # their rows in the pass's tokens
    kv_slots: torch.Tensor
    kv_lens: torch.Tensor


class PagedPrefill:
    """The whole pass in C over the bf16 pool, every key and value read where it lies: the requests
    that prefill in one call of ``prefill_attention.c`` (bf16 products, no padded gathered copy), and
    the ``decoding`` rows, if any, through the decode kernel, as a decode pass attends them."""

    paged: PagedKV | None = None

    def __init__(
        self, pool: KVPool, out_slots: torch.Tensor, kernels: CpuKernels, kv_slots: torch.Tensor,
        q_starts: torch.Tensor, new_lens: torch.Tensor, prefix_lens: torch.Tensor, decoding: DecodeRows | None,
    ) -> None:  # fmt: skip
        """``kv_slots``: [batch, n] each prefilling request's slots from position 0, at least prefix + new
        of them; ``q_starts``: its first row in the pass's tokens (``batch`` may be 0)."""
        self.pool, self.out_slots, self.kernels, self.kv_slots = pool, out_slots, kernels, kv_slots
        self.q_starts, self.new_lens, self.prefix_lens, self.decoding = q_starts, new_lens, prefix_lens, decoding

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_pool, v_pool = self.pool.k[layer_id], self.pool.v[layer_id]
        self.kernels.store_kv(k, v, self.out_slots, k_pool, v_pool)
        out = self.kernels.prefill_attention(
            q, k_pool, v_pool, self.kv_slots, self.q_starts, self.new_lens, self.prefix_lens
        )
        if self.decoding is not None:
            d = self.decoding  # stores its rows' K/V again (the same bits), then attends
            rows_q, rows_k, rows_v = (t.index_select(0, d.rows) for t in (q, k, v))
            out_slots = self.out_slots.index_select(0, d.rows)
            out[d.rows] = self.kernels.paged_decode_attention(
                rows_q, rows_k, rows_v, out_slots, k_pool, v_pool, d.kv_slots, d.kv_lens
            )
        return out
