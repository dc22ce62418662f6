"""Attention with ``torch.nn.functional.scaled_dot_product_attention`` over the paged pool.

Works wherever torch does (CPU, CUDA). Prefill runs one SDPA call per request (prompts are long,
so the call overhead is small); a request with no cached prefix attends to its fresh K/V directly,
with no gather. Decode runs one SDPA call for the whole batch over KV gathered into a padded
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
class _PrefillSeq:
    q_start: int
    q_len: int
    kv_slots: torch.Tensor | None  # all KV slots incl. the cached prefix; None when there is no prefix
    mask: torch.Tensor | None  # [q_len, kv_len] causal mask shifted by the prefix length


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: object) -> torch.Tensor:
    """SDPA on [tokens, heads, dim] inputs. 4-D views matter: on CPU a masked 3-D call takes the
    slow math path instead of the flash kernel."""
    args = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    return F.scaled_dot_product_attention(*args, enable_gqa=True, **kw)[0].transpose(0, 1)  # type: ignore[arg-type]


class _PrefillContext:
    def __init__(self, pool: KVPool, out_slots: torch.Tensor, seqs: list[_PrefillSeq]) -> None:
        self.pool, self.out_slots, self.seqs = pool, out_slots, seqs

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.store(layer_id, self.out_slots, k, v)
        outs = []
        for s in self.seqs:
            qi = q[s.q_start : s.q_start + s.q_len]
            if s.kv_slots is None:
                end = s.q_start + s.q_len
                o = _sdpa(qi, k[s.q_start : end], v[s.q_start : end], is_causal=True)
            else:
                ki = self.pool.k[layer_id].index_select(0, s.kv_slots)
                vi = self.pool.v[layer_id].index_select(0, s.kv_slots)
                o = _sdpa(qi, ki, vi, attn_mask=s.mask)
            outs.append(o.flatten(1))
        return torch.cat(outs) if len(outs) > 1 else outs[0]


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
