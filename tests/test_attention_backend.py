"""Every attention strategy, driven with hand-built batches (no scheduler, no requests) against
plain softmax attention computed request by request."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from minisgl.attention.decode import (
    CascadeDecode,
    MatmulDecode,
    PagedDecode,
    SdpaDecode,
    shared_groups,
)
from minisgl.attention.prefill import (
    CachedPrefill,
    FreshPrefill,
    PagedPrefill,
    PrefillAttention,
    SingleFreshPrefill,
    padding_buckets,
)
from minisgl.attention.registry import ATTENTION_BACKENDS
from minisgl.attention.torch_backend import PerLayerWindow
from minisgl.batch import AttentionKind, Batch
from minisgl.kernels.native import CpuKernels
from minisgl.kvcache.pool import KVPool
from minisgl.tuning import MIN_SHARED_PREFIX
from tests.conftest import c_kernels_or_skip

HEADS, KV_HEADS, DIM, SLOTS = 6, 2, 16, 4096


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query [heads, dim] over keys [len, kv_heads, dim]."""
    rep = HEADS // KV_HEADS
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("hd,lhd->hl", q, k) / DIM**0.5
    return torch.einsum("hl,lhd->hd", torch.softmax(scores, dim=-1), v).flatten()


def random_pool(dtype: torch.dtype, g: torch.Generator, layers: int = 1) -> KVPool:
    pool = KVPool(layers, SLOTS, 1, KV_HEADS, DIM, dtype, torch.device("cpu"))
    pool.k.normal_(generator=g)
    pool.v.normal_(generator=g)
    return pool


def hand_built_batch(
    table: torch.Tensor, prefix_lens: list[int], extend_lens: list[int], attention: AttentionKind
) -> Batch:
    """Request i uses page-table row i: ``extend_lens[i]`` new tokens after ``prefix_lens[i]`` in the pool."""
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(prefix_lens, extend_lens)])
    token_rows = torch.repeat_interleave(torch.arange(len(extend_lens)), torch.tensor(extend_lens))
    return Batch(
        attention=attention,
        input_ids=torch.zeros(len(positions), dtype=torch.int64),
        positions=positions,
        out_slots=table[token_rows, positions],
        table_rows=torch.arange(len(extend_lens)),
        prefix_lens=torch.tensor(prefix_lens),
        extend_lens=torch.tensor(extend_lens),
        sample_rows=torch.cumsum(torch.tensor(extend_lens), 0) - 1,
    )


def choose_kernels(c_kernels: bool) -> CpuKernels | None:
    """The C kernels (skipped where they do not build), or None: torch's strategies."""
    return c_kernels_or_skip() if c_kernels else None


# (layout of shared KV runs, dtype, C kernels built) → the decode strategy the backend must choose.
@pytest.mark.parametrize(
    "layout, dtype, c_kernels, strategy",
    [
        ("private", torch.float32, True, PagedDecode),
        ("shared", torch.float32, True, PagedDecode),
        ("mixed", torch.float32, True, PagedDecode),
        ("private", torch.float32, False, SdpaDecode),
        ("private", torch.bfloat16, False, MatmulDecode),
        ("shared", torch.float32, False, CascadeDecode),
        ("mixed", torch.float32, False, CascadeDecode),
        ("shared", torch.bfloat16, False, CascadeDecode),
        ("mixed", torch.bfloat16, False, CascadeDecode),
    ],
)
def test_decode_strategies_match_reference(
    layout: str, dtype: torch.dtype, c_kernels: bool, strategy: type
) -> None:
    kernels = choose_kernels(c_kernels)
    g = torch.Generator().manual_seed(0)
    pool = random_pool(dtype, g)
    table = torch.zeros(8, 512, dtype=torch.int64)
    free = torch.randperm(SLOTS, generator=g)
    prefix_a, prefix_b = free[:200], free[200:300]
    used = 300
    lens = [230, 201, 260, 150, 101, 90, 300, 120]
    for row, n in enumerate(lens):
        shared = {"shared": prefix_a, "mixed": (prefix_a if row < 3 else prefix_b if row < 6 else free[:0]), "private": free[:0]}[layout]
        shared = shared[: n - 1]
        own = free[used : used + n - len(shared)]
        used += len(own)
        table[row, :n] = torch.cat([shared, own])
    backend = ATTENTION_BACKENDS.get("torch")(pool, table, HEADS, KV_HEADS, DIM, kernels=kernels)
    batch = hand_built_batch(table, [n - 1 for n in lens], [1] * len(lens), AttentionKind.DECODE)
    ctx = backend.prepare(batch)
    assert type(ctx) is strategy
    q, new_k, new_v = (torch.randn(len(lens), h, DIM, generator=g).to(dtype) for h in (HEADS, KV_HEADS, KV_HEADS))
    out = ctx.attend(0, q, new_k, new_v)
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for i, n in enumerate(lens):
        slots = table[i, :n]
        expected = reference(q[i].float(), pool.k[0][slots].float(), pool.v[0][slots].float())
        torch.testing.assert_close(out[i].float(), expected, rtol=tol, atol=tol)
    # The new token's K/V was written in place at its slot.
    torch.testing.assert_close(pool.k[0][batch.out_slots], new_k)


