"""Attention with ``torch.nn.functional.scaled_dot_product_attention`` over the paged pool (CPU,
CUDA). ``prepare`` picks one strategy per batch (``prefill.py``, ``decode.py``) and builds its
metadata; the layers' calls then only run it. A model with sliding-window layers gets one context
per distinct window, each layer's calls routed to its own, over the window pool and table where the
windowed layers have their own."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from minisgl.attention.base import AttentionBackend
from minisgl.attention.decode import (
    CascadeDecode,
    DecodeAttention,
    MatmulDecode,
    PagedDecode,
    SdpaDecode,
    SharedRuns,
    shared_groups,
)
from minisgl.attention.ops import key_bias
from minisgl.attention.prefill import (
    CachedPrefill,
    DecodeRows,
    FreshPrefill,
    PagedPrefill,
    PrefillAttention,
    PrefillPart,
    SingleFreshPrefill,
    first_key,
    padding_buckets,
)
from minisgl.batch import AttentionContext, AttentionKind, Batch, PagedKV
from minisgl.kernels.native import CpuKernels, paged_attention_fits, prefill_attention_fits
from minisgl.kvcache.pool import KVPool


class PerLayerWindow:
    """A model whose layers attend within different windows: each layer's call goes to the context
    built for its window, with the layer's index in the pool that context reads."""

    paged: PagedKV | None = None

    def __init__(self, contexts: list[AttentionContext], pool_layer_ids: list[int]) -> None:
        self.contexts, self.pool_layer_ids = contexts, pool_layer_ids  # one each per layer

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.contexts[layer_id].attend(self.pool_layer_ids[layer_id], q, k, v)


@dataclass(frozen=True)
class _KVPlace:
    """Where a group of layers keeps its KV: the pool, the table from (row, position) to its slots, and
    the slots this pass's new tokens go to."""

    pool: KVPool
    table: torch.Tensor
    out_slots: torch.Tensor


