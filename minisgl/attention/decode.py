"""Decode strategies: every request adds one token and attends its whole KV, gathered into a padded
[batch, max_len] layout with the padding masked out.

- ``PagedDecode``: fp32 queries on CPU with the engine's C kernels: keys and values read in place
  from the pool (fp32 or bf16) (``minisgl/kernels/cpu/paged_attention.c``), no gathered copy; the
  kernel finds the requests that share a run of slots itself and reads each shared chunk once. Over a
  bf16 pool its products are bf16 where ``CpuKernels.decode_attention_bf16`` (queries and softmax
  weights rounded), else fp32.
- ``SdpaDecode``: one SDPA call (fp32 on CPU without the C kernels, and CUDA).
- ``MatmulDecode``: bf16/fp16 queries on CPU, two matmuls and a softmax; SDPA's GQA path ran 7-14x slower
  on 32 x 64 to 8 x 2000 decode shapes (it copies K/V per query head, then a slow bf16 kernel).
- ``CascadeDecode``: when several requests share a long run of KV slots (a system prompt in the
  radix cache), gathering that run once per request per layer dominates the step. Those requests
  form a group whose shared run is gathered once and attended by all members' queries together (all
  groups in one padded call); each request's own suffix is attended separately, and the two partial
  results are merged exactly through their log-sum-exp.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minisgl.attention.ops import attention_with_lse, key_bias
from minisgl.batch import PagedKV
from minisgl.kernels.native import CpuKernels
from minisgl.kvcache.pool import KVPool
from minisgl.tuning import MIN_SHARED_PREFIX


class DecodeAttention:
    """Stores the new tokens' K/V, gathers each request's KV (``kv_slots``, padding masked by
    ``bias``), then ``compute``s one query per request over it."""

    paged: PagedKV | None = None

    def __init__(self, pool: KVPool, out_slots: torch.Tensor, kv_slots: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.pool, self.out_slots, self.kv_slots, self.bias = pool, out_slots, kv_slots, bias
        self.batch, self.max_len = kv_slots.shape

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.store(layer_id, self.out_slots, k, v)
        num_kv, dim = k.shape[1], k.shape[2]
        shape = (self.batch, self.max_len, num_kv, dim)
        ki = self.pool.k[layer_id].index_select(0, self.kv_slots.view(-1)).view(shape).transpose(1, 2).to(q.dtype)
        vi = self.pool.v[layer_id].index_select(0, self.kv_slots.view(-1)).view(shape).transpose(1, 2).to(q.dtype)
        # Queries as [batch, kv_heads, heads per kv head, dim], so GQA needs no copy of K/V.
        return self.compute(layer_id, q.view(self.batch, num_kv, -1, dim), ki, vi)

    def compute(self, layer_id: int, qg: torch.Tensor, ki: torch.Tensor, vi: torch.Tensor) -> torch.Tensor:
        """``qg``: [batch, kv_heads, heads per kv head, dim], ``ki``/``vi``: [batch, kv_heads, max_len, dim]
        → [batch, heads * dim]."""
        raise NotImplementedError


class PagedDecode(DecodeAttention):
    """Row b of ``paged.kv_slots`` holds request b's keys in its first ``paged.kv_lens[b]`` entries."""

    def __init__(self, pool: KVPool, paged: PagedKV, kernels: CpuKernels) -> None:
        super().__init__(pool, paged.out_slots, paged.kv_slots, None)
        self.paged, self.kernels = paged, kernels

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p = self.paged  # the new K/V are stored by the same call; the kernel reads q, k and v where they lie
        return self.kernels.paged_decode_attention(
            q, k, v, p.out_slots, p.k_pool[layer_id], p.v_pool[layer_id], p.kv_slots, p.kv_lens
        )


class SdpaDecode(DecodeAttention):
    def compute(self, layer_id: int, qg: torch.Tensor, ki: torch.Tensor, vi: torch.Tensor) -> torch.Tensor:
        q = qg.flatten(1, 2).unsqueeze(2)  # [batch, heads, 1, dim]
        return F.scaled_dot_product_attention(q, ki, vi, attn_mask=self.bias, enable_gqa=True).flatten(1)


class MatmulDecode(DecodeAttention):
    def compute(self, layer_id: int, qg: torch.Tensor, ki: torch.Tensor, vi: torch.Tensor) -> torch.Tensor:
        # The half-precision matmuls need K/V contiguous per head: on the strided view they ran 10x slower.
        ki, vi = ki.contiguous(), vi.contiguous()
        scores = torch.matmul(qg, ki.transpose(-1, -2)) * qg.shape[-1] ** -0.5
        if self.bias is not None:
            scores = scores + self.bias
        return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(vi.dtype), vi).flatten(1)


