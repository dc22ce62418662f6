"""Chooses which requests prefill next: policy order, admission, chunking, in-batch sharing."""

from __future__ import annotations

from collections import deque

import torch

from minisgl.kernels.ops import fast_compare_key
from minisgl.kvcache.cache_manager import CacheManager
from minisgl.request import Req

# Past this many waiting requests LPM's per-request prefix match would dominate: fall back to FCFS.
LPM_MAX_QUEUE = 128
# A waiting request that shares at least this many uncached tokens with one being prefilled now
# waits one round and then reuses that request's KV instead of computing the same prefix again.
SHARED_PREFIX_MIN = 32


class PrefillPlanner:
    def __init__(self, cache_manager: CacheManager, policy: str, max_prefill_tokens: int) -> None:
        self.cache_manager, self.policy, self.max_prefill_tokens = cache_manager, policy, max_prefill_tokens

    def _ordered(self, waiting: deque[Req]) -> list[tuple[Req, int | None]]:
        """Waiting requests in policy order, with their cached prefix length where known."""
        if self.policy == "lpm" and len(waiting) <= LPM_MAX_QUEUE:
            matched = [(req, self.cache_manager.match_len(req)) for req in waiting]
            return sorted(matched, key=lambda pair: -(pair[1] or 0))  # stable: FCFS among equals
        return [(req, None) for req in waiting]

    def plan(self, waiting: deque[Req], running: list[Req]) -> tuple[list[Req], list[int]]:
        """Pick (requests, new tokens each) for one prefill pass; admitted requests move from
        ``waiting`` to ``running``. Only the last request of a pass may be cut short (chunked)."""
        budget = self.max_prefill_tokens
        reqs: list[Req] = []
        lens: list[int] = []
        for req in running:  # a chunked prefill continues before anything new is admitted
            if req.is_prefilling and budget > 0:
                n = min(req.extend_len, budget)
                reqs.append(req)
                lens.append(n)
                budget -= n
        prompts = [torch.tensor(r.token_ids[: r.prompt_len]) for r in reqs]
        for req, matched in self._ordered(waiting):
            if budget <= 0 or self.cache_manager.table.num_free == 0:
                break
            if self.cache_manager.cache.shares_prefixes and prompts:
                if matched is None:
                    matched = self.cache_manager.match_len(req)
                if self._shares_with(req, matched, prompts):
                    continue
            if not self.cache_manager.try_admit(req):
                break  # conservative: later requests must not overtake one that does not fit yet
            waiting.remove(req)
            running.append(req)
            n = min(req.extend_len, budget)
            reqs.append(req)
            lens.append(n)
            budget -= n
            prompts.append(torch.tensor(req.token_ids[: req.prompt_len]))
        return reqs, lens

    @staticmethod
    def _shares_with(req: Req, matched: int, prompts: list[torch.Tensor]) -> bool:
        ids = torch.tensor(req.token_ids[: req.prompt_len])
        common = max(fast_compare_key(ids, other) for other in prompts)
        return common - matched >= SHARED_PREFIX_MIN