@pytest.mark.parametrize("c_kernels, strategy", [(True, PagedDecode), (False, SdpaDecode)])
def test_decode_with_fp32_queries_reads_a_bf16_pool(c_kernels: bool, strategy: type) -> None:
    """A quantized model's 16-bit KV pool under fp32 queries: the C kernel reads the pool's bf16 values in
    place (multiplying them by queries and softmax weights rounded to bf16 where decode_attention_bf16),
    torch's strategies cast what they gather to fp32; the new K/V are stored rounded."""
    kernels = choose_kernels(c_kernels)
    g = torch.Generator().manual_seed(1)
    pool = random_pool(torch.bfloat16, g)
    lens = [40, 1, 300]
    table = torch.randperm(SLOTS, generator=g)[: 3 * 512].view(3, 512)
    backend = ATTENTION_BACKENDS.get("torch")(pool, table, HEADS, KV_HEADS, DIM, (), torch.float32, kernels)
    batch = hand_built_batch(table, [n - 1 for n in lens], [1] * len(lens), AttentionKind.DECODE)
    ctx = backend.prepare(batch)
    assert type(ctx) is strategy
    q, new_k, new_v = (torch.randn(len(lens), h, DIM, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS))
    out = ctx.attend(0, q, new_k, new_v)
    assert out.dtype == torch.float32
    assert torch.equal(pool.k[0][batch.out_slots], new_k.bfloat16())  # rounded to nearest, as torch casts
    assert torch.equal(pool.v[0][batch.out_slots], new_v.bfloat16())
    for i, n in enumerate(lens):
        slots = table[i, :n]
        if kernels is not None and kernels.decode_attention_bf16:  # the rounded queries'; the weights' rounding
            expected = reference(q[i].bfloat16().float(), pool.k[0][slots].float(), pool.v[0][slots].float())
            torch.testing.assert_close(out[i], expected, rtol=1e-2, atol=5e-3)
        else:
            expected = reference(q[i], pool.k[0][slots].float(), pool.v[0][slots].float())
            torch.testing.assert_close(out[i], expected, rtol=1e-5, atol=1e-5)


def test_prefill_attends_its_fresh_kv_as_the_pool_holds_it() -> None:
    """With a bf16 pool, a prefill that attends its own fresh K/V sees them rounded like a later
    pass that reads them back: a cached prefix gives the same result as a fresh one."""
    g = torch.Generator().manual_seed(2)
    pool = random_pool(torch.bfloat16, g)
    table = torch.randperm(SLOTS, generator=g)[:512].view(1, 512)
    backend = ATTENTION_BACKENDS.get("torch")(pool, table, HEADS, KV_HEADS, DIM, (), torch.float32)
    n = 20
    q, k, v = (torch.randn(n, h, DIM, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS))
    fresh = backend.prepare(hand_built_batch(table, [0], [n], AttentionKind.EXTEND)).attend(0, q, k, v)
    cached = backend.prepare(hand_built_batch(table, [n - 1], [1], AttentionKind.EXTEND))
    assert not isinstance(cached, SingleFreshPrefill)
    again = cached.attend(0, q[-1:], k[-1:], v[-1:])
    torch.testing.assert_close(again[0], fresh[-1], rtol=1e-5, atol=1e-5)


