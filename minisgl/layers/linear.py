from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.kernels.native import RoundedRows
from minisgl.layers.quant import QuantizedWeight

logger = logging.getLogger("minisgl.layers")


class Reducer(Protocol):
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the tensor-parallel ranks (in place) and return it."""
        ...


class RankGroup(Reducer, Protocol):
    """A tensor-parallel group as layers see it: this rank's index, the group's size, the sum."""

    rank: int
    size: int


@dataclass(frozen=True)
class Partition:
    """The share of a weight one tensor-parallel rank holds (Megatron-style).

    ``column``: rows of the [out, in] weight (output features). A fused weight lists one range per
    checkpoint part, in row order (QKV: the q, k and v rows of this rank's heads); the output stays
    sharded, nothing is communicated. ``row``: the input columns ``ranges[0]``; each rank's partial
    product is summed over the ranks with ``group.all_reduce``, then the bias (not sharded) is added
    once. The loader slices checkpoint tensors with the same ranges. ``reduce=False`` leaves a row
    partition's partial product unreduced, for a caller that sums several (the experts of a MoE block)
    and reduces once.
    """

    kind: Literal["column", "row"]
    ranges: tuple[tuple[int, int], ...]
    group: Reducer
    reduce: bool = True

    @property
    def size(self) -> int:
        return sum(end - start for start, end in self.ranges)


def column(group: Reducer | None, *ranges: tuple[int, int]) -> Partition | None:
    """A column partition, or None (the whole weight) without tensor parallelism."""
    return None if group is None else Partition("column", ranges, group)


def row(group: Reducer | None, cols: tuple[int, int], reduce: bool = True) -> Partition | None:
    return None if group is None else Partition("row", (cols,), group, reduce)


# On CPU, oneDNN's matmul with the weight packed once into its blocked layout is much faster than
# F.linear for decode shapes. Per step over SmolLM2's 30 layers (weights streamed from memory,
# 2-core CI machine): 1 row 35 -> 17.5 ms, 8 rows 40 -> 18, 32 rows 67 -> 40, 512 rows 587 -> 519;
# the 49k-row LM head at 32 rows 27 -> 9.4 ms. bf16 gains alike.
PACK_BATCH_HINT = 32  # rows oneDNN lays the weight out for: 32 and 256 measured the same, 1 worse


def packable_dtypes() -> tuple[torch.dtype, ...]:
    """The weight dtypes oneDNN packs on this CPU: bf16 only where it has oneDNN's bf16 instructions
    (AVX-512 BW/VL/DQ or AVX-NE-CONVERT); elsewhere (AVX2 alone) torch refuses to pack it and F.linear runs."""
    return (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T (+ b), with W either a plain [out, in] tensor or one packed by ``pack_weights``."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Module):
    """y = x W^T (+ b). Fused projections (QKV, gate/up) are one ``Linear`` whose rows are the
    concatenated rows of the separate checkpoint matrices: one matmul instead of three.

    ``in_features``/``out_features`` are the full model's; with a ``partition`` the parameters
    hold only this rank's share."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = False, partition: Partition | None = None
    ) -> None:
        super().__init__()
        self.partition = partition
        if partition is not None and not partition.reduce and bias:
            raise ValueError("an unreduced row partition cannot add its bias (each rank would add it once)")
        if partition is not None:
            if partition.kind == "column":
                out_features = partition.size
            else:
                in_features = partition.size
        self.shape = (out_features, in_features)
        # Never written for a layer the loader quantizes (``quantize`` drops it): untouched memory.
        self.weight: nn.Parameter | None = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.quantized: QuantizedWeight | None = None  # set by ``quantize``: every product then runs on it

    def quantize(self, weight: QuantizedWeight) -> None:
        """Run every product on ``weight`` (same shape, quantized) from now on; the dense weight is
        dropped, so the layer holds its quantized form only."""
        if (weight.out_features, weight.in_features) != self.shape:
            raise ValueError(f"quantized weight {weight} does not match the layer's {self.shape}")
        self.quantized = weight
        self.weight = None

    def takes_rounded(self, prefill_rows: int) -> bool:
        """Whether ``forward`` takes x as rows already rounded for its product (``RoundedRows``; see
        ``QuantizedWeight.takes_rounded``): the whole quantized weight of an unsharded layer."""
        q = self.quantized
        return q is not None and self.partition is None and q.takes_rounded(prefill_rows)

    def forward(
        self, x: torch.Tensor | RoundedRows, prefill_rows: int = 0, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x W^T (+ bias); the first ``prefill_rows`` rows of x are prefill tokens (``Batch.prefill_tokens``),
        which a quantized weight may run on their own path; x is rounded rows only where ``takes_rounded``.
        Written into ``out`` where given (x's shape but the last dimension): in place by a quantized weight's
        C kernels, copied there otherwise."""
        q, p = self.quantized, self.partition
        if out is not None:
            if q is not None and p is None and self.bias is None:
                return q.forward(x, prefill_rows, out)
            return out.copy_(self.forward(x, prefill_rows))
        if p is None or p.kind == "column":
            return self._matmul(x, self.bias, prefill_rows)
        y = self._matmul(x, None, prefill_rows)
        if p.reduce:
            y = p.group.all_reduce(y)
        return y if self.bias is None else y + self.bias

    def _matmul(self, x: torch.Tensor | RoundedRows, bias: torch.Tensor | None, prefill_rows: int) -> torch.Tensor:
        q = self.quantized
        if q is not None:
            y = q.forward(x, prefill_rows)  # not q(x): a module call's hook machinery costs ~3 us, 120 times a step
            return y if bias is None else y + bias
        assert self.weight is not None and isinstance(x, torch.Tensor), "a dense layer takes fp rows"
        return linear(x, self.weight, bias)


def pack_weights(model: nn.Module) -> None:
    """On CPU with oneDNN: replace every ``Linear``'s weight by its packed copy (same values).
    A tied LM head gets its own copy; the embedding keeps the plain one for lookups."""
    if not torch.backends.mkldnn.is_available():
        return
    packable, bf16_left_plain = packable_dtypes(), False
    for module in model.modules():
        w = module.weight if isinstance(module, Linear) else None
        if w is None or w.device.type != "cpu" or w.is_mkldnn:
            continue
        if w.dtype in packable:
            packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_BATCH_HINT)
            module.weight = nn.Parameter(packed, requires_grad=False)
        bf16_left_plain |= w.dtype == torch.bfloat16 and w.dtype not in packable
    if bf16_left_plain:
        logger.warning(
            "bfloat16 weights on a CPU without oneDNN's bf16 instructions: their products run several times "
            "slower than float32's here (benchmarks.many_rows' dense columns); --dtype float32 runs faster"
        )
