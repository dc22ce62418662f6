from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from minisgl.kernels.native import CpuKernels

# (cos, signed sin) for a batch's positions, [tokens, 1, head_dim]: the sin's first half negated,
# so that rotate-half is a roll (``apply_rotary``).
Rope = tuple[torch.Tensor, torch.Tensor]


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.x long-context scaling: slow down low frequencies, keep high ones, blend between."""
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE with a cos/sin table precomputed for every position, so a forward pass
    only indexes it. Same arithmetic as Hugging Face's, hence bit-identical in fp32."""

    cos: torch.Tensor  # [max_positions, head_dim], registered as buffers so .to(device) moves them
    sin: torch.Tensor

    def __init__(self, head_dim: int, max_positions: int, base: float, scaling: dict[str, Any] | None) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        rope_type = (scaling or {}).get("rope_type", "default")
        if rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, scaling)  # type: ignore[arg-type]
        elif rope_type == "linear":  # positions divided by the factor (Gemma 3's full-attention layers)
            inv_freq = inv_freq / scaling["factor"]  # type: ignore[index]
        elif rope_type != "default":
            raise ValueError(f"unsupported rope scaling type {rope_type!r}")
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        half = head_dim // 2
        signed_sin = torch.cat((-emb[:, :half].sin(), emb[:, half:].sin()), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", signed_sin, persistent=False)

    def table(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        """Looked up once per forward pass and shared by every layer."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)


def apply_rotary(x: torch.Tensor, rope: Rope, kernels: CpuKernels | None = None) -> torch.Tensor:
    """``x``: [tokens, heads, head_dim] (queries and keys together, when they lie side by side);
    ``rope``: from ``RotaryEmbedding.table``. x * cos + rotate_half(x) * sin with rotate_half(x) =
    (-x2, x1): the roll gives (x2, x1) and the signed sin the minus, the same products bit for bit
    in four ops instead of six per tensor. fp32 on the CPU with the engine's ``kernels``: the same
    values in one C pass."""
    cos, signed_sin = rope
    if kernels is not None and x.dtype == torch.float32 and x.is_cpu:
        tokens, d = x.shape[0], x.shape[-1]
        return kernels.rotary(x, cos.view(tokens, d), signed_sin.view(tokens, d))
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin
