"""Attention with ``torch.nn.functional.scaled_dot_product_attention`` over the paged pool.

Works wherever torch does (CPU, CUDA). In prefill, a request with nothing cached attends to its
fresh K/V directly (one causal call each, no gather); requests that extend a cached prefix are
gathered into padded calls with a shifted causal mask, bucketed so that one long extension does not
pad many short ones. Decode runs one call for the whole batch over KV gathered into a padded
[batch, max_len] layout, with padding masked out.

Decode with shared prefixes: when several running requests share a long run of KV slots (a system
prompt in the radix cache), gathering that run once per request per layer dominates the step.
Those requests form a group whose shared run is gathered once and attended by all members' queries
together (all groups in one padded call); each request's own suffix is attended separately, and the
two partial results are merged exactly through their log-sum-exp (cascade attention).
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
# Prefix-extending prefills are padded to a common shape per call; a bucket may cost at most this
# many times its unpadded work (query-key pairs) before the next request starts a new bucket.
MAX_PADDING_COST = 1.5


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: object) -> torch.Tensor:
    """SDPA on [tokens, heads, dim] inputs. 4-D views matter: on CPU a masked 3-D call takes the
    slow math path instead of the flash kernel."""
    q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    return F.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True, **kw)[0].transpose(0, 1)  # type: ignore[arg-type]


def _key_bias(valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An additive mask: 0 where a key is attended, -inf where it is not."""
    return torch.zeros(valid.shape, dtype=dtype, device=valid.device).masked_fill(~valid, float("-inf"))


def _attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention that also returns the log-sum-exp of the scores, so two partial results
    over disjoint keys can be merged. ``q``: [batch, heads, n, d], ``k``/``v``: [batch, heads, m, d],
    ``bias``: additive, broadcast to the scores; lse: [batch, heads, n, 1]. On CPU the flash kernel
    returns the log-sum-exp itself, at half the cost of materialising the scores."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)
        return out, lse.unsqueeze(-1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if bias is not None:
        scores = scores + bias
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.matmul(torch.exp(scores - lse), v), lse


@dataclass
class _CachedPrefill:
    """Requests that extend a cached prefix, attended in one padded call: [batch, max_new, max_kv]."""

    q_index: torch.Tensor  # [batch * max_new] row of each padded query in the pass's tokens
    kv_slots: torch.Tensor  # [batch, max_kv] all KV slots of each request (prefix + new tokens)
    mask: torch.Tensor  # [batch, 1, max_new, max_kv] causal mask shifted by each prefix length
    valid: torch.Tensor  # positions in the padded [batch * max_new] layout that are real tokens
    rows: torch.Tensor  # their rows in the pass's tokens

    @classmethod
    def build(cls, page_table: torch.Tensor, reqs: list[tuple[int, int, int, int]]) -> _CachedPrefill:
        """``reqs``: (first row in the pass's tokens, new tokens, cached prefix, page-table row) each."""
        device = page_table.device
        starts, new_lens, prefixes, rows = (list(column) for column in zip(*reqs))
        start_t, new_t, prefix_t = (torch.tensor(x, device=device) for x in (starts, new_lens, prefixes))
        max_new, max_kv = max(new_lens), max(p + n for p, n in zip(prefixes, new_lens))
        i = torch.arange(max_new, device=device)
        j = torch.arange(max_kv, device=device)
        real = i.unsqueeze(0) < new_t.unsqueeze(1)  # [batch, max_new]
        # Query i of a request sees keys up to its own position (prefix + i). Padded queries see
        # key 0 only, so that no row is fully masked (they are dropped afterwards).
        mask = j.view(1, 1, -1) <= (prefix_t.view(-1, 1, 1) + i.view(1, -1, 1)) * real.unsqueeze(2)
        q_rows = start_t.unsqueeze(1) + i.unsqueeze(0) * real
        return cls(
            q_index=q_rows.flatten(),
            kv_slots=page_table[torch.tensor(rows, device=device), :max_kv].contiguous(),
            mask=mask.unsqueeze(1),
            valid=real.flatten().nonzero().squeeze(1),
            rows=q_rows[real],
        )


def _padding_buckets(new_lens: list[int], kv_lens: list[int]) -> list[list[int]]:
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


class _PrefillContext:
    def __init__(
        self, pool: KVPool, out_slots: torch.Tensor, fresh: list[tuple[int, int]], cached: list[_CachedPrefill]
    ) -> None:
        self.pool, self.out_slots, self.fresh, self.cached = pool, out_slots, fresh, cached

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.store(layer_id, self.out_slots, k, v)
        if not self.cached and len(self.fresh) == 1:
            return _sdpa(q, k, v, is_causal=True).flatten(1)
        out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
        # A request with nothing cached attends to its fresh K/V directly: no gather.
        for start, n in self.fresh:
            out[start : start + n] = _sdpa(q[start : start + n], k[start : start + n], v[start : start + n], is_causal=True).flatten(1)
        for c in self.cached:
            batch, max_kv = c.kv_slots.shape
            qi = q.index_select(0, c.q_index).view(batch, -1, *q.shape[1:]).transpose(1, 2)
            kv_shape = (batch, max_kv, *k.shape[1:])
            ki = self.pool.k[layer_id].index_select(0, c.kv_slots.view(-1)).view(kv_shape).transpose(1, 2)
            vi = self.pool.v[layer_id].index_select(0, c.kv_slots.view(-1)).view(kv_shape).transpose(1, 2)
            o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=c.mask, enable_gqa=True)
            out.index_copy_(0, c.rows, o.transpose(1, 2).flatten(2).flatten(0, 1).index_select(0, c.valid))
        return out


