"""A read-only picture of a prefix cache's tree, as the server's debug page draws it.

msgspec structs, so the scheduler process sends a snapshot to the front end as it is (like the
stats record). Nodes are listed parents first; ``array_like`` keeps a 10,000-node tree compact.
"""

from __future__ import annotations

import msgspec


class NodeView(msgspec.Struct, array_like=True):
    id: int  # stable while the node lives (a split keeps the tail's id; the new head gets one)
    parent: int  # a node's id, or its namespace's ``root``
    length: int  # tokens held by this node
    head: list[int]  # its first token ids; empty where the namespace's tokens are not shown
    locks: int  # running requests whose prefix runs through this node
    age: int  # cache lookups since it was last matched or inserted (what LRU eviction orders by)
    subtree_tokens: int  # KV slots held by this node and everything below it
    subtree_nodes: int  # this node and everything below it, sent or not


class NamespaceView(msgspec.Struct, array_like=True):
    root: int  # the id its top-level nodes name as parent
    label: str  # never a cache_salt itself (see the server's scheduler process)
    tokens_shown: bool
    tokens: int
    nodes: int


class TreeSnapshot(msgspec.Struct):
    namespaces: list[NamespaceView]
    nodes: list[NodeView]  # at most the bound asked for: the largest branches first
    total_nodes: int
    eviction_path: list[int]  # ids from the top down to the leaf eviction takes next (as far as sent)