def test_prefill_on_a_bf16_pool_runs_the_c_kernel_where_the_cpu_has_avx512_bf16() -> None:
    """Fresh prompts, cached-prefix extensions and a decode token riding along, in one call of the C
    kernel over the pool (bf16 products: a bf16 tolerance); where its build has no body for the CPU, torch's
    strategies run. Either way a token attends the same extended after its cached prefix as in one
    pass with it."""
    kernels = c_kernels_or_skip()
    g = torch.Generator().manual_seed(3)
    pool = random_pool(torch.bfloat16, g)
    shapes = [(0, 20), (100, 7), (37, 40), (64, 1)]
    table = torch.randperm(SLOTS, generator=g)[: len(shapes) * 256].view(len(shapes), 256).clone()
    backend = ATTENTION_BACKENDS.get("torch")(pool, table, HEADS, KV_HEADS, DIM, (), torch.float32, kernels)
    batch = hand_built_batch(table, [p for p, _ in shapes], [n for _, n in shapes], AttentionKind.EXTEND)
    tokens = sum(n for _, n in shapes)
    q, k, v = (torch.randn(tokens, h, DIM, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS))
    ctx = backend.prepare(batch)
    assert isinstance(ctx, PagedPrefill) == kernels.runs_prefill_attention
    out = ctx.attend(0, q, k, v)
    assert torch.equal(pool.k[0][batch.out_slots], k.bfloat16())
    row = 0
    for r, (prefix, n) in enumerate(shapes):
        for i in range(n):
            slots = table[r, : prefix + i + 1]
            expected = reference(q[row], pool.k[0][slots].float(), pool.v[0][slots].float())
            torch.testing.assert_close(out[row], expected, rtol=2e-2, atol=2e-2)
            row += 1
    # Request 2's last 15 tokens (rows 52-66) again, its first 25 now a cached prefix.
    alone = ATTENTION_BACKENDS.get("torch")(pool, table[2:3].clone(), HEADS, KV_HEADS, DIM, (), torch.float32, kernels)
    last = alone.prepare(hand_built_batch(table[2:3], [62], [15], AttentionKind.EXTEND))
    again = last.attend(0, q[52:67], k[52:67], v[52:67])
    if kernels.runs_prefill_attention:
        assert torch.equal(again, out[52:67])
    else:
        torch.testing.assert_close(again, out[52:67], rtol=1e-5, atol=1e-5)


def test_decode_rows_of_an_extend_pass_attend_as_a_decode_pass_does() -> None:
    """A request decoding (its token and two draft tokens, all sampled) in a pass where another request
    prefills: its rows go through the decode kernel, the same bits as in a decode pass of its own; the
    prefill kernel takes the other request."""
    kernels = c_kernels_or_skip()
    if not kernels.runs_prefill_attention:
        pytest.skip(f"the {kernels.variant.name} build has no prefill attention body for this CPU")
    g = torch.Generator().manual_seed(4)
    pool = random_pool(torch.bfloat16, g)
    table = torch.randperm(SLOTS, generator=g)[: 2 * 512].view(2, 512).clone()
    backend = ATTENTION_BACKENDS.get("torch")(pool, table, HEADS, KV_HEADS, DIM, (), torch.float32, kernels)
    q, k, v = (torch.randn(43, h, DIM, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS))
    mixed = dataclasses.replace(  # request 0: 40 tokens after 10 cached; request 1: positions 299-301
        hand_built_batch(table, [10, 299], [40, 3], AttentionKind.EXTEND), sample_rows=torch.tensor([39, 40, 41, 42])
    )
    ctx = backend.prepare(mixed)
    assert isinstance(ctx, PagedPrefill) and ctx.decoding is not None
    out = ctx.attend(0, q, k, v)
    positions = torch.tensor([299, 300, 301])
    decode = Batch(
        attention=AttentionKind.DECODE, input_ids=torch.zeros(3, dtype=torch.int64), positions=positions,
        out_slots=table[1, positions], table_rows=torch.tensor([1, 1, 1]), prefix_lens=positions,
        extend_lens=torch.ones(3, dtype=torch.int64), sample_rows=torch.arange(3),
    )  # fmt: skip
    alone = backend.prepare(decode)
    assert isinstance(alone, PagedDecode)
    assert torch.equal(alone.attend(0, q[40:], k[40:], v[40:]), out[40:])
    for i in range(40):  # request 0 against plain attention, at a bf16 tolerance
        slots = table[0, : 10 + i + 1]
        expected = reference(q[i], pool.k[0][slots].float(), pool.v[0][slots].float())
        torch.testing.assert_close(out[i], expected, rtol=2e-2, atol=2e-2)


