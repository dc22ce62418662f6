"""One forward pass worth of requests, with the tensors built once for the whole pass."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.request import Req


@dataclass
class Batch:
    reqs: list[Req]
    is_prefill: bool
    extend_lens: list[int]  # new tokens per request in this pass
    input_ids: torch.Tensor  # [tokens]
    positions: torch.Tensor  # [tokens]
    out_slots: torch.Tensor  # [tokens] KV slots the new tokens' K/V are written to
    logit_rows: torch.Tensor  # rows of the token dimension whose logits are sampled
    sampling_reqs: list[Req]  # the requests those rows belong to, in order

    @classmethod
    def build(cls, reqs: list[Req], extend_lens: list[int], is_prefill: bool, page_table: torch.Tensor) -> Batch:
        device = page_table.device
        ids: list[int] = []
        rows: list[int] = []
        positions: list[int] = []
        logit_rows: list[int] = []
        sampling: list[Req] = []
        for req, n in zip(reqs, extend_lens):
            start = req.device_len
            ids.extend(req.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            rows.extend([req.row] * n)
            if start + n == req.seq_len:  # the chunk reaches the end: its last token is sampled
                logit_rows.append(len(ids) - 1)
                sampling.append(req)
        pos = torch.tensor(positions, dtype=torch.int64, device=device)
        out_slots = page_table[torch.tensor(rows, dtype=torch.int64, device=device), pos]
        return cls(
            reqs=reqs,
            is_prefill=is_prefill,
            extend_lens=extend_lens,
            input_ids=torch.tensor(ids, dtype=torch.int64, device=device),
            positions=pos,
            out_slots=out_slots,
            logit_rows=torch.tensor(logit_rows, dtype=torch.int64, device=device),
            sampling_reqs=sampling,
        )
