"""Choose and build each ``Linear``'s quantized weight for a quantization mode.

- ``none``: dense weights (the dtype's), as loaded.
- ``int4`` / ``int8``: every linear layer (the LM head too) round-to-nearest at load: int4 per
  group of 32 input columns (min/max), int8 per output row (symmetric).
- ``auto``: a GGUF file's own precision. Q4_0 / Q4_1 / Q4_K run as int4 with the file's codes and
  group scales (exact; Q4_K's products of scales rounded to fp16), where a layer has a multiple of
  64 input features (the kernel's block), else as int8; 5 to 8 bit formats as int8 per row
  (requantized: the kernel has one scale per row, the file one per 32 or 16 weights); anything else
  (F32, F16, 2-3 bit and i-quants) stays dense. A Hugging Face folder has no quantized tensors:
  ``auto`` is ``none`` there.

Quantized weights are built from the fp32 values on the CPU, before the model is cast to its dtype
(a bf16 rounding first would move codes to the wrong bucket).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from minisgl.layers.linear import Linear, Partition
from minisgl.layers.quant import INT4_BLOCK, Int4Weight, Int8Weight, QuantizedWeight, quantize_weight
from minisgl.models.gguf_quant import INT4_EXACT, INT8_NEAREST, GGUFWeights, Grid

QUANTIZATION_MODES = ("auto", "none", "int4", "int8")

# (module name, its linear layer, the checkpoint tensors whose rows make up its weight)
LinearSpec = tuple[str, Linear, list[str]]


@dataclass(frozen=True)
class Choice:
    """What one linear layer runs in, and why (for the start-up log)."""

    weight: QuantizedWeight | None
    reason: str


def check_mode(mode: str) -> None:
    if mode not in QUANTIZATION_MODES:
        raise ValueError(f"unknown quantization {mode!r}; choose one of {', '.join(QUANTIZATION_MODES)}")


def plan_quantization(
    linears: list[LinearSpec], mode: str, gguf: GGUFWeights | None
) -> tuple[dict[str, QuantizedWeight], str]:
    """The quantized weight of each linear layer that gets one (by module name), and a summary
    counting what runs in what. Raises ``ValueError`` if the mode cannot take a layer's weight."""
    check_mode(mode)
    if mode == "none" or (mode == "auto" and gguf is None):
        return {}, "dense weights"
    plan: dict[str, QuantizedWeight] = {}
    reasons: Counter[str] = Counter()
    for name, linear, sources in linears:
        choice = _choose_auto(linear, sources, gguf) if gguf is not None else _choose_rtn(linear, mode)
        reasons[choice.reason] += 1
        if choice.weight is not None:
            plan[name] = choice.weight
    return plan, "; ".join(f"{n} x {reason}" for reason, n in reasons.items())


def _dense(linear: Linear) -> torch.Tensor:
    return linear.weight.detach()


def _choose_rtn(linear: Linear, mode: str) -> Choice:
    w = _dense(linear)
    if mode == "int4" and w.shape[1] % INT4_BLOCK:
        raise ValueError(
            f"quantization='int4' needs a multiple of {INT4_BLOCK} input features; a layer has {w.shape[1]}"
        )
    return Choice(quantize_weight(w, "int4" if mode == "int4" else "int8"), f"{mode} (round-to-nearest)")


def _choose_auto(linear: Linear, sources: list[str], gguf: GGUFWeights) -> Choice:
    missing = [s for s in sources if s not in gguf]
    if missing:
        return Choice(None, f"dense ({', '.join(missing)} not in {gguf.name})")
    kinds = sorted({gguf.type_name(s) for s in sources})
    label = "/".join(kinds)
    if all(k in INT4_EXACT for k in kinds) and linear.weight.shape[1] % INT4_BLOCK == 0:
        grids = [gguf.grid(s) for s in sources]
        grid = _shard(Grid.cat(grids), linear.partition, [g.scale.shape[0] for g in grids])
        return Choice(Int4Weight.from_groups(_dense(linear), grid.scale, grid.minimum), f"int4 ({label}, exact codes)")
    if all(k in INT8_NEAREST or k in INT4_EXACT for k in kinds):
        return Choice(Int8Weight.quantize(_dense(linear)), f"int8 per row ({label} requantized)")
    return Choice(None, f"dense ({label}: no CPU kernel for it)")


def _shard(grid: Grid, partition: Partition | None, part_rows: list[int]) -> Grid:
    """This tensor-parallel rank's part of a fused grid, sliced like the loader slices the weight."""
    if partition is None:
        return grid
    if partition.kind == "row":
        return grid.columns(*partition.ranges[0])
    offsets = [sum(part_rows[:i]) for i in range(len(part_rows))]
    return Grid.cat([grid.rows(off + start, off + end) for off, (start, end) in zip(offsets, partition.ranges)])


def apply_quantization(linears: list[LinearSpec], plan: dict[str, QuantizedWeight], dtype: torch.dtype) -> None:
    """Install the planned weights: on the CPU the quantized kernels run; elsewhere (no kernel is
    wired for CUDA yet) the layer keeps a dense copy of the same quantized values."""
    for name, linear, _ in linears:
        weight = plan.get(name)
        if weight is None:
            continue
        dense = linear.weight
        if dense.device.type == "cpu":
            linear.quantize(weight)
        else:
            linear.weight = torch.nn.Parameter(weight.dequantize(dtype).to(dense.device), requires_grad=False)
