"""The batched sampler that turns logits into next tokens: greedy rows in one argmax, the others
each from its own generator, grammar rows masked first; a row that fails fails its request alone."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minisgl.batch import SamplingRows, ScoringRows
from minisgl.constrained.matcher import Grammar, mask_logits
from minisgl.kernels.native import CpuKernels
from minisgl.sampling import SamplingParams, TokenLogprob

_U64 = 2**64 - 1


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution one row of logits (float32) is sampled from: temperature, top-k, top-p and
    min-p applied, then a softmax.

    The row is shifted so that its maximum is 0 before the division: every logit is then at most 0,
    the division can only overflow towards -inf, and the softmax keeps a probability of at least
    one token, so it is never NaN for finite (or -inf) logits and any accepted temperature."""
    logits = (logits - logits.max()) / params.temperature
    if params.top_k > 0:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.min_p > 0.0:
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(torch.softmax(logits, dim=-1), descending=True)
        # Keep the smallest prefix whose mass reaches top_p: drop a token once the mass before it does.
        drop_sorted = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= params.top_p
        drop_sorted[0] = False  # the most probable token stays even if top_p rounds to 0 in float32
        logits = logits.masked_fill(drop_sorted.scatter(0, order, drop_sorted), float("-inf"))
    return torch.softmax(logits, dim=-1)


def adjust_logits(logits: torch.Tensor, params: SamplingParams, output: list[int] | None) -> None:
    """One row of logits, in place: less for each token ``output`` holds (the presence penalty once, the
    frequency penalty per occurrence), plus ``logit_bias``."""
    if params.penalized and output:
        tokens, counts = torch.unique(torch.tensor(output, device=logits.device), return_counts=True)
        penalty = params.frequency_penalty * counts.to(logits.dtype) + params.presence_penalty
        logits[tokens] -= penalty
    if params.logit_bias:
        tokens = torch.tensor(list(params.logit_bias), device=logits.device)
        logits[tokens] += torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype, device=logits.device)


@dataclass(frozen=True)
class Sampled:
    next_ids: torch.Tensor  # [batch] int64 on the CPU; meaningless in the rows of ``errors``
    errors: dict[int, str]  # row -> why that row's request could not be sampled
    logprobs: dict[int, TokenLogprob] = field(default_factory=dict)  # row -> its token's, where asked for
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # per scored row (``Batch.score_rows``)


