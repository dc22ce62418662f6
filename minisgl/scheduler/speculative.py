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

A draft token costs a row of the pass whether it is kept or not, so a draft is only as long as its
tokens pay for their rows. ``PassCost`` fits the time of a decode pass as fixed + per_row x rows from the
passes the scheduler times; with R decoding requests a pass yields about R tokens, so one more row pays
when the chance that it is kept exceeds per_row x R / (fixed + per_row x R), the share of the pass the
rows take. Draft token i is kept with the chance that all i are, keep_rate^i, where keep_rate is the
request's share of draft tokens kept so far (each kept token, and each first rejected one, a trial).
Alone, on a pass whose weights' reading dominates, that bar is low and drafts run long; in a crowd the
rows dominate, the bar nears 1 and only drafts that almost always hold are made.

Each request's draft length also adapts, under that bound: it doubles when a whole draft is kept and
halves (but not below what was kept) when one is not, down to 0, where drafting stops; a request at 0
tries one token again every ``PROBE_INTERVAL`` passes, all such requests on the same passes, since one
request with a draft gives the whole pass the costlier many-token attention."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minisgl.kvcache.base import PrefixCache
from minisgl.request import Req
from minisgl.tuning import DRAFT_MAX_PASS_ROWS, PASS_COST_DECAY

PROBE_INTERVAL = 16


@dataclass
class _DraftState:
    """What the drafter keeps of one request between passes."""

    draft_len: int
    indexed: int = 0  # how many of the request's tokens ``next_after`` has seen
    # n-gram -> position of the token after its latest occurrence (only occurrences something follows)
    next_after: dict[tuple[int, ...], int] = field(default_factory=dict)
    use_tree: bool = True  # off once the tree holds nothing after the request's context
    # Draft tokens kept, out of those tested (the kept ones and each draft's first rejected one): an
    # even prior of one in two, so that the first drafts are short until some are kept.
    kept: float = 1.0
    tested: float = 2.0

    @property
    def keep_rate(self) -> float:
        return self.kept / self.tested


class PassCost:
    """A decode pass's seconds as fixed + per_row x rows, by least squares over the passes observed,
    each older pass's weight decayed by ``decay`` per pass (the machine's speed drifts). No line until
    the row counts observed vary (a weighted variance of at least one row squared); the last line is
    kept while they do not."""

    def __init__(self, decay: float = PASS_COST_DECAY) -> None:
        self.decay = decay
        self._weight = self._rows = self._seconds = self._rows_sq = self._rows_seconds = 0.0
        self.line: tuple[float, float] | None = None  # (fixed, per_row) seconds

    def observe(self, rows: int, seconds: float) -> None:
        d = self.decay
        self._weight = d * self._weight + 1.0
        self._rows = d * self._rows + rows
        self._seconds = d * self._seconds + seconds
        self._rows_sq = d * self._rows_sq + rows * rows
        self._rows_seconds = d * self._rows_seconds + rows * seconds
        mean_rows, mean_seconds = self._rows / self._weight, self._seconds / self._weight
        variance = self._rows_sq / self._weight - mean_rows * mean_rows
        if variance >= 1.0:
            per_row = (self._rows_seconds / self._weight - mean_rows * mean_seconds) / variance
            self.line = (mean_seconds - per_row * mean_rows, per_row)

    def row_share(self, rows: int) -> float | None:
        """The share of a pass of ``rows`` rows that its rows take (0 to 1); None before a line."""
        if self.line is None:
            return None
        fixed, per_row = max(self.line[0], 0.0), max(self.line[1], 0.0)
        total = fixed + per_row * rows
        return per_row * rows / total if total > 0.0 else 0.0


def paying_tokens(keep_rate: float, bar: float, most: int) -> int:
    """How many draft tokens, up to ``most``, are kept with a chance over ``bar``: token i is kept
    with the chance that all i are, ``keep_rate ** i``, which falls with i."""
    count = 0
    while count < most and keep_rate ** (count + 1) > bar:
        count += 1
    return count


class NgramDrafter:
    def __init__(
        self, cache: PrefixCache, max_draft: int, ngram_min: int, ngram_max: int, cost: PassCost | None = None
    ) -> None:
        self.cache, self.max_draft = cache, max_draft
        self.ngram_sizes = range(ngram_max, ngram_min - 1, -1)  # longest first
        self.cost = cost  # None: drafts as long as their adaptive length, whatever the rows cost
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
        bar = self.cost.row_share(len(reqs)) if self.cost is not None else None
        for req in reqs:
            if budget <= 0:
                break
            # Grammar requests never draft: each draft token would need its own mask. The pass writes
            # KV for every draft token, within the slots reserved for the request (prompt + max_tokens
            # - 1), and the draft plus the token sampled after it must fit max_tokens.
            if req.grammar is not None or req.extend_len != 1:
                continue
            state = self._state(req)
            paying = state.draft_len if bar is None else paying_tokens(state.keep_rate, bar, state.draft_len)
            length = min(paying or int(probing), req.params.max_tokens - len(req.output_ids) - 1, budget)
            draft = self._propose(req, state, length) if length > 0 else []
            if draft:
                out[req] = draft
                budget -= len(draft)
        return out

    def verified(self, req: Req, proposed: int, accepted: int) -> None:
        """How many of the ``proposed`` draft tokens the pass kept: the request's next draft length."""
        state = self._states[req]
        state.kept += accepted
        state.tested += accepted + (accepted < proposed)
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
