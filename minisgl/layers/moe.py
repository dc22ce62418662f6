"""Sparse mixture-of-experts block (Qwen3-MoE): a router picks each token's top-k experts."""

from __future__ import annotations

import torch
from torch import nn

from minisgl.layers.linear import Linear, RankGroup
from minisgl.layers.mlp import GatedMLP


class SparseMoE(nn.Module):
    """Router softmax over the experts, top-k (renormalised with ``norm_topk_prob``), then the
    router-weighted sum of those experts' outputs.

    The (token, expert) pairs are sorted by expert, so each expert that has tokens runs one matmul
    over all of them per step, through the same ``Linear`` as dense layers. Tensor parallelism splits
    every expert's intermediate dimension (each rank runs all experts on its slice, no load
    imbalance); the experts' partial outputs are summed locally and all-reduced once per block."""

    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int,
        intermediate: int,
        norm_topk_prob: bool,
        tp: RankGroup | None,
        part: tuple[int, int],
    ) -> None:
        """``part``: this rank's range of every expert's intermediate dimension."""
        super().__init__()
        self.top_k, self.norm_topk_prob, self.tp = top_k, norm_topk_prob, tp
        self.gate = Linear(hidden, num_experts)  # the router, replicated on every rank
        self.experts = nn.ModuleList(GatedMLP(hidden, intermediate, tp, part, reduce=False) for _ in range(num_experts))

    def forward(self, x: torch.Tensor, prefill_rows: int = 0) -> torch.Tensor:
        """The first ``prefill_rows`` tokens are prefill tokens (``Batch.prefill_tokens``)."""
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)  # [tokens, top_k]
        if self.norm_topk_prob:
            weights /= weights.sum(dim=-1, keepdim=True)
        flat = chosen.flatten()
        order = torch.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
        token = order // self.top_k
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        # An expert's tokens come in token order (the sort is stable): its prefill tokens first.
        prefills = torch.bincount(chosen[:prefill_rows].flatten(), minlength=len(self.experts)).tolist()
        grouped = x.index_select(0, token)
        out = torch.empty_like(grouped)
        start = 0
        for expert, n, prefill in zip(self.experts, counts, prefills):
            if n:
                out[start : start + n] = expert(grouped[start : start + n], prefill)
                start += n
        out *= weights.flatten().index_select(0, order).to(x.dtype).unsqueeze(1)
        y = torch.zeros_like(x).index_add_(0, token, out)
        return y if self.tp is None else self.tp.all_reduce(y)