class Sampler:
    """Samples one token per row. Greedy rows are one batched argmax; other rows draw from their own
    generator (``generator_for``) so that a seeded request is reproducible whatever batch it lands in."""

    def __init__(self, seed: int = 0, kernels: CpuKernels | None = None) -> None:
        self._default_generator = torch.Generator().manual_seed(seed)
        self.kernels = kernels  # the engine's C kernels: their argmax for CPU logits

    @staticmethod
    def generator_for(params: SamplingParams, position: int) -> torch.Generator | None:
        """The generator of a seeded request's token at ``position``, seeded by both: the token drawn
        there does not depend on the batches the request ran in, nor on speculative decoding (which
        samples at several positions of a request in one pass, and again at those it rejected)."""
        if params.greedy or params.seed is None:
            return None
        return torch.Generator().manual_seed(_position_seed(params.seed, position))

    def sample(self, logits: torch.Tensor, rows: SamplingRows) -> Sampled:
        """``logits``: [batch, vocab] → the next token of each row. Rows with a grammar sample only among
        the tokens it allows next (``logits`` is masked in place). A row whose own masking or sampling
        fails is reported in ``errors`` instead of failing the batch: the error belongs to that request.
        Penalties and biases (``adjust_logits``) go first, in place too; the log-probabilities that rows
        ask for (``SamplingParams.logprobs``) are taken from the logits before all that."""
        asking = [i for i, p in enumerate(rows.params) if p.logprobs is not None]
        # A copy of the rows that ask (the steps below change ``logits``), by index_select: faster than list indexing.
        raw = logits.index_select(0, torch.tensor(asking, device=logits.device)).float() if asking else None
        errors = _adjust_rows(logits, rows)
        if any(g is not None for g in rows.grammars):
            errors |= _mask_grammar_rows(logits, rows.grammars)
        # max's indices are argmax's (the first of equal maxima), from a faster kernel than argmax's; the C
        # kernels' argmax gives the same indices faster still (docs/benchmarks/session34-spr/argmax.py).
        if self.kernels is not None and logits.is_cpu and logits.dtype == torch.float32 and logits.is_contiguous():
            greedy = self.kernels.argmax(logits)
        else:
            greedy = logits.max(dim=-1).indices.cpu()
        sampled = Sampled(greedy, errors)
        sampled_rows = [i for i, p in enumerate(rows.params) if not p.greedy and i not in errors]
        if sampled_rows:
            picked = logits[sampled_rows].float().cpu()
            for row, i in zip(picked, sampled_rows):
                try:
                    probs = probabilities(row, rows.params[i])
                    generator = rows.generators[i] or self._default_generator
                    sampled.next_ids[i] = torch.multinomial(probs, 1, generator=generator)[0]
                except Exception as e:  # noqa: BLE001 - whatever it is, only this row's request fails
                    sampled.errors[i] = f"sampling failed: {type(e).__name__}: {e}"
        if raw is not None:
            asked = [rows.params[i].logprobs or 0 for i in asking]
            found = self.token_logprobs(raw, sampled.next_ids[asking], max(asked))
            for i, top, lp in zip(asking, asked, found):
                if i not in sampled.errors:
                    sampled.logprobs[i] = TokenLogprob(lp.logprob, lp.top[:top])
        return sampled

    def prompt_logprobs(self, logits: torch.Tensor, scoring: ScoringRows) -> list[TokenLogprob]:
        """The scored rows' logits → the log-probability of the prompt token after each, with the
        ``scoring.top`` most likely tokens there."""
        return self.token_logprobs(logits.float(), torch.tensor(scoring.next_ids), scoring.top)

    def token_logprobs(self, logits: torch.Tensor, chosen: torch.Tensor, top: int) -> list[TokenLogprob]:
        """``logits``: fp32 rows; ``chosen``: the token of each row (CPU int64) → its ``TokenLogprob``, with the
        ``top`` most likely tokens of the row. A token's log-probability is its logit less the row's
        log-sum-exp: the C kernels' for CPU rows (no row of log-probabilities written out, as torch's
        log_softmax writes one), and their argmax for the most likely token."""
        kernels = self.kernels if logits.is_cpu and logits.is_contiguous() else None
        lse = kernels.logsumexp(logits) if kernels is not None else torch.logsumexp(logits, dim=-1)
        values = (logits.gather(1, chosen.to(logits.device).unsqueeze(1))[:, 0] - lse).tolist()
        if not top:
            return [TokenLogprob(value, []) for value in values]
        if top == 1 and kernels is not None:
            ids = kernels.argmax(logits).unsqueeze(1)
            top_logits = logits.gather(1, ids)
        else:
            top_logits, ids = torch.topk(logits, top)
        top_values = (top_logits - lse.unsqueeze(1)).tolist()
        return [TokenLogprob(value, list(zip(i, v))) for value, i, v in zip(values, ids.tolist(), top_values)]


def _position_seed(seed: int, position: int) -> int:
    """A 64-bit seed from a request's seed and a position (SplitMix64's mixing: nearby inputs give
    unrelated seeds, and the low 32 bits, all that torch's CPU generator reads, change with every bit)."""
    z = (seed + (position + 1) * 0x9E3779B97F4A7C15) & _U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
    return z ^ (z >> 31)


def _adjust_rows(logits: torch.Tensor, rows: SamplingRows) -> dict[int, str]:
    """``adjust_logits`` on every row that asks for it; row -> why, for those where it failed."""
    errors: dict[int, str] = {}
    for i, params in enumerate(rows.params):
        if params.penalized or params.logit_bias:
            try:
                adjust_logits(logits[i], params, rows.outputs[i])
            except Exception as e:  # noqa: BLE001 - whatever it is, only this row's request fails
                errors[i] = f"penalties failed: {type(e).__name__}: {e}"
    return errors


def _mask_grammar_rows(logits: torch.Tensor, grammars: list[Grammar | None]) -> dict[int, str]:
    """Mask every grammar row at once; if that fails, row by row, to find the requests whose grammar
    failed (returned: row -> why) while the others are masked as usual. A row left with no token (a
    vocabulary that cannot write what the grammar needs next) fails too, saying so."""
    errors: dict[int, str] = {}
    try:
        mask_logits(logits, grammars)
    except Exception:  # noqa: BLE001 - one request's grammar must not fail the batch
        for i, grammar in enumerate(grammars):
            if grammar is not None:
                try:
                    mask_logits(logits[i : i + 1], [grammar])
                except Exception as e:  # noqa: BLE001 - whatever it is, only this row's request fails
                    errors[i] = f"grammar failed: {type(e).__name__}: {e}"
    masked = [i for i, g in enumerate(grammars) if g is not None and i not in errors]
    for i, dead in zip(masked, torch.isneginf(logits[masked]).all(dim=-1).tolist()):
        if dead:
            errors[i] = "the grammar allows no token of the model's vocabulary here: it cannot write what comes next"
    return errors
