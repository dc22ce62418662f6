"""Radix-tree prefix cache (RadixAttention): requests that share a prompt prefix share its KV slots.

The tree is path-compressed: a node holds an unbranched run of whole pages of token ids (its key)
and the KV slots of those tokens (its value), so a long shared system prompt is a single node that
is compared in one vectorized step. Keys are numpy arrays because a walk indexes and compares them
once per level, where a numpy call costs a fraction of a torch op's dispatch overhead.

Eviction removes unlocked leaves in LRU order; the set of such leaves is maintained incrementally
so that evicting never rescans the tree.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Container, Hashable, Iterator

import numpy as np
import torch

from minisgl.kernels.ops import fast_compare_key
from minisgl.kvcache.base import CacheHandle, InsertResult, MatchLimit, MatchResult, PrefixCache, SizeInfo
from minisgl.kvcache.snapshot import NamespaceView, NodeView, TreeSnapshot

_EMPTY = torch.empty(0, dtype=torch.int64)
_NO_TOKENS = np.empty(0, dtype=np.int64)


class _Node:
    __slots__ = ("children", "key", "namespace", "parent", "ref_count", "timestamp", "value")

    def __init__(
        self,
        key: np.ndarray,
        value: torch.Tensor,
        parent: _Node | None,
        timestamp: int,
        namespace: str | None = None,
    ) -> None:
        self.key = key  # token ids, int64
        self.value = value  # KV slots of those tokens, CPU int64
        self.parent = parent  # None only for a namespace's root
        self.children: dict[Hashable, _Node] = {}
        self.ref_count = 0
        self.timestamp = timestamp
        self.namespace = namespace  # only meaningful on a root, so an empty root can be dropped


class RadixHandle(CacheHandle):
    """Points at a node; the matched prefix is the path from its namespace's root down to it."""

    __slots__ = ("_device", "cached_len", "node")

    def __init__(self, node: _Node, cached_len: int, device: torch.device) -> None:
        self.node = node
        self.cached_len = cached_len
        self._device = device

    def get_matched_indices(self) -> torch.Tensor:
        parts: list[torch.Tensor] = []
        node: _Node | None = self.node
        while node is not None:  # the root's empty value keeps the list non-empty
            parts.append(node.value)
            node = node.parent
        parts.reverse()
        return torch.cat(parts).to(self._device)


