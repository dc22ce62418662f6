"""Choose and build each weight's quantized form for a quantization mode.

- ``none``: dense weights (the dtype's), as loaded.
- ``int4`` / ``int8``: every linear layer (the LM head too) round-to-nearest at load: int4 per
  group of 32 input columns (min/max), int8 per output row (symmetric).
- ``auto``: a GGUF file's own precision, every linear layer and the embedding. Q4_0 / Q4_1 / Q4_K
  run as int4 with the file's codes and group scales, taken from its blocks (exact; Q4_K's products
  of scales rounded to fp16), where a layer has a multiple of 32 input features (the kernel's
  group), else as int8; 5 to 8 bit formats as int8 per row (requantized: the kernel has one scale
  per row, the file one per 32 or 16 weights); anything else (F32, F16, 2-3 bit and i-quants) stays
  dense. A Hugging Face folder has no quantized tensors: ``auto`` is ``none`` there.

A quantized weight is built straight from the checkpoint, one weight at a time, and its layer never
holds a dense copy (``Linear.quantize``). An embedding tied to a quantized LM head looks its rows up
in the LM head's weight. RTN weights are built from the fp32 values, before the model is cast to
its dtype (a bf16 rounding first would move codes to the wrong bucket).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from minisgl.heap import HugePageArena
from minisgl.layers.embedding import VocabEmbedding
from minisgl.layers.linear import Linear, Partition
from minisgl.layers.quant import (
    INT4_GROUP,
    DequantBuffer,
    Int4Weight,
    Int8Weight,
    QuantizedWeight,
    quantize_weight,
)
from minisgl.models.gguf_tensors import INT4_EXACT, INT8_NEAREST, GGUFTensors
from minisgl.models.modes import check_mode
from minisgl.tuning import DEQUANT_BUFFER_ELEMENTS


@dataclass(frozen=True)
class WeightSpec:
    """A weight that can be quantized: its module, the checkpoint tensors whose rows make it up, and
    whether it is an embedding table (quantized only by ``auto``, or with the LM head it is tied to)."""

    name: str
    module: Linear | VocabEmbedding
    sources: tuple[str, ...]

    @property
    def is_embedding(self) -> bool:
        return isinstance(self.module, VocabEmbedding)


# The dense fp32 value of a spec's weight, this rank's slice, read from the checkpoint.
DenseReader = Callable[[WeightSpec], torch.Tensor]


@dataclass(frozen=True)
class Choice:
    """What one weight runs in, and why (for the start-up log)."""

    weight: QuantizedWeight | None
    reason: str


def plan_quantization(
    specs: list[WeightSpec], mode: str, read_dense: DenseReader, gguf: GGUFTensors | None,
    arena: HugePageArena | None = None,
) -> tuple[dict[str, QuantizedWeight], str]:  # fmt: skip
    """The quantized weight of each spec that gets one (by module name; specs with the same sources
    share one), and a summary counting what runs in what. Raises ``ValueError`` if the mode cannot
    take a layer's weight. With an ``arena`` (the C kernels stream the weights from huge pages), a
    GGUF's weights the C kernels build are built in it, and any other moves into it as soon as it is
    built, so that memory holds the old buffers of one weight at most."""
    check_mode(mode)
    if mode == "none" or (mode == "auto" and gguf is None):
        return {}, "dense weights"
    plan: dict[str, QuantizedWeight] = {}
    built: dict[tuple[str, ...], Choice] = {}
    reasons: Counter[str] = Counter()
    for spec in specs:
        if spec.sources in built:  # an embedding tied to the LM head
            choice = Choice(built[spec.sources].weight, "embedding tied to the LM head")
        else:
            choice = _choose(spec, mode, read_dense, gguf, arena)
            if arena is not None and choice.weight is not None:
                choice.weight.move_into(arena)
        built[spec.sources] = choice
        reasons[choice.reason] += 1
        if choice.weight is not None:
            plan[spec.name] = choice.weight
    return plan, "; ".join(f"{n} x {reason}" for reason, n in reasons.items())


def _choose(
    spec: WeightSpec, mode: str, read_dense: DenseReader, gguf: GGUFTensors | None, arena: HugePageArena | None
) -> Choice:
    """The weight built for a spec no earlier one shares its sources with."""
    if gguf is not None:
        return _choose_auto(spec, read_dense, gguf, arena)
    if spec.is_embedding:
        return Choice(None, "dense (embedding)")
    return _choose_rtn(spec, read_dense, mode)


def _choose_rtn(spec: WeightSpec, read_dense: DenseReader, mode: str) -> Choice:
    in_features = spec.module.shape[1]
    if mode == "int4" and in_features % INT4_GROUP:
        raise ValueError(
            f"quantization='int4' needs a multiple of {INT4_GROUP} input features; a layer has {in_features}"
        )
    return Choice(quantize_weight(read_dense(spec), "int4" if mode == "int4" else "int8"), f"{mode} (round-to-nearest)")


def _choose_auto(spec: WeightSpec, read_dense: DenseReader, gguf: GGUFTensors, arena: HugePageArena | None) -> Choice:
    missing = [s for s in spec.sources if s not in gguf]
    if missing:
        return Choice(None, f"dense ({', '.join(missing)} not in {gguf.name})")
    kinds = sorted({gguf.type_name(s) for s in spec.sources})
    label = "/".join(kinds)
    what = "embedding " if spec.is_embedding else ""
    if all(k in INT4_EXACT for k in kinds) and spec.module.shape[1] % INT4_GROUP == 0:
        weight = _shard(gguf, spec.sources, spec.module.partition, arena)
        return Choice(weight, f"{what}int4 ({label}, exact codes)")
    if all(k in INT8_NEAREST or k in INT4_EXACT for k in kinds):
        partition = spec.module.partition
        weight = gguf.int8(*spec.sources, arena=arena) if partition is None else Int8Weight.quantize(read_dense(spec))
        return Choice(weight, f"{what}int8 per row ({label} requantized)")
    return Choice(None, f"{what}dense ({label}: no CPU kernel for it)")


def _shard(
    gguf: GGUFTensors, sources: tuple[str, ...], partition: Partition | None, arena: HugePageArena | None
) -> Int4Weight:
    """This tensor-parallel rank's share of a fused int4 weight, sliced like the loader slices a dense
    one. A whole weight is built in ``arena`` where given; a slice is copied there by ``plan_quantization``."""
    if partition is None:
        return gguf.int4(*sources, arena=arena)
    if partition.kind == "row":
        return gguf.int4(*sources).columns(*partition.ranges[0])
    return Int4Weight.cat([gguf.int4(s).rows(start, end) for s, (start, end) in zip(sources, partition.ranges)])


def release_dense(specs: list[WeightSpec], plan: dict[str, QuantizedWeight]) -> None:
    """Drop the (never written) dense parameter of every planned module, before anything reads it."""
    for spec in specs:
        if spec.name in plan:
            spec.module.weight = None


def apply_quantization(
    specs: list[WeightSpec], plan: dict[str, QuantizedWeight], dtype: torch.dtype, device: torch.device,
    c_kernels: bool,
) -> None:  # fmt: skip
    """Install the planned weights: on the CPU the quantized kernels run; elsewhere (no kernel is
    wired for CUDA yet) the module gets a dense copy of the same quantized values. On the CPU without
    the C kernels (``c_kernels``), the weights share one ``DequantBuffer`` for their many-row products."""
    buffer = _shared_buffer(plan) if device.type == "cpu" and plan and not c_kernels else None
    for spec in specs:
        weight = plan.get(spec.name)
        if weight is None:
            continue
        module = spec.module
        if device.type != "cpu":
            module.weight = torch.nn.Parameter(weight.dequantize(dtype).to(device), requires_grad=False)
            continue
        weight.buffer = buffer
        if isinstance(module, VocabEmbedding):
            module.quantize(weight, dtype)
        else:
            module.quantize(weight)


def _shared_buffer(plan: dict[str, QuantizedWeight]) -> DequantBuffer:
    """Room for the largest weight inside the decoder layers (up to ``DEQUANT_BUFFER_ELEMENTS``):
    larger ones, and the vocabulary-sized LM head, run band by band."""
    layer_weights = [w for name, w in plan.items() if name.startswith("model.layers.")] or list(plan.values())
    largest = max(w.out_features * w.in_features for w in layer_weights)
    widest = max(w.in_features for w in plan.values())
    return DequantBuffer(max(widest, min(largest, DEQUANT_BUFFER_ELEMENTS)))
