"""RadixAttention in two parts: a tree built by hand, then the same idea inside the engine.

Run: python examples/radix_demo.py
"""

from __future__ import annotations

import torch

from minisgl import LLM, SamplingParams
from minisgl.kvcache.radix_cache import RadixPrefixCache


def show(title: str, cache: RadixPrefixCache) -> None:
    cache.check_integrity()
    evictable, protected = cache.size_info
    print(f"\n== {title}  (evictable {evictable}, protected {protected})\n{cache.render()}")


def tree_by_hand() -> None:
    cache = RadixPrefixCache("cpu")
    slots = iter(range(1000))  # stands in for the KV allocator

    def insert(tokens: list[int]) -> None:
        ids = torch.tensor(tokens)
        cached, _ = cache.insert_prefix(ids, torch.tensor([next(slots) for _ in tokens]))
        print(f"insert {tokens}: {cached} tokens were already cached")

    insert([1, 2, 3, 4, 5, 6])
    insert([1, 2, 3, 7, 8])  # shares [1, 2, 3]: the first node splits there
    insert([9, 9])
    show("three inserts", cache)

    handle = cache.match_prefix(torch.tensor([1, 2, 3, 4, 10])).handle
    print(f"\nmatch [1 2 3 4 10] -> cached_len {handle.cached_len}, slots {handle.get_matched_indices().tolist()}")
    show("the match ended inside [4 5 6], which split", cache)

    cache.lock_handle(handle)
    show("locked the matched path (a running request uses it)", cache)

    freed = cache.evict(2)
    print(f"\nevict(2) freed slots {freed.tolist()} (least recently used unlocked leaf first)")
    freed = cache.evict(2)
    print(f"evict(2) freed slots {freed.tolist()}")
    show("after two evictions: the locked path survives", cache)
    cache.lock_handle(handle, unlock=True)


def engine_comparison() -> None:
    system = (
        "You are a concise assistant for a hiking club. Members ask about trails, weather, gear and safety. "
        "Answer in one sentence. The club meets on Saturdays at seven in the morning at the north gate. "
    ) * 3
    questions = ["Which trail is easiest?", "What should I pack?", "When do we meet?", "Is the summit safe in rain?"]
    prompts = [system + "Question: " + q + "\nAnswer:" for q in questions]
    params = SamplingParams(max_tokens=16)
    print("\n== one system prompt + 4 questions through LLM")
    texts = {}
    for cache_type in ("naive", "radix"):
        llm = LLM(cache_type=cache_type, num_page_override=4096)
        outs = llm.generate(prompts, params, use_tqdm=False)
        stats = llm.stats()
        print(
            f"{cache_type:>5}: prompt tokens {stats['prompt_tokens']}, computed in prefill {stats['prefill_tokens']}, "
            f"reused {stats['cached_tokens']} (hit rate {stats['hit_rate']:.0%})"
        )
        texts[cache_type] = [o["text"] for o in outs]
        llm.shutdown()
    print("same outputs with both caches:", texts["naive"] == texts["radix"])


if __name__ == "__main__":
    tree_by_hand()
    engine_comparison()
