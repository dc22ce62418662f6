"""Perplexity of a loaded model on a text, to measure what a quantization mode costs in quality.

The text is fed in chunks of a few tokens, as decode and small prefills run (the C kernels compute a
row the same at any row count; without them, torch's kernels run up to ``QuantizedWeight.max_kernel_rows``).
Its attention is fp32 SDPA over K/V kept per layer, or, given an attention backend's ``prepare`` (the
engine's ``scoring_attention``), the engine's own: its KV pool's dtype, its kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from minisgl.batch import AttentionContext, AttentionKind, Batch, PagedKV
from minisgl.models.decoder import DecoderForCausalLM

CHUNK_TOKENS = 16


class _SequenceContext:
    """The ``AttentionContext`` of one sequence: K/V kept per layer, causal over the whole prefix
    (within the layer's window, for a sliding-window layer)."""

    paged: PagedKV | None = None

    def __init__(self, layer_windows: tuple[int | None, ...]) -> None:
        self.layer_windows = layer_windows
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if layer_id in self.k:
            k, v = torch.cat([self.k[layer_id], k]), torch.cat([self.v[layer_id], v])
        self.k[layer_id], self.v[layer_id] = k, v
        new, total = q.shape[0], k.shape[0]
        # Row i (absolute position total - new + i) sees keys 0 .. total - new + i.
        mask = torch.ones(new, total, dtype=torch.bool, device=q.device).tril(total - new)
        window = self.layer_windows[layer_id] if self.layer_windows else None
        if window is not None:  # and keys more than window - 1 positions back are out of sight
            mask = mask.triu(total - new - window + 1)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, enable_gqa=True
        )
        return out.transpose(0, 1).reshape(new, -1)


Prepare = Callable[[Batch], AttentionContext]


def _extend_batch(start: int, n: int, device: torch.device) -> Batch:
    """Tokens start .. start + n of the sequence as one extend pass of page-table row 0, whose slot i
    holds position i (its ids are placeholders: the attention backend reads only the lengths and slots)."""
    positions = torch.arange(start, start + n, device=device)
    return Batch(
        attention=AttentionKind.EXTEND, input_ids=torch.zeros(n, dtype=torch.int64, device=device),
        positions=positions, out_slots=positions, table_rows=torch.tensor([0]), prefix_lens=torch.tensor([start]),
        extend_lens=torch.tensor([n]), sample_rows=torch.arange(n, device=device), prefill_tokens=n,
    )  # fmt: skip


@torch.inference_mode()
def sequence_logits(
    model: DecoderForCausalLM, token_ids: list[int], chunk: int = CHUNK_TOKENS, prepare: Prepare | None = None
) -> torch.Tensor:
    """[tokens, vocab] fp32: the logits after each token, given the ones before it. ``prepare``: an
    attention backend's whose page-table row 0 holds at least as many slots as tokens, slot i at
    position i (None: fp32 SDPA)."""
    sequence = _SequenceContext(model.config.layer_windows)
    device = model.device
    ids = torch.tensor(token_ids, dtype=torch.int64, device=device)
    pieces = []
    for start in range(0, len(ids), chunk):
        piece = ids[start : start + chunk]
        positions = torch.arange(start, start + len(piece), device=device)
        ctx = sequence if prepare is None else prepare(_extend_batch(start, len(piece), device))
        pieces.append(model(piece, positions, ctx, torch.arange(len(piece), device=device), len(piece)).float())
    return torch.cat(pieces)


def perplexity(
    model: DecoderForCausalLM, token_ids: list[int], chunk: int = CHUNK_TOKENS, prepare: Prepare | None = None
) -> float:
    """exp(mean negative log-likelihood) of each token after the first, given the ones before it
    (``prepare`` as for ``sequence_logits``)."""
    if len(token_ids) < 2:
        raise ValueError("perplexity needs at least 2 tokens")
    logits = sequence_logits(model, token_ids[:-1], chunk, prepare)
    nll = F.cross_entropy(logits.double(), torch.tensor(token_ids[1:], device=logits.device), reduction="mean")
    return math.exp(nll.item())