@dataclass
class _SharedRuns:
    """The shared KV runs of a decode batch's groups, attended in one padded call:
    [groups, kv_heads, max_members * heads per kv head, max_run]."""

    members: torch.Tensor  # [groups * max_members] batch index of each member (padding repeats one)
    slots: torch.Tensor  # [groups * max_run] each group's shared slots (padding repeats one)
    bias: torch.Tensor | None  # [groups, 1, 1, max_run] masks a shorter run's padding; None if none
    real: torch.Tensor  # positions in ``members`` that are not padding
    rows: torch.Tensor  # the batch indices at those positions
    num_groups: int

    @classmethod
    def build(cls, groups: list[tuple[list[int], torch.Tensor]], dtype: torch.dtype) -> _SharedRuns:
        """``groups``: (member batch indices, shared slots) of each group."""
        device = groups[0][1].device
        max_members = max(len(m) for m, _ in groups)
        max_run = max(len(s) for _, s in groups)
        members = torch.tensor([m + [m[0]] * (max_members - len(m)) for m, _ in groups], device=device)
        slots = torch.stack([F.pad(s, (0, max_run - len(s)), value=int(s[0])) for _, s in groups])
        run_lens = torch.tensor([len(s) for _, s in groups], device=device)
        valid = torch.arange(max_run, device=device) < run_lens.unsqueeze(1)
        real = (torch.arange(max_members, device=device) < torch.tensor([len(m) for m, _ in groups], device=device).unsqueeze(1)).flatten()
        return cls(
            members=members.flatten(),
            slots=slots.flatten(),
            bias=None if bool(valid.all()) else _key_bias(valid, dtype).view(len(groups), 1, 1, max_run),
            real=real.nonzero().squeeze(1),
            rows=members.flatten()[real],
            num_groups=len(groups),
        )


