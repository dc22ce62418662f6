"""The best prefix-cache hit rate a workload allows, computed from the token ids actually sent."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

_Node = dict[int, "_Node"]


def reusable_tokens(requests: Iterable[tuple[Sequence[int], Sequence[int]]]) -> tuple[int, int]:
    """(prompt tokens a cache of unlimited size could serve, all prompt tokens), for ``(prompt,
    output)`` pairs in issue order.

    A request can reuse the KV of any earlier request: its prompt and all but the last output
    token (the last one is sampled, never fed back). The last prompt token is always computed,
    since its logits give the first output token.
    """
    root: _Node = {}
    reusable = total = 0
    for prompt, output in requests:
        node = root
        for token in prompt[:-1]:
            if token not in node:
                break
            node = node[token]
            reusable += 1
        total += len(prompt)
        node = root
        for token in list(prompt) + list(output[:-1]):
            node = node.setdefault(token, {})
    return reusable, total


def best_hit_rate(requests: Iterable[tuple[Sequence[int], Sequence[int]]]) -> float:
    reusable, total = reusable_tokens(requests)
    return reusable / total if total else 0.0
