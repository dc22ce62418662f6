"""The torch attention backend against plain softmax attention computed request by request."""

from __future__ import annotations

import pytest
import torch

from minisgl.attention.base import create_backend
from minisgl.attention.torch_backend import MIN_SHARED_PREFIX, _padding_buckets, _shared_groups
from minisgl.engine.batch import Batch
from minisgl.kvcache.pool import KVPool
from minisgl.request import Req
from minisgl.sampling import SamplingParams

HEADS, KV_HEADS, DIM, SLOTS = 6, 2, 16, 4096


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query [heads, dim] over keys [len, kv_heads, dim]."""
    rep = HEADS // KV_HEADS
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("hd,lhd->hl", q, k) / DIM**0.5
    return torch.einsum("hl,lhd->hd", torch.softmax(scores, dim=-1), v).flatten()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["shared", "mixed", "private"])
def test_decode_matches_reference(layout: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    pool = KVPool(1, SLOTS, 1, KV_HEADS, DIM, dtype, torch.device("cpu"))
    pool.k.normal_(generator=g)
    pool.v.normal_(generator=g)
    table = torch.zeros(8, 512, dtype=torch.int64)
    free = torch.randperm(SLOTS, generator=g)
    prefix_a, prefix_b = free[:200], free[200:300]
    used = 300
    lens = [230, 201, 260, 150, 101, 90, 300, 120]
    reqs = []
    for row, n in enumerate(lens):
        shared = {"shared": prefix_a, "mixed": (prefix_a if row < 3 else prefix_b if row < 6 else free[:0]), "private": free[:0]}[layout]
        shared = shared[: n - 1]
        own = free[used : used + n - len(shared)]
        used += len(own)
        table[row, :n] = torch.cat([shared, own])
        req = Req(row, [0] * n, SamplingParams())
        req.row, req.device_len = row, n - 1
        reqs.append(req)
    backend = create_backend("torch", pool, table, HEADS, KV_HEADS, DIM)
    batch = Batch.build(reqs, [1] * len(reqs), False, table)
    ctx = backend.prepare(batch)
    assert (ctx.shared is not None) == (layout != "private")
    q, new_k, new_v = (torch.randn(len(reqs), h, DIM, generator=g).to(dtype) for h in (HEADS, KV_HEADS, KV_HEADS))
    out = ctx.attend(0, q, new_k, new_v)
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for i, n in enumerate(lens):
        slots = table[i, :n]
        expected = reference(q[i].float(), pool.k[0][slots].float(), pool.v[0][slots].float())
        torch.testing.assert_close(out[i].float(), expected, rtol=tol, atol=tol)
    # The new token's K/V was written in place at its slot.
    torch.testing.assert_close(pool.k[0][batch.out_slots], new_k)


def test_shared_groups_need_a_long_common_run() -> None:
    rows = torch.arange(400).repeat(4, 1)
    rows[2, MIN_SHARED_PREFIX - 1 :] += 1000  # shares one slot too few with the others
    lens = torch.tensor([300, 350, 300, 120])
    groups = _shared_groups(rows, lens)
    assert groups == [([0, 1, 3], 119)]


def test_padding_buckets_keep_one_long_extension_apart() -> None:
    new_lens = [30, 31, 128, 29, 32]
    buckets = _padding_buckets(new_lens, [n + 512 for n in new_lens])
    assert sorted(map(sorted, buckets)) == [[0, 1, 3, 4], [2]]
    assert _padding_buckets([1] * 4, [100, 3000, 110, 2900]) == [[0, 2], [3, 1]]


# (cached prefix, new tokens) per request, and the padded calls the prefix-extending ones need.
@pytest.mark.parametrize(
    "shapes, calls", [([(0, 20), (100, 7), (0, 5), (37, 40)], 2), ([(150, 3), (10, 60), (150, 4), (0, 9), (3, 1)], 3)]
)
def test_prefill_with_and_without_cached_prefix_matches_reference(shapes: list[tuple[int, int]], calls: int) -> None:
    g = torch.Generator().manual_seed(1)
    pool = KVPool(1, SLOTS, 1, KV_HEADS, DIM, torch.float32, torch.device("cpu"))
    pool.k.normal_(generator=g)
    pool.v.normal_(generator=g)
    table = torch.randperm(SLOTS, generator=g)[: len(shapes) * 256].view(len(shapes), 256).clone()
    reqs = []
    for row, (prefix, n) in enumerate(shapes):
        req = Req(row, [0] * (prefix + n), SamplingParams())
        req.row, req.device_len = row, prefix
        reqs.append(req)
    backend = create_backend("torch", pool, table, HEADS, KV_HEADS, DIM)
    batch = Batch.build(reqs, [n for _, n in shapes], True, table)
    tokens = sum(n for _, n in shapes)
    q = torch.randn(tokens, HEADS, DIM, generator=g)
    k = torch.randn(tokens, KV_HEADS, DIM, generator=g)
    v = torch.randn(tokens, KV_HEADS, DIM, generator=g)
    ctx = backend.prepare(batch)
    assert len(ctx.cached) == calls
    out = ctx.attend(0, q, k, v)
    row = 0
    for r, (prefix, n) in enumerate(shapes):
        for i in range(n):
            slots = table[r, : prefix + i + 1]  # the request's keys up to and including this token
            expected = reference(q[row], pool.k[0][slots], pool.v[0][slots])
            torch.testing.assert_close(out[row], expected, rtol=1e-5, atol=1e-5)
            row += 1