@dataclass(frozen=True)
class SharedRuns:
    """The shared KV runs of a decode batch's groups, attended in one padded call:
    [groups, kv_heads, max_members * heads per kv head, max_run]."""

    members: torch.Tensor  # [groups * max_members] batch index of each member (padding repeats one)
    slots: torch.Tensor  # [groups * max_run] each group's shared slots (padding repeats one)
    bias: torch.Tensor | None  # [groups, 1, 1, max_run] masks a shorter run's padding; None if none
    real: torch.Tensor  # positions in ``members`` that are not padding
    rows: torch.Tensor  # the batch indices at those positions
    num_groups: int

    @classmethod
    def build(cls, groups: list[tuple[list[int], torch.Tensor]], dtype: torch.dtype) -> SharedRuns:
        """``groups``: (member batch indices, shared slots) of each group."""
        device = groups[0][1].device
        max_members = max(len(m) for m, _ in groups)
        max_run = max(len(s) for _, s in groups)
        members = torch.tensor([m + [m[0]] * (max_members - len(m)) for m, _ in groups], device=device)
        slots = torch.stack([F.pad(s, (0, max_run - len(s)), value=int(s[0])) for _, s in groups])
        run_lens = torch.tensor([len(s) for _, s in groups], device=device)
        valid = torch.arange(max_run, device=device) < run_lens.unsqueeze(1)
        sizes = torch.tensor([len(m) for m, _ in groups], device=device)
        real = (torch.arange(max_members, device=device) < sizes.unsqueeze(1)).flatten()
        return cls(
            members=members.flatten(),
            slots=slots.flatten(),
            bias=None if bool(valid.all()) else key_bias(valid, dtype).view(len(groups), 1, 1, max_run),
            real=real.nonzero().squeeze(1),
            rows=members.flatten()[real],
            num_groups=len(groups),
        )


class CascadeDecode(DecodeAttention):
    """``kv_slots`` holds each request's own part only (after its group's shared run)."""

    def __init__(
        self, pool: KVPool, out_slots: torch.Tensor, kv_slots: torch.Tensor, bias: torch.Tensor | None, shared: SharedRuns
    ) -> None:
        super().__init__(pool, out_slots, kv_slots, bias)
        self.shared = shared

    def compute(self, layer_id: int, qg: torch.Tensor, ki: torch.Tensor, vi: torch.Tensor) -> torch.Tensor:
        out, lse = attention_with_lse(qg, ki, vi, self.bias)
        # All groups' members' queries against their group's shared run, in one call.
        s, num_kv, per_kv, dim = self.shared, qg.shape[1], qg.shape[2], qg.shape[3]
        qs = qg.index_select(0, s.members).view(s.num_groups, -1, num_kv, per_kv, dim).transpose(1, 2)
        run_shape = (s.num_groups, -1, num_kv, dim)
        ks = self.pool.k[layer_id].index_select(0, s.slots).view(run_shape).transpose(1, 2).to(qg.dtype)
        vs = self.pool.v[layer_id].index_select(0, s.slots).view(run_shape).transpose(1, 2).to(qg.dtype)
        o, l = attention_with_lse(qs.flatten(2, 3), ks, vs, s.bias)
        # Back to one row per member; a request outside every group keeps an empty run (lse -inf),
        # which leaves its own result unchanged in the merge.
        o = o.view(s.num_groups, num_kv, -1, per_kv, dim).transpose(1, 2).flatten(0, 1).index_select(0, s.real)
        l = l.view(s.num_groups, num_kv, -1, per_kv, 1).transpose(1, 2).flatten(0, 1).index_select(0, s.real)
        out_shared = torch.zeros_like(out).index_copy_(0, s.rows, o)
        lse_shared = torch.full_like(lse, float("-inf")).index_copy_(0, s.rows, l)
        total = torch.logaddexp(lse, lse_shared)
        merged = out * torch.exp(lse - total) + out_shared * torch.exp(lse_shared - total)
        return merged.to(qg.dtype).flatten(1)  # the flash kernel's lse is float32 whatever the dtype


def shared_groups(slot_rows: torch.Tensor, kv_lens: torch.Tensor) -> list[tuple[list[int], int]]:
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
