"""Per-operation cost of the radix prefix cache as the tree grows.

Builds trees of about 1k, 10k and 100k nodes from requests that branch off earlier ones (as chat
turns and shared system prompts do), then times match_prefix, insert_prefix and a fixed small
evict on each. Eviction pops LRU leaves from a maintained heap, so its cost should stay flat.

Run: python -m benchmarks.radix_tree_bench
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.machine import load_average, machine_info
from minisgl.kvcache.radix_cache import RadixPrefixCache

VOCAB = 32000
EVICT_TOKENS = 16
TIMED_OPS = 2000


class Workload:
    """Random requests; most reuse a random-length prefix of an earlier one, so the tree branches."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.history: list[torch.Tensor] = []
        self.next_slot = 0

    def request(self) -> tuple[torch.Tensor, torch.Tensor]:
        tail = torch.randint(0, VOCAB, (self.rng.randint(16, 128),))
        if self.history and self.rng.random() < 0.8:
            parent = self.rng.choice(self.history)
            ids = torch.cat([parent[: self.rng.randint(1, len(parent))], tail])
        else:
            ids = tail
        self.history.append(ids)
        slots = torch.arange(self.next_slot, self.next_slot + len(ids))
        self.next_slot += len(ids)
        return ids, slots


def count_nodes(cache: RadixPrefixCache) -> int:
    return sum(1 for _ in cache._iter_nodes())


def per_op_us(ops: list[Callable[[], object]], chunks: int = 10) -> float:
    """Median over chunks of the mean cost per op, so a burst of load from other processes on the
    machine skews one chunk rather than the result."""
    size = max(1, len(ops) // chunks)
    costs = []
    for i in range(0, len(ops), size):
        chunk = ops[i : i + size]
        start = time.perf_counter()
        for op in chunk:
            op()
        costs.append((time.perf_counter() - start) / len(chunk) * 1e6)
    return statistics.median(costs)


def bench(target_nodes: int) -> dict[str, float]:
    cache = RadixPrefixCache("cpu")
    work = Workload(seed=target_nodes)
    torch.manual_seed(target_nodes)
    start = time.perf_counter()
    # Each insert adds a leaf and usually splits a node, so about 1.8 nodes per request.
    while True:
        for _ in range(max(1, target_nodes // 20)):
            cache.insert_prefix(*work.request())
        if count_nodes(cache) >= target_nodes:
            break
    build_s = time.perf_counter() - start
    nodes, tokens = count_nodes(cache), cache.size_info.total

    # Full hits on earlier requests: the walk is O(depth) dict lookups plus vectorized compares.
    queries = [work.rng.choice(work.history) for _ in range(TIMED_OPS)]
    match_us = per_op_us([lambda q=q: cache.match_prefix(q) for q in queries])
    depth = sum(cache.match_prefix(q).handle.cached_len for q in queries) / len(queries)

    requests = [work.request() for _ in range(TIMED_OPS)]
    insert_us = per_op_us([lambda r=r: cache.insert_prefix(*r) for r in requests])

    # For scale: what one evict would cost if it had to rescan the tree for the oldest leaf.
    scan_us = per_op_us([lambda: min(n.timestamp for n in cache._iter_nodes() if not n.children)] * 3)

    num_evicts = min(TIMED_OPS, cache.size_info.evictable // (2 * EVICT_TOKENS))
    evict_us = per_op_us([lambda: cache.evict(EVICT_TOKENS)] * num_evicts)
    cache.check_integrity()
    return {
        "nodes": nodes, "tokens": tokens, "build_s": build_s, "match_len": depth,
        "match_us": match_us, "insert_us": insert_us, "evict_us": evict_us, "scan_us": scan_us,
    }


def bench_long_prompt(length: int = 4000) -> float:
    """A long shared system prompt is one node: matching it is one dict lookup and one compare."""
    cache = RadixPrefixCache("cpu")
    prompt = torch.randint(0, VOCAB, (length,))
    cache.insert_prefix(prompt, torch.arange(length))
    query = torch.cat([prompt, torch.randint(0, VOCAB, (64,))])
    return per_op_us([lambda: cache.match_prefix(query)] * TIMED_OPS)


def main() -> None:
    print(machine_info(torch.get_num_threads()))
    print(f"load average: {load_average()}")
    print(f"timed ops per cell: {TIMED_OPS}; evict frees >= {EVICT_TOKENS} tokens per call; page_size 1\n")
    header = (
        f"{'nodes':>8} {'tokens':>10} {'build s':>8} {'avg hit':>8} {'match us':>9} {'insert us':>10} "
        f"{'evict us':>9} {'rescan us':>10}"
    )
    print(header)
    print("-" * len(header))
    for target in (1_000, 10_000, 100_000):
        r = bench(target)
        print(f"{r['nodes']:>8} {r['tokens']:>10} {r['build_s']:>8.2f} {r['match_len']:>8.0f} "
              f"{r['match_us']:>9.1f} {r['insert_us']:>10.1f} {r['evict_us']:>9.1f} {r['scan_us']:>10.0f}")
    print(f"\nmatch_prefix of a cached 4000-token prompt (+64 new tokens): {bench_long_prompt():.1f} us")
    print("rescan us = one pass over the tree to find the oldest leaf, i.e. an evict without the heap")


if __name__ == "__main__":
    main()
