"""A ``Batch`` built from requests, kept with the requests behind it (which the batch does not know)
and with what each of them does in the pass, which is what the pass is booked as."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minisgl.batch import AttentionKind, Batch, SamplingRows, ScoringRows
from minisgl.request import Req
from minisgl.sampler import Sampler


@dataclass(frozen=True)
class ForwardPass:
    batch: Batch
    reqs: list[Req]  # in batch order
    new_tokens: list[int]  # each request's tokens in the pass, its draft included
    sampled: list[Req]  # the requests sampled, in the order of their rows in ``batch.sample_rows``
    prefilled: list[Req]  # the requests computing prompt tokens (a chunk of the prompt, or its end)
    prefill_tokens: int  # prompt tokens computed
    decode_tokens: int  # computed after the prompt: one per request, more after a jump-forward or with a draft
    # Speculative decoding: the draft tokens computed after a request's tokens; such a request has one
    # sampled row for its last token and one after each draft token
    drafts: dict[Req, list[int]] = field(default_factory=dict)
    # Requests that score their prompt, with their scored rows in the pass, in the order of ``batch.score_rows``
    scored: list[tuple[Req, int]] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        prefills: list[Req],
        prefill_lens: list[int],
        decoding: list[Req],
        page_table: torch.Tensor,
        drafts: dict[Req, list[int]] | None = None,
    ) -> ForwardPass:
        """The next ``prefill_lens`` prompt tokens of each of ``prefills`` and every token of the
        ``decoding`` requests not computed yet, each from its ``device_len``, then the request's draft
        (if any); a request whose new tokens reach its end is sampled (its last token's logits give
        the next token), and after each of its draft tokens too. A request that scores its prompt has a
        scored row for each of its prompt tokens in the pass that has a prompt token after it."""
        drafts = drafts or {}
        reqs = prefills + decoding
        decode_lens = [r.extend_len + len(drafts.get(r, ())) for r in decoding]
        extend_lens = prefill_lens + decode_lens
        device = page_table.device
        ids: list[int] = []
        token_rows: list[int] = []
        positions: list[int] = []
        sample_rows: list[int] = []
        sampled: list[Req] = []
        rows = SamplingRows()
        score_rows: list[int] = []
        scoring = ScoringRows()
        scored: list[tuple[Req, int]] = []
        for req, n in zip(reqs, extend_lens):
            start = req.device_len
            draft = drafts.get(req, [])
            ids.extend(req.token_ids[start : start + n - len(draft)] + draft)
            positions.extend(range(start, start + n))
            token_rows.extend([req.row] * n)
            scored_end = min(start + n, req.prompt_len - 1) if req.scores_prompt else start
            if scored_end > start:  # positions start .. scored_end - 1 score the tokens after them
                first = len(ids) - n
                score_rows.extend(range(first, first + scored_end - start))
                scoring.next_ids.extend(req.token_ids[start + 1 : scored_end + 1])
                scoring.top = max(scoring.top, req.params.prompt_logprobs or 0)
                scored.append((req, scored_end - start))
            if start + n - len(draft) == req.seq_len:
                sampled.append(req)
                for position in range(req.seq_len, req.seq_len + len(draft) + 1):  # of each sampled token
                    sample_rows.append(len(ids) - start - n + position - 1)
                    rows.params.append(req.params)
                    rows.generators.append(Sampler.generator_for(req.params, position))
                    rows.grammars.append(req.grammar)
                    penalized = req.params.penalized
                    rows.outputs.append(req.output_ids + draft[: position - req.seq_len] if penalized else None)
        pos = torch.tensor(positions, dtype=torch.int64, device=device)
        if len(sample_rows) == len(ids):
            # Every token is sampled (decoding, with or without a draft): each is one decode query
            # attending to its request's KV up to its own position, so a draft is verified by the
            # decode kernels (the single C call among them) rather than as a prefill extension.
            attention, query_rows, query_prefixes = AttentionKind.DECODE, token_rows, positions
            query_lens = [1] * len(ids)
        else:
            attention, query_rows = AttentionKind.EXTEND, [r.row for r in reqs]
            query_prefixes, query_lens = [r.device_len for r in reqs], extend_lens
        batch = Batch(
            attention=attention,
            input_ids=torch.tensor(ids, dtype=torch.int64, device=device),
            positions=pos,
            out_slots=page_table[torch.tensor(token_rows, dtype=torch.int64, device=device), pos],
            table_rows=torch.tensor(query_rows, dtype=torch.int64),
            prefix_lens=torch.tensor(query_prefixes, dtype=torch.int64),
            extend_lens=torch.tensor(query_lens, dtype=torch.int64),
            sample_rows=torch.tensor(sample_rows, dtype=torch.int64, device=device),
            sampling=rows,
            prefill_tokens=sum(prefill_lens),
            score_rows=torch.tensor(score_rows, dtype=torch.int64),
            scoring=scoring,
        )
        return cls(batch, reqs, extend_lens, sampled, prefills, sum(prefill_lens), sum(decode_lens), drafts, scored)
