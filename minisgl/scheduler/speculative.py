"""Speculative decoding without a draft model: a decoding request's next tokens are guessed by copying,
and the pass that samples its next token checks the guess.

Drafts come from what the request has seen: the radix tree's tokens after its whole context (what an
earlier request with the same context went on with), else the tokens that followed the latest earlier
occurrence of its last n tokens in its own prompt and output (prompt lookup, longest n first; ``lookup``).

The scheduler verifies a draft in one pass over the request's last token and the draft tokens, sampling
a token at each of them: draft token i is kept while the token sampled before it equals it. Sampling
the target distribution and keeping the draft token only when the sample equals it is rejection
sampling with a draft that puts all its mass on one token (keep it with probability p(d), else draw
from p without d, renormalised), so sampled outputs keep their distribution and greedy outputs are the
same tokens as without speculation.

Each request's draft length adapts: it doubles when a whole draft is kept and halves (but not below
what was kept) when one is not, down to 0, where drafting stops; a request at 0 tries one token again
every ``PROBE_INTERVAL`` passes, all such requests on the same passes, since one request with a draft
gives the whole pass the costlier many-token attention."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minisgl.kvcache.base import PrefixCache
from minisgl.request import Req
from minisgl.tuning import DRAFT_MAX_PASS_ROWS

PROBE_INTERVAL = 16


@dataclass
class _DraftState:
    """What the drafter keeps of one request between passes."""

    draft_len: int
    indexed: int = 0  # how many of the request's tokens ``next_after`` has seen
    # n-gram -> position of the token after its latest occurrence (only occurrences something follows)
    next_after: dict[tuple[int, ...], int] = field(default_factory=dict)
    use_tree: bool = True  # off once the tree holds nothing after the request's context


class NgramDrafter:
    def __init__(self, cache: PrefixCache, max_draft: int, ngram_min: int, ngram_max: int) -> None:
        self.cache, self.max_draft = cache, max_draft
        self.ngram_sizes = range(ngram_max, ngram_min - 1, -1)  # longest first
        self._states: dict[Req, _DraftState] = {}
        self._passes = 0

    def drafts(self, reqs: list[Req], max_rows: int = DRAFT_MAX_PASS_ROWS) -> dict[Req, list[int]]:
        """Draft tokens for this pass's decoding requests, for those that have one, so long as the
        pass keeps at most ``max_rows`` tokens: a draft row costs a decode row's products, and past a
        few rows those are bound by arithmetic, not by reading the weights once."""
        self._passes += 1
        probing = self._passes % PROBE_INTERVAL == 0
        out: dict[Req, list[int]] = {}
        budget = max_rows - len(reqs)
        for req in reqs:
            if budget <= 0:
                break
            # Grammar requests never draft: each draft token would need its own mask. The pass writes
            # KV for every draft token, within the slots reserved for the request (prompt + max_tokens
            # - 1), and the draft plus the token sampled after it must fit max_tokens.
            if req.grammar is not None or req.extend_len != 1:
                continue
            state = self._state(req)
            length = min(state.draft_len or int(probing), req.params.max_tokens - len(req.output_ids) - 1, budget)
            draft = self._propose(req, state, length) if length > 0 else []
            if draft:
                out[req] = draft
                budget -= len(draft)
        return out

    def verified(self, req: Req, proposed: int, accepted: int) -> None:
        """How many of the ``proposed`` draft tokens the pass kept: the request's next draft length."""
        state = self._states[req]
        if accepted == proposed:
            state.draft_len = min(self.max_draft, max(1, 2 * state.draft_len))
        else:
            state.draft_len = max(accepted, state.draft_len // 2)

    def forget(self, req: Req) -> None:
        self._states.pop(req, None)

    def _state(self, req: Req) -> _DraftState:
        """The request's state, its n-gram index brought up to date with the tokens it has now."""
        state = self._states.get(req)
        if state is None:
            state = self._states[req] = _DraftState(self.max_draft)
        ids = req.token_ids
        for pos in range(max(state.indexed, 1), len(ids)):
            for n in self.ngram_sizes:
                if n <= pos:
                    state.next_after[tuple(ids[pos - n : pos])] = pos
        state.indexed = len(ids)
        return state

    def _propose(self, req: Req, state: _DraftState, length: int) -> list[int]:
        if state.use_tree:
            draft = self.cache.continuation(torch.tensor(req.token_ids), req.namespace, length)
            if draft:
                return draft
            state.use_tree = False  # its context has left what the tree holds: it rarely comes back
        return lookup(req.token_ids, self.ngram_sizes, state.next_after, length)


def lookup(tokens: list[int], ngram_sizes: range, next_after: dict[tuple[int, ...], int], length: int) -> list[int]:
    """``length`` tokens copied from after the latest earlier occurrence of the longest suffix of
    ``tokens`` (of the ``ngram_sizes``) found in ``next_after``. The copy may run into the draft
    itself (as LZ77's copies do), so a loop shorter than the draft is drafted at full length."""
    for n in ngram_sizes:
        if n <= len(tokens):
            start = next_after.get(tuple(tokens[-n:]))
            if start is not None:
                draft: list[int] = []
                for pos in range(start, start + length):
                    draft.append(tokens[pos] if pos < len(tokens) else draft[pos - len(tokens)])
                return draft
    return []
