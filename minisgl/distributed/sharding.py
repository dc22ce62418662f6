"""Which slice of each weight a tensor-parallel rank holds (pure arithmetic, no communication).

Heads: with at least as many KV heads as ranks, each rank takes a contiguous range of KV heads, as
even as possible, together with the query heads that use them (SmolLM2 at TP=2: 3 KV heads → 2 + 1,
9 query heads → 6 + 3). With fewer KV heads than ranks, KV heads are replicated: the ranks are split
into equal teams, one per KV head, and each team shares out that head's query heads; every rank
stores the one KV head its query heads read.
"""

from __future__ import annotations

from dataclasses import dataclass


def even_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """Part ``index`` of ``range(n)`` cut into ``parts`` contiguous pieces whose sizes differ by at
    most one (the first ``n % parts`` pieces are the larger)."""
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


@dataclass(frozen=True)
class HeadShard:
    q: tuple[int, int]  # query heads [start, end)
    kv: tuple[int, int]  # KV heads [start, end)

    @property
    def num_q(self) -> int:
        return self.q[1] - self.q[0]

    @property
    def num_kv(self) -> int:
        return self.kv[1] - self.kv[0]


def shard_heads(num_heads: int, num_kv_heads: int, size: int, rank: int) -> HeadShard:
    """The heads rank ``rank`` of ``size`` computes; local query head i reads local KV head
    i // (num_q // num_kv), as in the unsharded model."""
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads do not split into {num_kv_heads} KV head groups")
    group = num_heads // num_kv_heads  # query heads per KV head
    if num_kv_heads >= size:
        kv = even_range(num_kv_heads, size, rank)
        return HeadShard((kv[0] * group, kv[1] * group), kv)
    if size % num_kv_heads:
        raise ValueError(
            f"tensor parallelism over {size} ranks needs the {num_kv_heads} KV heads to divide the ranks "
            f"evenly (or at least {size} KV heads)"
        )
    team = size // num_kv_heads  # ranks sharing one KV head
    if group < team:
        raise ValueError(f"{num_heads} query heads cannot give each of {size} ranks at least one")
    head = rank // team
    start, end = even_range(group, team, rank % team)
    return HeadShard((head * group + start, head * group + end), (head, head + 1))


def max_kv_heads(num_heads: int, num_kv_heads: int, size: int) -> int:
    """The most KV heads any rank stores: every rank sizes its KV pool with it, so that all ranks
    hold the same number of pages."""
    return max(shard_heads(num_heads, num_kv_heads, size, r).num_kv for r in range(size))
