"""Tests for the radix-tree prefix cache and its vectorized key compare."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minisgl.kernels.ops import fast_compare_key
from minisgl.kvcache.base import CacheHandle
from minisgl.kvcache.radix_cache import RadixPrefixCache
from minisgl.kvcache.registry import create_prefix_cache
from minisgl.scheduler.cache_manager import FreePages


def t(values: list[int] | range) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64)


def insert(cache: RadixPrefixCache, ids: list[int], slots: list[int] | range, namespace: str | None = None):
    result = cache.insert_prefix(t(ids), t(slots), namespace)
    cache.check_integrity()
    return result


def match(cache: RadixPrefixCache, ids: list[int], namespace: str | None = None) -> CacheHandle:
    handle = cache.match_prefix(t(ids), namespace).handle
    cache.check_integrity()
    return handle


def tree_state(cache: RadixPrefixCache) -> tuple[Any, ...]:
    """Everything a read-only call must leave as it was: every node (key, slots, locks, age,
    children), the clock, the eviction queue and the leaf set."""

    def node_state(node: Any) -> tuple[Any, ...]:
        children = sorted(node_state(child) for child in node.children.values())
        return (tuple(node.key.tolist()), tuple(node.value.tolist()), node.ref_count, node.timestamp, tuple(children))

    roots = {namespace: node_state(root) for namespace, root in cache._roots.items()}
    heap = sorted((timestamp, seq) for timestamp, seq, _ in cache._heap)
    return roots, cache._clock, heap, len(cache._leaves), cache.size_info


def count_nodes(cache: RadixPrefixCache) -> int:
    return sum(1 for _ in cache._iter_nodes())


def evict(cache: RadixPrefixCache, n: int) -> list[int]:
    freed = cache.evict(n)
    cache.check_integrity()
    assert freed.dtype == torch.int64
    return freed.tolist()


# ---- fast_compare_key ---------------------------------------------------------------------------


def test_fast_compare_key_examples() -> None:
    assert fast_compare_key(t([1, 2, 3]), t([1, 2, 3])) == 3
    assert fast_compare_key(t([1, 2, 3]), t([1, 9, 3])) == 1
    assert fast_compare_key(t([5]), t([6])) == 0
    assert fast_compare_key(t([1, 2]), t([1, 2, 3, 4])) == 2
    assert fast_compare_key(t([]), t([1])) == 0
    assert fast_compare_key(t(range(4000)), torch.arange(4000, dtype=torch.int32)) == 4000


@given(st.lists(st.integers(0, 2), max_size=40), st.lists(st.integers(0, 2), max_size=40))
def test_fast_compare_key_matches_python(a: list[int], b: list[int]) -> None:
    expected = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert fast_compare_key(t(a), t(b)) == expected


# ---- insert / match / split ---------------------------------------------------------------------


def test_registered_under_radix() -> None:
    cache = create_prefix_cache("radix", "cpu", page_size=4)
    assert isinstance(cache, RadixPrefixCache) and cache.page_size == 4


def test_insert_then_match() -> None:
    cache = RadixPrefixCache("cpu")
    result = insert(cache, [1, 2, 3, 4], range(10, 14))
    assert result.cached_len == 0
    assert result.handle.cached_len == 4
    assert result.handle.get_matched_indices().tolist() == [10, 11, 12, 13]

    handle = match(cache, [1, 2, 3, 4, 5])
    assert handle.cached_len == 4
    assert handle.get_matched_indices().tolist() == [10, 11, 12, 13]
    assert match(cache, [9, 1, 2]).cached_len == 0
    assert match(cache, []).cached_len == 0
    assert cache.size_info == (4, 0)


def test_insert_reports_cached_len_and_keeps_tree_slots() -> None:
    cache = RadixPrefixCache("cpu")
    insert(cache, [1, 2, 3], range(3))
    # The caller computed the whole prompt again into slots 10..14; the tree keeps its own copy of
    # the first 3 tokens (the caller frees 10..12) and takes ownership of 13, 14.
    result = insert(cache, [1, 2, 3, 4, 5], range(10, 15))
    assert result.cached_len == 3
    assert result.handle.cached_len == 5
    assert result.handle.get_matched_indices().tolist() == [0, 1, 2, 13, 14]
    assert cache.size_info.total == 5
    assert insert(cache, [1, 2, 3, 4, 5], range(20, 25)).cached_len == 5
    assert cache.size_info.total == 5


def test_match_splits_node_without_changing_content() -> None:
    cache = RadixPrefixCache("cpu")
    insert(cache, [1, 2, 3, 4], range(4))
    (node,) = cache._roots[None].children.values()
    assert node.key.tolist() == [1, 2, 3, 4]  # one unbranched run is one node

    handle = match(cache, [1, 2, 7])
    assert handle.cached_len == 2
    assert handle.get_matched_indices().tolist() == [0, 1]
    (head,) = cache._roots[None].children.values()
    assert head.key.tolist() == [1, 2]
    assert [child.key.tolist() for child in head.children.values()] == [[3, 4]]
    assert cache.size_info == (4, 0)
    assert match(cache, [1, 2, 3, 4]).get_matched_indices().tolist() == [0, 1, 2, 3]

    result = insert(cache, [1, 2, 5, 6], range(10, 14))
    assert result.cached_len == 2
    assert result.handle.get_matched_indices().tolist() == [0, 1, 12, 13]
    assert sorted(child.key.tolist()[0] for child in head.children.values()) == [3, 5]


def test_match_len_reads_without_splitting_or_touching() -> None:
    cache = RadixPrefixCache("cpu")
    insert(cache, [1, 2, 3, 4], range(4))
    insert(cache, [5, 6], range(10, 12))
    before = tree_state(cache)
    assert cache.match_len(t([1, 2, 7])) == 2  # ends inside the node [1, 2, 3, 4]
    assert cache.match_len(t([1, 2, 3, 4, 9])) == 4
    assert cache.match_len(t([9])) == 0
    assert cache.match_len(t([1, 2]), namespace="nobody") == 0
    assert tree_state(cache) == before and count_nodes(cache) == 2
    cache.check_integrity()
    # Peeking at [1, 2, ...] did not make it recent: it is still the oldest and goes first.
    assert evict(cache, 1) == [0, 1, 2, 3]


def test_match_len_agrees_with_match_prefix_on_pages() -> None:
    cache = RadixPrefixCache("cpu", page_size=4)
    insert(cache, list(range(12)), range(12))
    query = [*range(6), 99, 99]  # diverges inside the second page
    assert cache.match_len(t(query)) == 4 == match(cache, query).cached_len
    assert create_prefix_cache("naive", "cpu").match_len(t(query)) == 0


def test_handle_survives_a_later_split() -> None:
    cache = RadixPrefixCache("cpu")
    handle = insert(cache, [1, 2, 3, 4], range(4)).handle
    cache.lock_handle(handle)
    match(cache, [1, 2])  # splits the locked node; the head must inherit the lock
    assert cache.size_info == (0, 4)
    assert handle.get_matched_indices().tolist() == [0, 1, 2, 3]
    cache.lock_handle(handle, unlock=True)
    cache.check_integrity()
    assert cache.size_info == (4, 0)


def test_long_prompt_is_one_node() -> None:
    cache = RadixPrefixCache("cpu")
    prompt = list(range(4000))
    insert(cache, prompt, range(4000))
    assert len(cache._roots[None].children) == 1
    handle = match(cache, prompt + [1])
    assert handle.cached_len == 4000
    assert torch.equal(handle.get_matched_indices(), t(range(4000)))


def test_int32_inputs_give_int64_indices() -> None:
    cache = RadixPrefixCache("cpu")
    cache.insert_prefix(t([1, 2]).int(), t([7, 8]).int())
    indices = cache.match_prefix(t([1, 2]).int()).handle.get_matched_indices()
    assert indices.dtype == torch.int64 and indices.tolist() == [7, 8]
    cache.check_integrity()


def test_insert_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError):
        RadixPrefixCache("cpu").insert_prefix(t([1, 2, 3]), t([1, 2]))


def test_insert_does_not_alias_caller_tensors() -> None:
    cache = RadixPrefixCache("cpu")
    ids, slots = t([1, 2, 3]), t([4, 5, 6])
    cache.insert_prefix(ids, slots)
    ids[:] = 0
    slots[:] = 0
    assert match(cache, [1, 2, 3]).get_matched_indices().tolist() == [4, 5, 6]


# ---- page size 16 -------------------------------------------------------------------------------


def test_page_size_16_caches_whole_pages_only() -> None:
    cache = RadixPrefixCache("cpu", page_size=16)
    prompt = list(range(100, 130))  # 30 tokens: one whole page
    result = insert(cache, prompt, range(30))
    assert result.cached_len == 0
    assert result.handle.cached_len == 16
    assert result.handle.get_matched_indices().tolist() == list(range(16))
    assert cache.size_info == (16, 0)
    assert match(cache, prompt).cached_len == 16
    assert match(cache, prompt[:15]).cached_len == 0
    assert insert(cache, prompt[:10], range(10)).handle.cached_len == 0
    assert cache.size_info == (16, 0)


def test_page_size_16_split_lands_on_a_page_boundary() -> None:
    cache = RadixPrefixCache("cpu", page_size=16)
    a = list(range(48))
    insert(cache, a, range(48))
    b = a[:20] + [999] * 28  # diverges inside the second page
    handle = match(cache, b)
    assert handle.cached_len == 16
    assert handle.get_matched_indices().tolist() == list(range(16))
    result = insert(cache, b, range(100, 148))
    assert result.cached_len == 16
    assert result.handle.get_matched_indices().tolist() == list(range(16)) + list(range(116, 148))
    assert cache.size_info.total == 48 + 32
    # Two children under the 16-token head, indexed by their first page.
    (head,) = cache._roots[None].children.values()
    assert len(head.key) == 16 and len(head.children) == 2


def test_page_size_16_children_indexed_by_whole_first_page() -> None:
    cache = RadixPrefixCache("cpu", page_size=16)
    a = [0] * 16 + [1] * 16
    b = [0] * 16 + [1] * 15 + [2]  # same first token after the shared page, different page
    insert(cache, a, range(32))
    assert insert(cache, b, range(32, 64)).cached_len == 16
    assert match(cache, b).get_matched_indices().tolist() == list(range(16)) + list(range(48, 64))


# ---- locking ------------------------------------------------------------------------------------


def test_lock_moves_tokens_between_counters() -> None:
    cache = RadixPrefixCache("cpu")
    first = insert(cache, [1, 2, 3], range(3)).handle
    second = insert(cache, [1, 2, 4], range(10, 13)).handle
    cache.lock_handle(first)
    cache.check_integrity()
    assert cache.size_info == (1, 3)
    cache.lock_handle(second)
    cache.check_integrity()
    assert cache.size_info == (0, 4)
    cache.lock_handle(first, unlock=True)
    cache.check_integrity()
    assert cache.size_info == (1, 3)
    cache.lock_handle(second, unlock=True)
    cache.check_integrity()
    assert cache.size_info == (4, 0)


def test_locked_prefix_is_never_evicted() -> None:
    cache = RadixPrefixCache("cpu")
    locked = insert(cache, [1, 2, 3], range(3)).handle
    insert(cache, [1, 2, 4], range(10, 13))
    cache.lock_handle(locked)
    with pytest.raises(ValueError):
        cache.evict(2)
    cache.check_integrity()
    assert evict(cache, 1) == [12]
    assert cache.size_info == (0, 3)
    cache.lock_handle(locked, unlock=True)
    assert sorted(evict(cache, 3)) == [0, 1, 2]


def test_unlock_below_zero_raises() -> None:
    cache = RadixPrefixCache("cpu")
    handle = insert(cache, [1, 2], range(2)).handle
    with pytest.raises(RuntimeError):
        cache.lock_handle(handle, unlock=True)
    cache.lock_handle(handle)
    cache.lock_handle(handle, unlock=True)
    with pytest.raises(RuntimeError):
        cache.lock_handle(handle, unlock=True)
    cache.check_integrity()


def test_empty_handle_locks_are_no_ops() -> None:
    cache = RadixPrefixCache("cpu")
    handle = match(cache, [1, 2, 3])
    assert handle.cached_len == 0 and handle.get_matched_indices().tolist() == []
    cache.lock_handle(handle)
    cache.lock_handle(handle, unlock=True)
    cache.lock_handle(handle, unlock=True)
    cache.check_integrity()


def test_lock_churn_keeps_heap_bounded() -> None:
    cache = RadixPrefixCache("cpu")
    handle = insert(cache, [1, 2], range(2)).handle
    for _ in range(1000):
        cache.lock_handle(handle)
        cache.lock_handle(handle, unlock=True)
    cache.check_integrity()
    assert len(cache._heap) < 100
    assert sorted(evict(cache, 1)) == [0, 1]


# ---- eviction -----------------------------------------------------------------------------------


def test_evict_in_lru_order() -> None:
    cache = RadixPrefixCache("cpu")
    insert(cache, [1, 1], [10, 11])
    insert(cache, [2, 2], [20, 21])
    insert(cache, [3, 3], [30, 31])
    match(cache, [1, 1])  # now 2 is the least recently used
    assert evict(cache, 1) == [20, 21]  # whole nodes: may free more than asked
    assert evict(cache, 2) == [30, 31]
    assert evict(cache, 2) == [10, 11]
    assert cache.size_info == (0, 0)


def test_split_off_tail_keeps_its_age() -> None:
    cache = RadixPrefixCache("cpu")
    insert(cache, [1, 2, 3, 4], [10, 11, 12, 13])
    insert(cache, [5, 6], [50, 51])
    match(cache, [1, 2])  # head [1, 2] is fresh; tail [3, 4] is still the oldest
    assert evict(cache, 1) == [12, 13]
    assert evict(cache, 1) == [50, 51]
    assert evict(cache, 1) == [10, 11]


def test_parent_becomes_a_candidate_once_childless() -> None:
    cache = RadixPrefixCache("cpu")
    insert(cache, [1, 2, 3], [10, 11, 12])
    insert(cache, [1, 2, 4], [20, 21, 22])
    assert sorted(evict(cache, 4)) == [10, 11, 12, 22]
    assert cache.size_info == (0, 0)


def test_evict_edge_cases() -> None:
    cache = RadixPrefixCache("cpu")
    assert evict(cache, 0) == [] and evict(cache, -3) == []
    insert(cache, [1, 2], range(2))
    with pytest.raises(ValueError):
        cache.evict(3)
    cache.check_integrity()
    assert cache.size_info == (2, 0)


def test_reset() -> None:
    cache = RadixPrefixCache("cpu")
    handle = insert(cache, [1, 2, 3], range(3)).handle
    insert(cache, [1, 5], [7, 8], namespace="x")
    cache.lock_handle(handle)
    with pytest.raises(RuntimeError):
        cache.reset()
    cache.lock_handle(handle, unlock=True)
    assert sorted(cache.reset().tolist()) == [0, 1, 2, 7, 8]
    cache.check_integrity()
    assert cache.size_info == (0, 0)
    assert match(cache, [1, 2, 3]).cached_len == 0
    assert cache.reset().tolist() == []


# ---- namespaces ---------------------------------------------------------------------------------


def test_namespaces_are_isolated() -> None:
    cache = RadixPrefixCache("cpu")
    insert(cache, [1, 2, 3], range(3), namespace="alice")
    assert match(cache, [1, 2, 3]).cached_len == 0
    assert match(cache, [1, 2, 3], namespace="bob").cached_len == 0
    assert match(cache, [1, 2, 3], namespace="alice").cached_len == 3
    assert insert(cache, [1, 2, 3], range(10, 13)).cached_len == 0
    assert match(cache, [1, 2, 3]).get_matched_indices().tolist() == [10, 11, 12]
    assert match(cache, [1, 2, 3], namespace="alice").get_matched_indices().tolist() == [0, 1, 2]
    assert cache.size_info == (6, 0)
    assert sorted(evict(cache, 6)) == [0, 1, 2, 10, 11, 12]
    assert "alice" not in cache._roots  # an emptied namespace does not linger
    assert insert(cache, [1, 2], range(2), namespace="alice").cached_len == 0


# ---- stateful test against a reference model ----------------------------------------------------

NAMESPACES = st.sampled_from([None, "ns"])


class RadixCacheMachine(RuleBasedStateMachine):
    """Drives the cache with random operations and compares every answer with a reference.

    The reference maps each cached page-aligned prefix (namespace, token tuple) to the KV slots of
    its last page; it is prefix-closed, and the cached part of a request is its longest prefix in it.
    """

    page_size = 1

    def __init__(self) -> None:
        super().__init__()
        self.cache = RadixPrefixCache("cpu", self.page_size)
        self.ref: dict[tuple[str | None, tuple[int, ...]], tuple[int, ...]] = {}
        self.next_slot = 0  # a bump allocator: every slot is handed out once
        self.locked: list[tuple[CacheHandle, str | None, tuple[int, ...]]] = []
        self.ever_freed: set[int] = set()

    # reference helpers

    def page_ends(self, length: int) -> range:
        return range(self.page_size, length + 1, self.page_size)

    def ref_match(self, ids: tuple[int, ...], namespace: str | None) -> int:
        length = 0
        while length + self.page_size <= len(ids) and (namespace, ids[: length + self.page_size]) in self.ref:
            length += self.page_size
        return length

    def ref_slots(self, ids: tuple[int, ...], namespace: str | None) -> list[int]:
        return [slot for end in self.page_ends(len(ids)) for slot in self.ref[namespace, ids[:end]]]

    def held_slots(self) -> list[int]:
        return [slot for page in self.ref.values() for slot in page]

    def protected_prefixes(self) -> set[tuple[str | None, tuple[int, ...]]]:
        return {(ns, path[:end]) for _, ns, path in self.locked for end in self.page_ends(len(path))}

    def allocate(self, n: int) -> list[int]:
        self.next_slot += n
        return list(range(self.next_slot - n, self.next_slot))

    # rules

    @rule(ids=st.lists(st.integers(0, 3), max_size=14), namespace=NAMESPACES, reuse=st.booleans())
    def insert(self, ids: list[int], namespace: str | None, reuse: bool) -> None:
        key = tuple(ids)
        expected_cached = self.ref_match(key, namespace)
        if reuse:  # like a scheduler: reuse the matched slots, compute only the rest
            prefix = self.cache.match_prefix(t(ids), namespace).handle.get_matched_indices().tolist()
        else:  # like a request that computed everything itself
            prefix = []
        slots = prefix + self.allocate(len(ids) - len(prefix))
        result = self.cache.insert_prefix(t(ids), t(slots), namespace)
        aligned = len(ids) // self.page_size * self.page_size
        assert result.cached_len == expected_cached
        assert result.handle.cached_len == aligned
        for end in self.page_ends(aligned)[expected_cached // self.page_size :]:
            self.ref[namespace, key[:end]] = tuple(slots[end - self.page_size : end])
        assert result.handle.get_matched_indices().tolist() == self.ref_slots(key[:aligned], namespace)

    @rule(ids=st.lists(st.integers(0, 3), max_size=14), namespace=NAMESPACES)
    def match(self, ids: list[int], namespace: str | None) -> None:
        handle = self.cache.match_prefix(t(ids), namespace).handle
        expected = self.ref_match(tuple(ids), namespace)
        assert handle.cached_len == expected
        assert handle.get_matched_indices().tolist() == self.ref_slots(tuple(ids[:expected]), namespace)

    @rule(ids=st.lists(st.integers(0, 3), max_size=14), namespace=NAMESPACES)
    def match_len(self, ids: list[int], namespace: str | None) -> None:
        before = tree_state(self.cache)
        assert self.cache.match_len(t(ids), namespace) == self.ref_match(tuple(ids), namespace)
        assert tree_state(self.cache) == before, "match_len changed the tree"

    @rule(ids=st.lists(st.integers(0, 3), max_size=14), namespace=NAMESPACES)
    def lock(self, ids: list[int], namespace: str | None) -> None:
        handle = self.cache.match_prefix(t(ids), namespace).handle
        self.cache.lock_handle(handle)
        self.locked.append((handle, namespace, tuple(ids[: handle.cached_len])))

    @precondition(lambda self: self.locked)
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.locked) - 1))
        handle, _, _ = self.locked.pop(index)
        self.cache.lock_handle(handle, unlock=True)

    @rule(n=st.integers(-1, 30))
    def evict(self, n: int) -> None:
        evictable = self.cache.size_info.evictable
        if n > evictable:
            with pytest.raises(ValueError):
                self.cache.evict(n)
            return
        freed = self.cache.evict(n).tolist()
        assert len(freed) >= n
        assert len(freed) == len(set(freed)), "a slot was freed twice in one call"
        assert not set(freed) & self.ever_freed, "a slot was freed twice"
        assert set(freed) <= set(self.held_slots()), "freed a slot the cache did not hold"
        protected = {slot for prefix in self.protected_prefixes() for slot in self.ref[prefix]}
        assert not set(freed) & protected, "evicted a locked slot"
        self.ever_freed.update(freed)
        kept = {prefix: page for prefix, page in self.ref.items() if not set(page) & self.ever_freed}
        assert sum(map(len, kept.values())) + len(freed) == len(self.held_slots()), "freed part of a page"
        self.ref = kept

    @precondition(lambda self: not self.locked)
    @rule()
    def reset(self) -> None:
        freed = self.cache.reset().tolist()
        assert sorted(freed) == sorted(self.held_slots())
        self.ever_freed.update(freed)
        self.ref.clear()

    # invariants

    @invariant()
    def integrity(self) -> None:
        self.cache.check_integrity()

    @invariant()
    def sizes_balance(self) -> None:
        info = self.cache.size_info
        assert info.total == len(self.held_slots())
        assert info.protected == len(self.protected_prefixes()) * self.page_size

    @invariant()
    def reference_is_prefix_closed(self) -> None:
        for ns, prefix in self.ref:
            assert len(prefix) == self.page_size or (ns, prefix[: -self.page_size]) in self.ref

    @invariant()
    def locked_prefixes_stay_cached(self) -> None:
        for handle, ns, path in self.locked:
            assert handle.get_matched_indices().tolist() == self.ref_slots(path, ns)


class RadixCacheMachinePage4(RadixCacheMachine):
    page_size = 4


STATEFUL_SETTINGS = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestRadixCachePage1 = RadixCacheMachine.TestCase
TestRadixCachePage1.settings = STATEFUL_SETTINGS
TestRadixCachePage4 = RadixCacheMachinePage4.TestCase
TestRadixCachePage4.settings = STATEFUL_SETTINGS


# ---- the free KV pages --------------------------------------------------------------------------


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 12)), max_size=60))
def test_free_pages_hand_out_never_used_pages_only_past_the_most_held(steps: list[tuple[bool, int]]) -> None:
    """Against a plain model (the set of pages held): no page is handed out twice while held, the
    count of free pages balances, and the pages ever handed out are always 0 .. the most ever held at
    once: a first write to a page of the CPU pool faults, so the faults stay within the peak use."""
    free = FreePages(40)
    held: list[int] = []
    ever: set[int] = set()
    most = 0
    for take, n in steps:
        if take:
            n = min(n, len(free))
            pages = free.take(n).tolist()
            assert len(pages) == n and not set(pages) & set(held) and len(set(pages)) == n
            held += pages
            ever |= set(pages)
        else:
            given_back, held = held[:n], held[n:]
            free.give(t(given_back))
        most = max(most, len(held))
        assert len(free) == 40 - len(held)
        assert ever == set(range(most))
        assert sorted(free.pages().tolist() + held) == list(range(40))