def test_shared_groups_need_a_long_common_run() -> None:
    rows = torch.arange(400).repeat(4, 1)
    rows[2, MIN_SHARED_PREFIX - 1 :] += 1000  # shares one slot too few with the others
    lens = torch.tensor([300, 350, 300, 120])
    groups = shared_groups(rows, lens)
    assert groups == [([0, 1, 3], 119)]


def test_padding_buckets_keep_one_long_extension_apart() -> None:
    new_lens = [30, 31, 128, 29, 32]
    buckets = padding_buckets(new_lens, [n + 512 for n in new_lens])
    assert sorted(map(sorted, buckets)) == [[0, 1, 3, 4], [2]]
    assert padding_buckets([1] * 4, [100, 3000, 110, 2900]) == [[0, 2], [3, 1]]


# (prefix already in the pool, new tokens) per request, and the parts the backend must build: how
# many requests attend their fresh K/V directly, and how many padded calls the extending ones need.
@pytest.mark.parametrize(
    "shapes, fresh, calls",
    [
        ([(0, 20), (100, 7), (0, 5), (37, 40)], 2, 2),
        ([(150, 3), (10, 60), (150, 4), (0, 9), (3, 1)], 1, 3),
        ([(64, 12), (5, 1)], 0, 2),
        ([(0, 33)], 1, 0),
    ],
)
def test_prefill_strategies_match_reference(shapes: list[tuple[int, int]], fresh: int, calls: int) -> None:
    g = torch.Generator().manual_seed(1)
    pool = random_pool(torch.float32, g)
    table = torch.randperm(SLOTS, generator=g)[: len(shapes) * 256].view(len(shapes), 256).clone()
    backend = ATTENTION_BACKENDS.get("torch")(pool, table, HEADS, KV_HEADS, DIM)
    batch = hand_built_batch(table, [p for p, _ in shapes], [n for _, n in shapes], AttentionKind.EXTEND)
    tokens = sum(n for _, n in shapes)
    q = torch.randn(tokens, HEADS, DIM, generator=g)
    k = torch.randn(tokens, KV_HEADS, DIM, generator=g)
    v = torch.randn(tokens, KV_HEADS, DIM, generator=g)
    ctx = backend.prepare(batch)
    if len(shapes) == 1 and shapes[0][0] == 0:
        assert isinstance(ctx, SingleFreshPrefill)
    else:
        assert isinstance(ctx, PrefillAttention)
        runs = [run for p in ctx.parts if isinstance(p, FreshPrefill) for run in p.runs]
        assert len(runs) == fresh
        assert sum(isinstance(p, CachedPrefill) for p in ctx.parts) == calls
    out = ctx.attend(0, q, k, v)
    row = 0
    for r, (prefix, n) in enumerate(shapes):
        for i in range(n):
            slots = table[r, : prefix + i + 1]  # the request's keys up to and including this token
            expected = reference(q[row], pool.k[0][slots], pool.v[0][slots])
            torch.testing.assert_close(out[row], expected, rtol=1e-5, atol=1e-5)
            row += 1
    torch.testing.assert_close(pool.v[0][batch.out_slots], v)


# Sliding windows: each request attends to its last ``WINDOW`` keys (decode), or each query to the
# ``window`` positions ending at its own (prefill).
WINDOW = 120