class _DecodeContext:
    def __init__(
        self, pool: KVPool, out_slots: torch.Tensor, kv_slots: torch.Tensor, bias: torch.Tensor | None, shared: _SharedRuns | None
    ) -> None:
        self.pool, self.out_slots, self.kv_slots, self.bias, self.shared = pool, out_slots, kv_slots, bias, shared
        self.batch, self.max_len = kv_slots.shape

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.store(layer_id, self.out_slots, k, v)
        num_kv, dim = k.shape[1], k.shape[2]
        shape = (self.batch, self.max_len, num_kv, dim)
        ki = self.pool.k[layer_id].index_select(0, self.kv_slots.view(-1)).view(shape).transpose(1, 2)
        vi = self.pool.v[layer_id].index_select(0, self.kv_slots.view(-1)).view(shape).transpose(1, 2)
        # Queries as [batch, kv_heads, heads per kv head, dim], so GQA needs no copy of K/V.
        qg = q.view(self.batch, num_kv, -1, dim)
        if self.shared is None:
            if q.dtype == torch.float32 or q.device.type != "cpu":
                return F.scaled_dot_product_attention(q.unsqueeze(2), ki, vi, attn_mask=self.bias, enable_gqa=True).flatten(1)
            # bf16 on CPU: SDPA's GQA path ran 7-14x slower than two matmuls and a softmax on
            # 32 x 64 to 8 x 2000 decode shapes (it copies K/V per query head, then a slow bf16
            # kernel). In fp32 its flash kernel wins at long contexts, so fp32 keeps it. The bf16
            # matmuls need K/V contiguous per head: on the strided view they ran 10x slower.
            ki, vi = ki.contiguous(), vi.contiguous()
            scores = torch.matmul(qg, ki.transpose(-1, -2)) * dim**-0.5
            if self.bias is not None:
                scores = scores + self.bias
            return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(vi.dtype), vi).flatten(1)
        out, lse = _attention_with_lse(qg, ki, vi, self.bias)
        # All groups' members' queries against their group's shared run, in one call.
        s, per_kv = self.shared, qg.shape[2]
        qs = qg.index_select(0, s.members).view(s.num_groups, -1, num_kv, per_kv, dim).transpose(1, 2)
        run_shape = (s.num_groups, -1, num_kv, dim)
        ks = self.pool.k[layer_id].index_select(0, s.slots).view(run_shape).transpose(1, 2)
        vs = self.pool.v[layer_id].index_select(0, s.slots).view(run_shape).transpose(1, 2)
        o, l = _attention_with_lse(qs.flatten(2, 3), ks, vs, s.bias)
        # Back to one row per member; a request outside every group keeps an empty run (lse -inf),
        # which leaves its own result unchanged in the merge.
        o = o.view(s.num_groups, num_kv, -1, per_kv, dim).transpose(1, 2).flatten(0, 1).index_select(0, s.real)
        l = l.view(s.num_groups, num_kv, -1, per_kv, 1).transpose(1, 2).flatten(0, 1).index_select(0, s.real)
        out_shared = torch.zeros_like(out).index_copy_(0, s.rows, o)
        lse_shared = torch.full_like(lse, float("-inf")).index_copy_(0, s.rows, l)
        total = torch.logaddexp(lse, lse_shared)
        merged = out * torch.exp(lse - total) + out_shared * torch.exp(lse_shared - total)
        return merged.to(q.dtype).flatten(1)  # the flash kernel's lse is float32 whatever the dtype


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
        fresh: list[tuple[int, int]] = []
        extending: list[tuple[int, int, int, int]] = []  # (first token row, new tokens, prefix, table row)
        q_start = 0
        for req, n in zip(batch.reqs, batch.extend_lens):
            if req.device_len == 0:
                fresh.append((q_start, n))
            else:
                extending.append((q_start, n, req.device_len, req.row))
            q_start += n
        buckets = _padding_buckets([e[1] for e in extending], [e[1] + e[2] for e in extending])
        cached = [_CachedPrefill.build(self.page_table, [extending[i] for i in b]) for b in buckets]
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
        for members, run_len in groups:
            starts[members] = run_len
        # Each request's own part: from its shared run's end (or 0) to its length, left-aligned.
        own_lens = kv_lens - starts
        max_len = int(own_lens.max())
        positions = torch.arange(max_len, device=device).unsqueeze(0)
        valid = positions < own_lens.unsqueeze(1)
        # Entries past a request's length are stale but valid slot ids: read, then masked out.
        gather_at = (starts.unsqueeze(1) + positions).clamp(max=slot_rows.shape[1] - 1)
        kv_slots = torch.gather(slot_rows, 1, gather_at)
        dtype = self.pool.k.dtype
        bias = None if bool(valid.all()) else _key_bias(valid, dtype).view(len(batch.reqs), 1, 1, max_len)
        shared = _SharedRuns.build([(m, slot_rows[m[0], :n]) for m, n in groups], dtype) if groups else None
        return _DecodeContext(self.pool, batch.out_slots, kv_slots.contiguous(), bias, shared)
