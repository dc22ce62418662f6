"""Attention with ``torch.nn.functional.scaled_dot_product_attention`` over the paged pool.

Works wherever torch does (CPU, CUDA). In prefill, a request with nothing cached attends to its
fresh K/V directly (one causal call each, no gather); requests that extend a cached prefix are
gathered into one padded call with a shifted causal mask. Decode runs one SDPA call for the whole batch over KV gathered into a padded
[batch, max_len] layout, with padding masked out.

Decode with shared prefixes: when several running requests share a long run of KV slots (a system
prompt in the radix cache), gathering that run once per request per layer dominates the step.
Those requests form a group whose shared run is gathered once and attended by all members' queries
in one matmul; each request's own suffix is attended separately, and the two partial results are
merged exactly through their log-sum-exp (cascade attention).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minisgl.attention.base import AttentionBackend, register_backend
from minisgl.engine.batch import Batch
from minisgl.kvcache.pool import KVPool

# A shared run shorter than this is cheaper to gather per request than to attend separately.
MIN_SHARED_PREFIX = 64


@dataclass
class _CachedPrefill:
    """Requests that extend a cached prefix, attended in one padded call: [batch, max_new, max_kv]."""

    q_index: torch.Tensor  # [batch * max_new] row of each padded query in the pass's tokens
    kv_slots: torch.Tensor  # [batch, max_kv] all KV slots of each request (prefix + new tokens)
    mask: torch.Tensor  # [batch, 1, max_new, max_kv] causal mask shifted by each prefix length
    valid: torch.Tensor  # positions in the padded [batch * max_new] layout that are real tokens
    rows: torch.Tensor  # their rows in the pass's tokens


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: object) -> torch.Tensor:
    """SDPA on [tokens, heads, dim] inputs. 4-D views matter: on CPU a masked 3-D call takes the
    slow math path instead of the flash kernel."""
    args = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    return F.scaled_dot_product_attention(*args, enable_gqa=True, **kw)[0].transpose(0, 1)  # type: ignore[arg-type]


class _PrefillContext:
    def __init__(
        self, pool: KVPool, out_slots: torch.Tensor, fresh: list[tuple[int, int]], cached: _CachedPrefill | None
    ) -> None:
        self.pool, self.out_slots, self.fresh, self.cached = pool, out_slots, fresh, cached

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.store(layer_id, self.out_slots, k, v)
        if self.cached is None and len(self.fresh) == 1:
            return _sdpa(q, k, v, is_causal=True).flatten(1)
        out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
        # A request with nothing cached attends to its fresh K/V directly: no gather.
        for start, n in self.fresh:
            out[start : start + n] = _sdpa(q[start : start + n], k[start : start + n], v[start : start + n], is_causal=True).flatten(1)
        if self.cached is not None:
            c = self.cached
            batch, max_kv = c.kv_slots.shape
            qi = q.index_select(0, c.q_index).view(batch, -1, *q.shape[1:]).transpose(1, 2)
            kv_shape = (batch, max_kv, *k.shape[1:])
            ki = self.pool.k[layer_id].index_select(0, c.kv_slots.view(-1)).view(kv_shape).transpose(1, 2)
            vi = self.pool.v[layer_id].index_select(0, c.kv_slots.view(-1)).view(kv_shape).transpose(1, 2)
            o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=c.mask, enable_gqa=True)
            out.index_copy_(0, c.rows, o.transpose(1, 2).flatten(2).flatten(0, 1).index_select(0, c.valid))
        return out


@dataclass
class _SharedGroup:
    members: torch.Tensor  # batch indices of the requests sharing the run
    slots: torch.Tensor  # the shared KV slots


def _partial_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention that also returns the log-sum-exp of the scores, so two partial results
    over disjoint keys can be merged. ``q``: [..., n, d], ``k``/``v``: [..., m, d]."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.matmul(torch.exp(scores - lse), v), lse


class _DecodeContext:
    def __init__(
        self,
        pool: KVPool,
        out_slots: torch.Tensor,
        kv_slots: torch.Tensor,
        mask: torch.Tensor | None,
        groups: list[_SharedGroup],
    ) -> None:
        self.pool, self.out_slots, self.kv_slots, self.mask, self.groups = pool, out_slots, kv_slots, mask, groups
        self.batch, self.max_len = kv_slots.shape

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.store(layer_id, self.out_slots, k, v)
        num_kv, dim = k.shape[1], k.shape[2]
        shape = (self.batch, self.max_len, num_kv, dim)
        ki = self.pool.k[layer_id].index_select(0, self.kv_slots.view(-1)).view(shape).transpose(1, 2)
        vi = self.pool.v[layer_id].index_select(0, self.kv_slots.view(-1)).view(shape).transpose(1, 2)
        if not self.groups:
            o = F.scaled_dot_product_attention(q.unsqueeze(2), ki, vi, attn_mask=self.mask, enable_gqa=True)
            return o.flatten(1)
        # Queries as [batch, kv_heads, heads per kv head, dim], so GQA needs no copy of K/V.
        qg = q.view(self.batch, num_kv, -1, dim)
        mask = None if self.mask is None else self.mask.view(self.batch, 1, 1, self.max_len)
        out, lse = _partial_attention(qg, ki, vi, mask)
        for g in self.groups:
            ks = self.pool.k[layer_id].index_select(0, g.slots).transpose(0, 1)  # [kv_heads, len, dim]
            vs = self.pool.v[layer_id].index_select(0, g.slots).transpose(0, 1)
            n = len(g.members)
            qs = qg[g.members].permute(1, 0, 2, 3).reshape(num_kv, -1, dim)  # all members' queries at once
            o_shared, lse_shared = _partial_attention(qs, ks, vs, None)
            o_shared = o_shared.view(num_kv, n, -1, dim).permute(1, 0, 2, 3)
            lse_shared = lse_shared.view(num_kv, n, -1, 1).permute(1, 0, 2, 3)
            lse_own = lse[g.members]
            total = torch.logaddexp(lse_own, lse_shared)
            out[g.members] = out[g.members] * torch.exp(lse_own - total) + o_shared * torch.exp(lse_shared - total)
        return out.flatten(1)


def _shared_groups(slot_rows: torch.Tensor, kv_lens: torch.Tensor) -> list[tuple[list[int], int]]:
    """Groups of requests whose first ``n`` KV slots are identical, n >= MIN_SHARED_PREFIX: a list
    of (batch indices, n). Sorting by the first MIN_SHARED_PREFIX slots makes members neighbours."""
    if len(kv_lens) < 2 or slot_rows.shape[1] < MIN_SHARED_PREFIX:
        return []
    _, head_ids = torch.unique(slot_rows[:, :MIN_SHARED_PREFIX], dim=0, return_inverse=True)
    order = torch.argsort(head_ids, stable=True)
    rows, lens = slot_rows[order], kv_lens[order]
    # The last token of every request is its own, so at most len - 1 slots can be shared.
    limit = (torch.minimum(lens[1:], lens[:-1]) - 1).unsqueeze(1)
    positions = torch.arange(rows.shape[1], device=rows.device)
    equal = (rows[1:] == rows[:-1]) & (positions < limit)
    common = torch.cumprod(equal.int(), dim=1).sum(dim=1).tolist()  # shared length of each neighbour pair
    groups: list[tuple[list[int], int]] = []
    order_list = order.tolist()
    members, shared = [order_list[0]], 0
    for i, n in enumerate(common):
        if n >= MIN_SHARED_PREFIX:
            shared = n if len(members) == 1 else min(shared, n)
            members.append(order_list[i + 1])
            continue
        if len(members) > 1:
            groups.append((members, shared))
        members, shared = [order_list[i + 1]], 0
    if len(members) > 1:
        groups.append((members, shared))
    return groups


@register_backend("torch")
class TorchAttentionBackend(AttentionBackend):
    def _prepare_prefill(self, batch: Batch) -> _PrefillContext:
        device = self.page_table.device
        fresh: list[tuple[int, int]] = []
        starts, new_lens, prefixes, rows = [], [], [], []
        q_start = 0
        for req, n in zip(batch.reqs, batch.extend_lens):
            if req.device_len == 0:
                fresh.append((q_start, n))
            else:
                starts.append(q_start)
                new_lens.append(n)
                prefixes.append(req.device_len)
                rows.append(req.row)
            q_start += n
        if not rows:
            return _PrefillContext(self.pool, batch.out_slots, fresh, None)
        start_t, new_t, prefix_t = (torch.tensor(x, device=device) for x in (starts, new_lens, prefixes))
        kv_lens = prefix_t + new_t
        max_new, max_kv = int(new_t.max()), int(kv_lens.max())
        i = torch.arange(max_new, device=device)
        j = torch.arange(max_kv, device=device)
        real = i.unsqueeze(0) < new_t.unsqueeze(1)  # [batch, max_new]
        # Query i of a request sees keys up to its own position (prefix + i). Padded queries see
        # key 0 only, so that no row is fully masked (they are dropped afterwards).
        mask = j.view(1, 1, -1) <= (prefix_t.view(-1, 1, 1) + i.view(1, -1, 1)) * real.unsqueeze(2)
        q_rows = start_t.unsqueeze(1) + i.unsqueeze(0) * real
        cached = _CachedPrefill(
            q_index=q_rows.flatten(),
            kv_slots=self.page_table[torch.tensor(rows, device=device), :max_kv].contiguous(),
            mask=mask.unsqueeze(1),
            valid=real.flatten().nonzero().squeeze(1),
            rows=q_rows[real],
        )
        return _PrefillContext(self.pool, batch.out_slots, fresh, cached)

    def prepare(self, batch: Batch) -> _PrefillContext | _DecodeContext:
        device = self.page_table.device
        if batch.is_prefill:
            return self._prepare_prefill(batch)
        # Decode: every request adds one token; its KV length is its new sequence length.
        kv_lens = torch.tensor([r.device_len + 1 for r in batch.reqs], device=device)
        rows = torch.tensor([r.row for r in batch.reqs], device=device)
        slot_rows = self.page_table[rows, : int(kv_lens.max())]
        groups = _shared_groups(slot_rows, kv_lens)
        starts = torch.zeros_like(kv_lens)
        shared_groups = []
        for members, shared in groups:
            starts[members] = shared
            shared_groups.append(_SharedGroup(torch.tensor(members, device=device), slot_rows[members[0], :shared]))
        # Each request's own part: from its shared run's end (or 0) to its length, left-aligned.
        own_lens = kv_lens - starts
        max_len = int(own_lens.max())
        positions = torch.arange(max_len, device=device).unsqueeze(0)
        valid = positions < own_lens.unsqueeze(1)
        # Entries past a request's length are stale but valid slot ids: read, then masked out.
        gather_at = (starts.unsqueeze(1) + positions).clamp(max=slot_rows.shape[1] - 1)
        kv_slots = torch.gather(slot_rows, 1, gather_at)
        mask = None if bool(valid.all()) else (valid if shared_groups else valid.view(len(batch.reqs), 1, 1, max_len))
        return _DecodeContext(self.pool, batch.out_slots, kv_slots.contiguous(), mask, shared_groups)