class RadixPrefixCache(PrefixCache):
    def __init__(self, device: torch.device | str, page_size: int = 1, match_limit: MatchLimit | None = None) -> None:
        super().__init__(device, page_size, match_limit)
        self._init_state()

    def _init_state(self) -> None:
        self._clock = 0
        self._roots: dict[str | None, _Node] = {None: self._new_root(None)}
        self._evictable = 0
        self._protected = 0
        # Exactly the eviction candidates: unlocked, childless, non-root nodes.
        self._leaves: set[_Node] = set()
        # Lazy min-heap over self._leaves by timestamp. An entry may be stale (its node left the
        # set, or was touched after the push, so the entry's timestamp is older than the node's);
        # stale entries are skipped or re-queued when popped. The counter breaks ties so that
        # nodes themselves are never compared.
        self._heap: list[tuple[int, int, _Node]] = []
        self._seq = itertools.count()

    def _new_root(self, namespace: str | None) -> _Node:
        return _Node(_NO_TOKENS, _EMPTY, None, 0, namespace)

    # ---- public API -----------------------------------------------------------------------------

    def match_prefix(self, input_ids: torch.Tensor, namespace: str | None = None) -> MatchResult:
        root = self._roots.get(namespace)
        if root is None:
            return MatchResult(self._empty_handle())
        tokens = self._to_tokens(input_ids[: self._align(len(input_ids))])
        if self.match_limit is not None:
            tokens = tokens[: self._limited_len(root, tokens)]
        node, matched = self._walk(root, tokens)
        return MatchResult(RadixHandle(node, matched, self.device))

    def match_len(self, input_ids: torch.Tensor, namespace: str | None = None) -> int:
        root = self._roots.get(namespace)
        if root is None:
            return 0
        tokens = self._to_tokens(input_ids[: self._align(len(input_ids))])
        if self.match_limit is not None:
            return self._limited_len(root, tokens)
        return self._descend(root, tokens)[1]

    def slots_by_age(self) -> Iterator[torch.Tensor]:
        # A walk stamps a whole path, so a node is never older than the nodes below it.
        return (node.value for node in sorted(self._iter_nodes(), key=lambda node: node.timestamp))

    def continuation(self, input_ids: torch.Tensor, namespace: str | None, max_len: int) -> list[int]:
        root = self._roots.get(namespace)
        if root is None or max_len <= 0:
            return []
        tokens = self._to_tokens(input_ids)
        aligned = self._align(len(tokens))
        path, matched, covered = self._descend(root, tokens[:aligned])
        if matched < aligned:
            return []
        # Past the match: the rest of its last node, then down the most recently used child at each
        # branch. Less than a page of ``tokens`` is left unmatched; the cached run must start with it.
        tail = tokens[aligned:]
        want = len(tail) + max_len
        node = path[-1] if path else root
        ahead, found = [node.key[covered:]], len(node.key) - covered
        while found < want and node.children:
            node = max(node.children.values(), key=lambda child: child.timestamp)
            ahead.append(node.key)
            found += len(node.key)
        run = np.concatenate(ahead)[:want]
        if len(run) <= len(tail) or not np.array_equal(run[: len(tail)], tail):
            return []
        return run[len(tail) :].tolist()

    def insert_prefix(
        self, input_ids: torch.Tensor, indices: torch.Tensor, namespace: str | None = None
    ) -> InsertResult:
        if len(indices) != len(input_ids):
            raise ValueError(f"got {len(indices)} KV slots for {len(input_ids)} tokens")
        aligned = self._align(len(input_ids))
        if aligned == 0:
            return InsertResult(0, self._empty_handle())
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = self._new_root(namespace)
        tokens = self._to_tokens(input_ids[:aligned])
        node, cached = self._walk(root, tokens)
        if cached < aligned:
            # Copies, so the tree never aliases (or pins the storage of) the caller's tensors.
            leaf = _Node(
                tokens[cached:].copy(),
                indices[cached:aligned].to("cpu", torch.int64, copy=True),
                node,
                self._clock,
            )
            self._leaves.discard(node)  # it has a child now
            node.children[self._child_key(leaf.key)] = leaf
            self._evictable += len(leaf.key)
            self._add_leaf(leaf)
            node = leaf
        return InsertResult(cached, RadixHandle(node, aligned, self.device))

    def lock_handle(self, handle: CacheHandle, unlock: bool = False) -> None:
        assert isinstance(handle, RadixHandle), f"not a radix cache handle: {handle!r}"
        node = handle.node
        # A child is never locked more than its parent, so checking the handle's node suffices.
        if unlock and node.parent is not None and node.ref_count == 0:
            raise RuntimeError("unlock of a handle that is not locked")
        delta = -1 if unlock else 1
        while node.parent is not None:
            node.ref_count += delta
            size = len(node.key)
            if unlock and node.ref_count == 0:
                self._protected -= size
                self._evictable += size
                if not node.children:
                    self._add_leaf(node)
            elif not unlock and node.ref_count == 1:
                self._evictable -= size
                self._protected += size
                self._leaves.discard(node)
            node = node.parent

    def evict(self, num_tokens: int) -> torch.Tensor:
        if num_tokens <= 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        if num_tokens > self._evictable:
            raise ValueError(f"cannot evict {num_tokens} tokens: only {self._evictable} are evictable")
        # Every unlocked node's subtree is unlocked (locks run up to the root), so removing leaves
        # one by one can always reach all evictable tokens.
        freed: list[torch.Tensor] = []
        num_freed = 0
        while num_freed < num_tokens:
            timestamp, _, node = heapq.heappop(self._heap)
            if node not in self._leaves:
                continue
            if timestamp != node.timestamp:  # touched since it was queued: re-queue at its real age
                heapq.heappush(self._heap, (node.timestamp, next(self._seq), node))
                continue
            self._leaves.remove(node)
            parent = node.parent
            assert parent is not None
            del parent.children[self._child_key(node.key)]
            freed.append(node.value)
            num_freed += len(node.key)
            self._evictable -= len(node.key)
            if parent.children:
                continue
            if parent.parent is not None:
                if parent.ref_count == 0:
                    self._add_leaf(parent)
            elif parent.namespace is not None:
                del self._roots[parent.namespace]  # keeps one-off namespaces from piling up
        return torch.cat(freed).to(self.device)

    def reset(self) -> torch.Tensor:
        if self._protected:
            raise RuntimeError(f"cannot reset: {self._protected} cached tokens are still locked")
        freed = [node.value for node in self._iter_nodes()]
        self._init_state()
        return torch.cat([_EMPTY, *freed]).to(self.device)

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(self._evictable, self._protected)

    def check_integrity(self) -> None:
        assert None in self._roots, "the default namespace's root is missing"
        for namespace, root in self._roots.items():
            assert root.parent is None and root.namespace == namespace and len(root.key) == 0
            assert root.ref_count == 0, "roots are never locked"
            assert namespace is None or root.children, "an emptied namespace root lingers"
        evictable = protected = 0
        leaves: set[_Node] = set()
        slots: list[torch.Tensor] = []
        for node in self._iter_nodes():
            parent = node.parent
            assert parent is not None
            size = len(node.key)
            assert size > 0 and size % self.page_size == 0, f"key of {size} tokens is not whole pages"
            assert len(node.value) == size, "key and value lengths differ"
            assert node.key.dtype == np.int64 and node.value.dtype == torch.int64
            assert parent.children.get(self._child_key(node.key)) is node, "child indexed wrongly"
            assert node.ref_count >= 0, "negative ref_count"
            if parent.parent is not None:
                assert node.ref_count <= parent.ref_count, "child locked more than its parent"
            if node.ref_count:
                protected += size
            else:
                evictable += size
                if not node.children:
                    leaves.add(node)
            slots.append(node.value)
        assert (evictable, protected) == (self._evictable, self._protected), "size counters drifted"
        assert leaves == self._leaves, "evictable-leaf set drifted"
        all_slots = torch.cat([_EMPTY, *slots])
        assert len(all_slots.unique()) == len(all_slots), "a KV slot is held by two nodes"
        queued: dict[_Node, int] = {}
        for timestamp, _, node in self._heap:
            queued[node] = min(timestamp, queued.get(node, timestamp))
        for leaf in leaves:
            assert leaf in queued and queued[leaf] <= leaf.timestamp, "leaf missing from the heap"

    def render(self, max_tokens: int = 8) -> str:
        """The tree as indented text, one node a line: its first tokens, length, locks, timestamp."""
        lines: list[str] = []

        def visit(node: _Node, depth: int) -> None:
            for child in sorted(node.children.values(), key=lambda c: int(c.key[0])):
                head = " ".join(map(str, child.key[:max_tokens].tolist()))
                more = " ..." if len(child.key) > max_tokens else ""
                lines.append(
                    f"{'  ' * depth}[{head}{more}] len={len(child.key)} ref={child.ref_count} t={child.timestamp}"
                )
                visit(child, depth + 1)

        for namespace, root in self._roots.items():
            lines.append(f"root ({'default' if namespace is None else namespace})")
            visit(root, 1)
        return "\n".join(lines)

    def snapshot(
        self, max_nodes: int, head_tokens: int, label: Callable[[str | None], str], shown: Container[str | None]
    ) -> TreeSnapshot:
        """The tree without touching it (no split, no clock tick, no LRU refresh). At most ``max_nodes``
        nodes: the path to the next eviction first, then the branches holding the most KV; each node's
        subtree totals count what was left out. Token ids only for namespaces in ``shown``."""
        if max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
        order = list(self._iter_nodes())  # pre-order: a parent comes before its children
        # Of each node and everything below it; a root counts only what is below it.
        tokens = {node: len(node.key) for node in order}
        count = dict.fromkeys(order, 1)
        for root in self._roots.values():
            tokens[root] = count[root] = 0
        for node in reversed(order):  # so every child is complete before it is added to its parent
            tokens[node.parent] += tokens[node]  # type: ignore[index]
            count[node.parent] += count[node]  # type: ignore[index]
        namespaces = [
            NamespaceView(id(root), label(namespace), namespace in shown, tokens[root], count[root])
            for namespace, root in self._roots.items()
        ]
        show = {root: namespace in shown for namespace, root in self._roots.items()}

        chosen: dict[_Node, bool] = {}  # parents first; whether the node's tokens are shown
        path: list[_Node] = []  # from the leaf that eviction takes next up to its namespace's root
        node = min(self._leaves, key=lambda leaf: leaf.timestamp, default=None)
        while node is not None:
            path.append(node)
            node = node.parent
        for node in reversed(path[:-1][-max_nodes:]):
            chosen[node] = show[path[-1]]
        seq = itertools.count()  # ties never compare nodes
        frontier = [(-tokens[c], next(seq), c, show[r]) for r in self._roots.values() for c in r.children.values()]
        heapq.heapify(frontier)
        while frontier and len(chosen) < max_nodes:
            _, _, node, shown_here = heapq.heappop(frontier)
            chosen[node] = shown_here
            for child in node.children.values():
                heapq.heappush(frontier, (-tokens[child], next(seq), child, shown_here))
        nodes = [
            NodeView(
                id(node),
                id(node.parent),
                len(node.key),
                node.key[:head_tokens].tolist() if shown_here else [],
                node.ref_count,
                self._clock - node.timestamp,
                tokens[node],
                count[node],
            )
            for node, shown_here in chosen.items()
        ]
        total = sum(view.nodes for view in namespaces)
        return TreeSnapshot(namespaces, nodes, total, [id(node) for node in reversed(path) if node in chosen])

    # ---- internals ------------------------------------------------------------------------------

    def _descend(self, root: _Node, tokens: np.ndarray) -> tuple[list[_Node], int, int]:
        """Read-only: the nodes along the longest match of page-aligned ``tokens``, the match's
        length, and how many tokens of the last node it covers (fewer than its key: it ends inside)."""
        path: list[_Node] = []
        node, pos, n = root, 0, 0
        while pos < len(tokens):
            rest = tokens[pos:]
            child = node.children.get(self._child_key(rest))
            if child is None:
                break
            # The dict lookup already matched the first page, so at least one page matches.
            n = fast_compare_key(child.key, rest) // self.page_size * self.page_size
            path.append(child)
            pos += n
            if n < len(child.key):
                break
            node = child
        return path, pos, n

    def _limited_len(self, root: _Node, tokens: np.ndarray) -> int:
        """Read-only: the length of the match of ``tokens`` as ``match_limit`` cuts it."""
        assert self.match_limit is not None
        path, matched, covered = self._descend(root, tokens)
        if not path:
            return 0
        slots = torch.cat([*(node.value for node in path[:-1]), path[-1].value[:covered]])
        return self._align(min(matched, self.match_limit(slots)))

    def _walk(self, root: _Node, tokens: np.ndarray) -> tuple[_Node, int]:
        """Descend along page-aligned ``tokens`` as a use of the prefix: every node on the path
        becomes the most recently used. Returns the node where the match ends and its length; if
        the match ends inside a node, that node is split so the returned node ends exactly there."""
        self._clock += 1  # also the age of what an insert adds below the match
        path, matched, last_covered = self._descend(root, tokens)
        if not path:
            return root, 0
        *above, last = path
        for node in above:
            node.timestamp = self._clock
        if last_covered < len(last.key):
            last = self._split(last, last_covered)  # the tail below the match keeps its age
        last.timestamp = self._clock
        return last, matched

    def _split(self, node: _Node, n: int) -> _Node:
        """Cut ``node`` after its first ``n`` tokens; returns the new head above it.

        The tail stays the same object, so handles pointing at ``node`` stay valid, and it keeps
        its timestamp and place in the leaf set and heap. The head inherits the lock count, which
        keeps both size counters unchanged.
        """
        parent = node.parent
        assert parent is not None
        head = _Node(node.key[:n], node.value[:n], parent, node.timestamp)
        head.ref_count = node.ref_count
        parent.children[self._child_key(head.key)] = head
        node.key, node.value, node.parent = node.key[n:], node.value[n:], head
        head.children[self._child_key(node.key)] = node
        return head

    def _add_leaf(self, node: _Node) -> None:
        self._leaves.add(node)
        heapq.heappush(self._heap, (node.timestamp, next(self._seq), node))
        # Stale entries accumulate with lock/unlock cycles; rebuilding once they outnumber the
        # live ones keeps the heap O(leaves) at amortized O(1) cost per push.
        if len(self._heap) > 2 * len(self._leaves) + 64:
            self._heap = [(leaf.timestamp, next(self._seq), leaf) for leaf in self._leaves]
            heapq.heapify(self._heap)

    def _child_key(self, tokens: np.ndarray) -> Hashable:
        """How a parent indexes a child whose key starts with ``tokens``: by its first page."""
        first_page = tokens[: self.page_size]
        return int(first_page[0]) if self.page_size == 1 else tuple(first_page.tolist())

    def _iter_nodes(self) -> Iterator[_Node]:
        """Every non-root node of every namespace."""
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _align(self, length: int) -> int:
        return length // self.page_size * self.page_size

    def _to_tokens(self, ids: torch.Tensor) -> np.ndarray:
        return ids.to("cpu", torch.int64).numpy()

    def _empty_handle(self) -> RadixHandle:
        # Nothing is cached for this request; the default root stands in as the (empty) match end.
        return RadixHandle(self._roots[None], 0, self.device)