class TorchAttentionBackend(AttentionBackend):
    @cached_property
    def _plain_decode(self) -> type[DecodeAttention]:
        """Decided once: in half precision on CPU, matmuls beat SDPA's GQA path; in fp32 its flash
        kernel wins at long contexts, and on CUDA SDPA is the fused kernel."""
        half_on_cpu = self.dtype != torch.float32 and self.pool.k.device.type == "cpu"
        return MatmulDecode if half_on_cpu else SdpaDecode

    @cached_property
    def _paged_kernels(self) -> CpuKernels | None:
        """The engine's C kernels, where they run this pool's decode: fp32 queries on the CPU, an fp32
        or bf16 pool, heads the kernel takes (``paged_attention_fits``)."""
        pool = self.pool.k
        fits = paged_attention_fits(self.num_heads, self.num_kv_heads, self.head_dim)
        kinds = self.dtype == torch.float32 and pool.dtype in (torch.float32, torch.bfloat16)
        return self.kernels if kinds and pool.device.type == "cpu" and fits else None

    @cached_property
    def _prefill_kernels(self) -> CpuKernels | None:
        """The engine's C kernels, where they run this pool's prefill attention
        (``CpuKernels.runs_prefill_attention``): fp32 queries, a bf16 pool (its products are bf16; an fp32 pool
        keeps torch's fp32 SDPA), heads the kernel takes."""
        kernels, pool = self.kernels, self.pool.k
        if kernels is None or not prefill_attention_fits(self.num_heads, self.num_kv_heads, self.head_dim):
            return None
        kinds = self.dtype == torch.float32 and pool.dtype == torch.bfloat16 and pool.device.type == "cpu"
        return kernels if kinds and kernels.runs_prefill_attention else None

    def prepare(self, batch: Batch) -> AttentionContext:
        full_kv = window_kv = _KVPlace(self.pool, self.page_table, batch.out_slots)
        if self.window_pool is not None and self.window_table is not None:  # windowed layers: their own slots
            token_rows = batch.table_rows.repeat_interleave(batch.extend_lens).to(self.window_table.device)
            window_kv = _KVPlace(self.window_pool, self.window_table, self.window_table[token_rows, batch.positions])
        contexts: dict[int | None, AttentionContext] = {}
        for window in set(self.layer_windows) or {None}:
            contexts[window] = self._prepare_window(batch, window, full_kv if window is None else window_kv)
        if len(contexts) == 1:  # every layer alike, all in one pool: one context
            return next(iter(contexts.values()))
        return PerLayerWindow([contexts[w] for w in self.layer_windows], self.pool_layer_ids)

    def _prepare_window(self, batch: Batch, window: int | None, kv: _KVPlace) -> AttentionContext:
        """The context of the layers that attend within ``window`` (None: fully)."""
        if batch.attention is AttentionKind.DECODE:
            return self._prepare_decode(batch, window, kv)
        return self._prepare_prefill(batch, window, kv)

    def _prepare_prefill(self, batch: Batch, window: int | None, kv: _KVPlace) -> AttentionContext:
        """Without a window, the C kernel where it runs: one call over the pool. Else requests with
        nothing cached (and, with a window, no more new tokens than it) attend to their fresh K/V
        directly; the rest are gathered into padded calls."""
        if window is None and self._prefill_kernels is not None:
            return self._paged_prefill(batch, kv, self._prefill_kernels)
        prefixes, new_lens, rows = batch.prefix_lens.tolist(), batch.extend_lens.tolist(), batch.table_rows.tolist()
        fresh: list[tuple[int, int]] = []
        gathered: list[tuple[int, int, int, int]] = []  # (first token row, new tokens, prefix, table row)
        q_start = 0
        for prefix, n, row in zip(prefixes, new_lens, rows):
            if prefix == 0 and (window is None or n <= window):
                fresh.append((q_start, n))
            else:
                gathered.append((q_start, n, prefix, row))
            q_start += n
        if len(fresh) == 1 and not gathered:
            return SingleFreshPrefill(kv.pool, kv.out_slots)
        parts: list[PrefillPart] = [FreshPrefill(fresh)] if fresh else []
        kv_lens = [n + prefix - first_key(prefix, window) for _, n, prefix, _ in gathered]
        buckets = padding_buckets([g[1] for g in gathered], kv_lens)
        parts += [CachedPrefill.build(kv.table, [gathered[i] for i in b], window) for b in buckets]
        return PrefillAttention(kv.pool, kv.out_slots, parts)

    def _paged_prefill(self, batch: Batch, kv: _KVPlace, kernels: CpuKernels) -> PagedPrefill:
        """Requests whose every token is sampled (decoding, with or without a draft, riding along) attend
        as decode queries through the decode kernel where it runs: a token then decodes the same whether
        or not a prefill shares its pass. The others go to the prefill kernel."""
        new_lens, prefixes = batch.extend_lens.tolist(), batch.prefix_lens.tolist()
        sampled = set(batch.sample_rows.tolist())
        prefilling: list[tuple[int, int, int, int]] = []  # (first token row, new tokens, prefix, table row)
        decode_rows: list[tuple[int, int, int]] = []  # (token row, table row, keys it sees)
        start = 0
        for n, prefix, row in zip(new_lens, prefixes, batch.table_rows.tolist()):
            if self._paged_kernels is not None and all(start + i in sampled for i in range(n)):
                decode_rows += [(start + i, row, prefix + i + 1) for i in range(n)]
            else:
                prefilling.append((start, n, prefix, row))
            start += n
        device = kv.table.device
        decoding = None
        if decode_rows:
            rows, rows_of_table, lens = (torch.tensor(column, device=device) for column in zip(*decode_rows))
            kv_slots = kv.table[rows_of_table, : int(lens.max())].contiguous()
            decoding = DecodeRows(rows, kv_slots, lens)
        empty = torch.zeros(0, dtype=torch.int64)
        starts, lens, prefix_lens, rows = [torch.tensor(column) for column in zip(*prefilling)] or [empty] * 4
        kv_slots = kv.table[rows.to(device), : max((p + n for _, n, p, _ in prefilling), default=0)].contiguous()
        return PagedPrefill(kv.pool, kv.out_slots, kernels, kv_slots, starts, lens, prefix_lens, decoding)

    def _prepare_decode(self, batch: Batch, window: int | None, kv: _KVPlace) -> DecodeAttention:
        device = kv.table.device
        kv_lens = batch.kv_lens.to(device)
        slot_rows = kv.table[batch.table_rows.to(device), : int(kv_lens.max())]
        # A window reads only each request's last ``window`` keys, and no shared runs (a shared
        # prefix may lie partly outside it). Keys read in place: the kernel finds the shared runs.
        paged = self._paged_kernels
        groups = shared_groups(slot_rows, kv_lens) if window is None and paged is None else []
        starts = torch.zeros_like(kv_lens) if window is None else (kv_lens - window).clamp(min=0)
        for members, run_len in groups:
            starts[members] = run_len
        # Each request's own part: from its shared run's end, its window's start, or 0, to its
        # length, left-aligned.
        own_lens = kv_lens - starts
        max_len = int(own_lens.max())
        positions = torch.arange(max_len, device=device).unsqueeze(0)
        # Entries past a request's length are stale but valid slot ids: read, then masked out
        # (or, read in place, never reached).
        gather_at = (starts.unsqueeze(1) + positions).clamp(max=slot_rows.shape[1] - 1)
        kv_slots = torch.gather(slot_rows, 1, gather_at).contiguous()
        if paged is not None:
            return PagedDecode(kv.pool, PagedKV(kv.pool.k, kv.pool.v, kv.out_slots, kv_slots, own_lens), paged)
        valid = positions < own_lens.unsqueeze(1)
        dtype = self.dtype
        bias = None if bool(valid.all()) else key_bias(valid, dtype).view(batch.num_reqs, 1, 1, max_len)
        if not groups:
            return self._plain_decode(kv.pool, kv.out_slots, kv_slots, bias)
        shared = SharedRuns.build([(m, slot_rows[m[0], :n]) for m, n in groups], dtype)
        return CascadeDecode(kv.pool, kv.out_slots, kv_slots, bias, shared)
