"""A ``Batch`` built from requests, kept with the requests behind it (which the batch does not know)
and with what each of them does in the pass, which is what the pass is booked as."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.batch import AttentionKind, Batch
from minisgl.request import Req
from minisgl.sampling import SamplingRows


@dataclass(frozen=True)
class ForwardPass:
    batch: Batch
    reqs: list[Req]  # in batch order
    sampled: list[Req]  # the requests of ``batch.sample_rows``, in order
    prefilled: list[Req]  # the requests computing prompt tokens (a chunk of the prompt, or its end)
    prefill_tokens: int  # prompt tokens computed
    decode_tokens: int  # tokens computed after the prompt: one per request, more after a jump-forward

    @classmethod
    def build(
        cls, prefills: list[Req], prefill_lens: list[int], decoding: list[Req], page_table: torch.Tensor
    ) -> ForwardPass:
        """The next ``prefill_lens`` prompt tokens of each of ``prefills`` and every token of the
        ``decoding`` requests not computed yet, each from its ``device_len``; a request whose new
        tokens reach its end is sampled (its last token's logits give the next token)."""
        reqs = prefills + decoding
        decode_lens = [r.extend_len for r in decoding]
        extend_lens = prefill_lens + decode_lens
        device = page_table.device
        ids: list[int] = []
        token_rows: list[int] = []
        positions: list[int] = []
        sample_rows: list[int] = []
        sampled: list[Req] = []
        for req, n in zip(reqs, extend_lens):
            start = req.device_len
            ids.extend(req.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            token_rows.extend([req.row] * n)
            if start + n == req.seq_len:
                sample_rows.append(len(ids) - 1)
                sampled.append(req)
        pos = torch.tensor(positions, dtype=torch.int64, device=device)
        one_each = len(sampled) == len(reqs) and all(n == 1 for n in extend_lens)
        batch = Batch(
            attention=AttentionKind.DECODE if one_each else AttentionKind.EXTEND,
            input_ids=torch.tensor(ids, dtype=torch.int64, device=device),
            positions=pos,
            out_slots=page_table[torch.tensor(token_rows, dtype=torch.int64, device=device), pos],
            table_rows=torch.tensor([r.row for r in reqs], dtype=torch.int64),
            prefix_lens=torch.tensor([r.device_len for r in reqs], dtype=torch.int64),
            extend_lens=torch.tensor(extend_lens, dtype=torch.int64),
            sample_rows=torch.tensor(sample_rows, dtype=torch.int64, device=device),
            sampling=SamplingRows(
                [r.params for r in sampled], [r.generator for r in sampled], [r.grammar for r in sampled]
            ),
        )
        return cls(batch, reqs, sampled, prefills, sum(prefill_lens), sum(decode_lens))