@pytest.mark.parametrize(
    "dtype, c_kernels, strategy",
    [(torch.float32, True, PagedDecode), (torch.float32, False, SdpaDecode), (torch.bfloat16, False, MatmulDecode)],
)
def test_windowed_decode_reads_the_last_window_keys_and_no_shared_run(
    dtype: torch.dtype, c_kernels: bool, strategy: type
) -> None:
    kernels = choose_kernels(c_kernels)
    g = torch.Generator().manual_seed(2)
    pool = random_pool(dtype, g)
    lens = [230, 201, 90, 300]
    free = torch.randperm(SLOTS, generator=g)
    table = torch.zeros(len(lens), 512, dtype=torch.int64)
    for row, n in enumerate(lens):  # all share a 200-slot prefix: full attention would use cascade
        table[row, :n] = torch.cat([free[: min(n - 1, 200)], free[1000 + 300 * row :][: n - min(n - 1, 200)]])
    backend = ATTENTION_BACKENDS.get("torch")(pool, table, HEADS, KV_HEADS, DIM, layer_windows=(WINDOW,), kernels=kernels)
    batch = hand_built_batch(table, [n - 1 for n in lens], [1] * len(lens), AttentionKind.DECODE)
    ctx = backend.prepare(batch)
    assert type(ctx) is strategy
    q, new_k, new_v = (torch.randn(len(lens), h, DIM, generator=g).to(dtype) for h in (HEADS, KV_HEADS, KV_HEADS))
    out = ctx.attend(0, q, new_k, new_v)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for i, n in enumerate(lens):
        slots = table[i, max(0, n - WINDOW) : n]
        expected = reference(q[i].float(), pool.k[0][slots].float(), pool.v[0][slots].float())
        torch.testing.assert_close(out[i].float(), expected, rtol=tol, atol=tol)


# (prefix, new tokens) per request, the window of layer 1 (layer 0 attends fully), and the parts of
# the windowed layer's context: requests attending their fresh K/V directly (nothing cached and no
# more new tokens than the window), and padded calls for the rest.
@pytest.mark.parametrize(
    "shapes, window, fresh, calls",
    [
        ([(0, 20), (100, 7), (0, 5), (37, 40)], 16, 1, 3),
        ([(150, 3), (10, 60), (150, 4), (0, 9), (3, 1)], 8, 0, 4),
        ([(0, 33)], 40, 1, 0),
        ([(0, 33)], 8, 0, 1),
    ],
)
def test_windowed_prefill_per_layer_matches_reference(
    shapes: list[tuple[int, int]], window: int, fresh: int, calls: int
) -> None:
    g = torch.Generator().manual_seed(3)
    pool = random_pool(torch.float32, g, layers=2)
    table = torch.randperm(SLOTS, generator=g)[: len(shapes) * 256].view(len(shapes), 256).clone()
    backend = ATTENTION_BACKENDS.get("torch")(pool, table, HEADS, KV_HEADS, DIM, layer_windows=(None, window))
    batch = hand_built_batch(table, [p for p, _ in shapes], [n for _, n in shapes], AttentionKind.EXTEND)
    tokens = sum(n for _, n in shapes)
    q, k, v = (torch.randn(tokens, h, DIM, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS))
    ctx = backend.prepare(batch)
    assert isinstance(ctx, PerLayerWindow)
    windowed = ctx.contexts[1]
    if fresh == 1 and calls == 0:
        assert isinstance(windowed, SingleFreshPrefill)
    else:
        assert isinstance(windowed, PrefillAttention)
        assert len([run for p in windowed.parts if isinstance(p, FreshPrefill) for run in p.runs]) == fresh
        assert sum(isinstance(p, CachedPrefill) for p in windowed.parts) == calls
    for layer, layer_window in enumerate((None, window)):
        out = ctx.attend(layer, q, k, v)
        row = 0
        for r, (prefix, n) in enumerate(shapes):
            for i in range(n):
                pos = prefix + i
                slots = table[r, max(0, pos - layer_window + 1) if layer_window else 0 : pos + 1]
                expected = reference(q[row], pool.k[layer][slots], pool.v[layer][slots])
                torch.testing.assert_close(out[row], expected, rtol=1e-5, atol=1e-5)
                row += 1
