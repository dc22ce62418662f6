"""A ``Batch`` built from requests, kept with the requests behind it (which the batch does not know)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.batch import Batch
from minisgl.request import Req
from minisgl.sampling import SamplingRows


@dataclass(frozen=True)
class ForwardPass:
    batch: Batch
    reqs: list[Req]  # in batch order
    sampled: list[Req]  # the requests of ``batch.sample_rows``, in order

    @classmethod
    def build(cls, reqs: list[Req], extend_lens: list[int], is_prefill: bool, page_table: torch.Tensor) -> ForwardPass:
        """Each request's next ``extend_lens`` tokens from its ``device_len``; a request whose chunk
        reaches its end is sampled (its last token's logits give the next token)."""
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
        batch = Batch(
            is_prefill=is_prefill,
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
        return cls(batch, reqs, sampled)
