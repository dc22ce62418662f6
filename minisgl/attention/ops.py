"""Attention primitives the strategies share."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: object) -> torch.Tensor:
    """SDPA on [tokens, heads, dim] inputs. 4-D views matter: on CPU a masked 3-D call takes the
    slow math path instead of the flash kernel."""
    q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    return F.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True, **kw)[0].transpose(0, 1)  # type: ignore[arg-type]


def key_bias(valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An additive mask: 0 where a key is attended, -inf where it is not."""
    return torch.zeros(valid.shape, dtype=dtype, device=valid.device).masked_fill(~valid, float("-inf"))


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention that also returns the log-sum-exp of the scores, so two partial results
    over disjoint keys can be merged. ``q``: [batch, heads, n, d], ``k``/``v``: [batch, heads, m, d],
    ``bias``: additive, broadcast to the scores; lse: [batch, heads, n, 1]. On CPU the flash kernel
    returns the log-sum-exp itself, at half the cost of materialising the scores."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)
        return out, lse.unsqueeze(-1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if bias is not None:
        scores = scores + bias
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.matmul(torch.exp(scores - lse), v), lse
