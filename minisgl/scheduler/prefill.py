"""Chooses which requests prefill next: policy order, admission, chunking, in-batch sharing, and
a short-prompt lane that keeps short prompts from waiting behind long prefills.

The planner decides and the scheduler applies: ``plan`` returns the requests of the next prefill
pass with their new tokens, and which of them were admitted now (their cached prefix is locked and
their slots reserved); it never moves requests between the scheduler's queues."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from minisgl.kernels.ops import fast_compare_key
from minisgl.request import Req
from minisgl.scheduler.cache_manager import CacheManager
from minisgl.tuning import (
    LPM_MAX_QUEUE,
    MAX_PREFILL_ACTIVATIONS,
    MAX_PREFILL_TOKENS,
    SHARED_PREFIX_MIN,
    SHORT_LANE_DIVISOR,
    SHORT_PROMPT_DIVISOR,
)


def default_prefill_tokens(hidden_size: int) -> int:
    """``EngineConfig.max_prefill_tokens``'s default for a model: MAX_PREFILL_TOKENS, fewer where a
    pass's hidden states would pass MAX_PREFILL_ACTIVATIONS."""
    return max(1, min(MAX_PREFILL_TOKENS, MAX_PREFILL_ACTIVATIONS // hidden_size))


@dataclass
class PrefillPlan:
    reqs: list[Req] = field(default_factory=list)  # short-lane admissions, continuing chunks, other admissions
    lens: list[int] = field(default_factory=list)  # new tokens of each this pass (fewer than it needs: chunked)
    admitted: list[Req] = field(default_factory=list)  # newly admitted: they move from waiting to running
    scored_tokens: int = 0  # new tokens of the requests that score their prompt (``Req.scores_prompt``)

    def add(self, req: Req, n: int) -> None:
        self.reqs.append(req)
        self.lens.append(n)
        if req.scores_prompt:
            self.scored_tokens += n


class PrefillPlanner:
    def __init__(
        self, cache_manager: CacheManager, policy: str, max_prefill_tokens: int, max_scored_tokens: int
    ) -> None:
        """``max_scored_tokens``: the new tokens of requests that score their prompt in one pass, whose
        logits are all kept (a pass's others keep those of one token per request)."""
        self.cache_manager, self.policy, self.max_prefill_tokens = cache_manager, policy, max_prefill_tokens
        self.max_scored_tokens = max_scored_tokens

    def plan(self, waiting: Sequence[Req], running: Sequence[Req]) -> PrefillPlan:
        """The next prefill pass; empty if nothing waits to be prefilled or nothing fits.

        Short waiting prompts go first (the short lane), then chunked prefills continue, then
        waiting requests are admitted in policy order with what is left of the budget."""
        plan = PrefillPlan()
        continuing = [r for r in running if r.is_prefilling]
        prompts = [torch.tensor(r.token_ids[: r.prompt_len]) for r in continuing]
        budget = self.max_prefill_tokens
        short = [(r, None) for r in waiting if r.prompt_len <= self.max_prefill_tokens // SHORT_PROMPT_DIVISOR]
        if short and self._can_admit(waiting, budget):
            budget -= self._admit(plan, short, self.max_prefill_tokens // SHORT_LANE_DIVISOR, prompts)
        for req in continuing:
            n = self._chunk_len(plan, req, budget)
            if n > 0:
                plan.add(req, n)
                budget -= n
        if self._can_admit(waiting, budget):  # checked before ordering, which matches every waiting prompt
            self._admit(plan, self._ordered(waiting), budget, prompts)
        return plan

    def _admit(
        self, plan: PrefillPlan, candidates: list[tuple[Req, int | None]], budget: int, prompts: list[torch.Tensor]
    ) -> int:
        """Admit ``candidates`` in order into ``plan`` until ``budget`` tokens are used (the last
        one may be cut short: chunked); returns the tokens used. ``prompts``: those in the pass."""
        used = 0
        for req, matched in candidates:
            if used >= budget or self.cache_manager.table.num_free == 0:
                break
            if req in plan.admitted:  # already in the short lane
                continue
            n = self._chunk_len(plan, req, budget - used)
            if n <= 0:  # a request that scores its prompt, with the pass's scored tokens used up
                continue
            if self.cache_manager.cache.shares_prefixes and prompts and not req.scores_prompt:
                if matched is None:
                    matched = self.cache_manager.match_len(req)
                if self._shares_with(req, matched, prompts):
                    continue
            if not self.cache_manager.try_admit(req):
                break  # conservative: later requests must not overtake one that does not fit yet
            n = self._chunk_len(plan, req, budget - used)  # admission set its cached prefix
            plan.admitted.append(req)
            plan.add(req, n)
            used += n
            prompts.append(torch.tensor(req.token_ids[: req.prompt_len]))
        return used

    def _chunk_len(self, plan: PrefillPlan, req: Req, budget: int) -> int:
        """Its new tokens in the pass: what it needs, within ``budget`` and, for a request that scores its
        prompt, within the scored tokens left."""
        n = min(req.extend_len, budget)
        return min(n, self.max_scored_tokens - plan.scored_tokens) if req.scores_prompt else n

    def _can_admit(self, waiting: Sequence[Req], budget: int) -> bool:
        """Whether any waiting request could be admitted: a token budget, a page-table row and
        unreserved KV slots are left."""
        cm = self.cache_manager
        return bool(waiting) and budget > 0 and cm.table.num_free > 0 and cm.unreserved_size > 0

    def _ordered(self, waiting: Sequence[Req]) -> list[tuple[Req, int | None]]:
        """Waiting requests in policy order, with their cached prefix length where known."""
        if self.policy == "lpm" and len(waiting) <= LPM_MAX_QUEUE:
            matched = [(req, self.cache_manager.match_len(req)) for req in waiting]
            return sorted(matched, key=lambda pair: -(pair[1] or 0))  # stable: FCFS among equals
        return [(req, None) for req in waiting]

    @staticmethod
    def _shares_with(req: Req, matched: int, prompts: list[torch.Tensor]) -> bool:
        ids = torch.tensor(req.token_ids[: req.prompt_len])
        common = max(fast_compare_key(ids, other) for other in prompts)
        return common - matched >= SHARED_PREFIX_MIN
