"""Read a model's weights (safetensors, or a GGUF file in place) and build the model with fused projections."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from safetensors import safe_open
from torch import nn

from minisgl.heap import HugePageArena
from minisgl.kernels.native import CpuKernels
from minisgl.layers.linear import Linear, Partition, pack_weights
from minisgl.layers.quant import QuantizedWeight
from minisgl.models.config import ModelConfig
from minisgl.models.decoder import DecoderForCausalLM
from minisgl.models.gguf_tensors import GGUFTensors
from minisgl.models.modes import check_mode
from minisgl.models.quantize import WeightSpec, apply_quantization, plan_quantization, release_dense
from minisgl.models.registry import model_class

if TYPE_CHECKING:
    from minisgl.distributed.group import TPGroup

logger = logging.getLogger("minisgl.loader")

# Checkpoint matrices that become one fused parameter, in row order (gate/up: of a dense MLP and of
# every MoE expert, ``mlp.experts.N.gate_up_proj``).
_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def _sources(param: str) -> list[str]:
    """The checkpoint tensors whose rows make up a model parameter, in row order."""
    module, _, kind = param.rpartition(".")
    for fused, parts in _FUSED.items():
        if module.endswith(fused):
            prefix = module[: -len(fused)]
            return [f"{prefix}{part}.{kind}" for part in parts]
    return [param]


class Checkpoint(Protocol):
    """Where the weights come from: tensors by Hugging Face name, dense fp32."""

    source: str  # for messages
    gguf: GGUFTensors | None  # a GGUF file's blocks, for ``auto``

    def names(self) -> set[str]: ...

    def read(self, name: str, partition: Partition | None, kind: str, part: int) -> torch.Tensor:
        """One tensor, or only this rank's slice of it."""
        ...


def _slice(partition: Partition | None, kind: str, part: int) -> tuple[slice, ...]:
    """The index of a rank's part of a checkpoint tensor (``Partition``)."""
    if partition is None or (partition.kind == "row" and kind == "bias"):
        return ()
    start, end = partition.ranges[part if partition.kind == "column" else 0]
    return (slice(start, end),) if partition.kind == "column" else (slice(None), slice(start, end))


class SafetensorsCheckpoint:
    """A Hugging Face folder's ``*.safetensors``: a rank's slice is read from the file, the rest never is."""

    gguf = None

    def __init__(self, folder: Path, stack: ExitStack) -> None:
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ValueError(f"{folder} has no *.safetensors weights")
        self.source = str(folder)
        self._handles: dict[str, Any] = {}
        for file in files:
            f = stack.enter_context(safe_open(str(file), framework="pt"))
            self._handles.update(dict.fromkeys(f.keys(), f))

    def names(self) -> set[str]:
        return set(self._handles)

    def read(self, name: str, partition: Partition | None, kind: str, part: int) -> torch.Tensor:
        index = _slice(partition, kind, part)
        f = self._handles[name]
        return f.get_slice(name)[index] if index else f.get_tensor(name)


class GGUFCheckpoint:
    """A GGUF file, memory-mapped: dense tensors are dequantized one at a time, quantized ones built
    from its blocks (``GGUFTensors``)."""

    def __init__(self, tensors: GGUFTensors) -> None:
        self.source, self.gguf = tensors.name, tensors

    def names(self) -> set[str]:
        return set(self.gguf.names())

    def read(self, name: str, partition: Partition | None, kind: str, part: int) -> torch.Tensor:
        value = self.gguf.dense(name)
        index = _slice(partition, kind, part)
        return value[index].contiguous() if index else value


def _read_dense(checkpoint: Checkpoint, spec: WeightSpec) -> torch.Tensor:
    partition = spec.module.partition
    parts = [checkpoint.read(s, partition, "weight", i) for i, s in enumerate(spec.sources)]
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _load_weights(model: DecoderForCausalLM, checkpoint: Checkpoint, quantized: set[str]) -> None:
    """Fill every dense parameter from the checkpoint: fused projections are concatenated from
    their parts, and a tensor-parallel shard reads only its slices (``Partition`` of its module).
    ``quantized``: the checkpoint tensors the quantized weights were built from."""
    available = checkpoint.names()
    used = set(quantized)
    if model.config.tie_word_embeddings:
        used.add("lm_head.weight")  # tied: the embedding is the LM head (a stored copy is ignored)
    missing, wrong = [], []
    # named_parameters lists a tied LM head once, under the embedding's name.
    for name, param in model.named_parameters():
        sources = _sources(name)
        if any(s not in available for s in sources):
            missing.append(name)
            continue
        module, _, kind = name.rpartition(".")
        partition = getattr(model.get_submodule(module), "partition", None)
        parts = [checkpoint.read(s, partition, kind, i) for i, s in enumerate(sources)]
        value = torch.cat(parts) if len(parts) > 1 else parts[0]
        if value.shape != param.shape:
            wrong.append(f"{name}: checkpoint {tuple(value.shape)}, model {tuple(param.shape)}")
            continue
        with torch.no_grad():
            param.copy_(value)
        used.update(sources)
    unexpected = sorted(available - used)
    if missing or unexpected or wrong:
        raise ValueError(
            f"checkpoint in {checkpoint.source} does not fit {type(model).__name__}: missing {missing}, unexpected {unexpected}"
            + (f", wrong shapes {wrong}" if wrong else "")
        )


def _weight_specs(model: DecoderForCausalLM) -> list[WeightSpec]:
    """Every linear layer with the checkpoint tensors its weight comes from (a tied LM head: the
    embedding's), then the embedding (after the LM head, whose choice a tied one shares)."""
    specs: list[WeightSpec] = []
    tied = model.config.tie_word_embeddings
    for name, module in model.named_modules():
        if isinstance(module, Linear):
            sources = ["model.embed_tokens.weight"] if name == "lm_head" and tied else _sources(f"{name}.weight")
            specs.append(WeightSpec(name, module, tuple(sources)))
    specs.append(WeightSpec("model.embed_tokens", model.model.embed_tokens, ("model.embed_tokens.weight",)))
    return specs


def load_model(
    folder: Path,
    dtype: torch.dtype,
    device: torch.device,
    max_positions: int,
    tp: TPGroup | None = None,
    quantization: str = "none",
    gguf_file: Path | None = None,
    kernels: CpuKernels | None = None,
) -> DecoderForCausalLM:
    """The model, or with ``tp`` this rank's shard of it. ``quantization``: see ``models.quantize``;
    ``gguf_file``: the weights' file (``folder`` then holds its config and tokenizer only);
    ``kernels``: the C kernels the model runs on the CPU (None: torch's)."""
    check_mode(quantization)
    cfg = ModelConfig.from_folder(folder)
    cls = model_class(cfg.architecture)
    model = cls(cfg, max_positions, tp)
    specs = _weight_specs(model)
    with ExitStack() as stack:
        checkpoint: Checkpoint = (
            GGUFCheckpoint(GGUFTensors(gguf_file, kernels))
            if gguf_file is not None
            else SafetensorsCheckpoint(folder, stack)
        )
        gguf = checkpoint.gguf if quantization == "auto" else None  # int4 / int8 round the dense values
        # The C kernels stream the weights' own buffers each decode step: from huge pages (minisgl.heap).
        arena = HugePageArena() if device.type == "cpu" and kernels is not None else None
        plan, summary = plan_quantization(specs, quantization, partial(_read_dense, checkpoint), gguf, arena)
        release_dense(specs, plan)
        _load_weights(model, checkpoint, {s for spec in specs if spec.name in plan for s in spec.sources})
    shard = "" if tp is None else f" (tensor-parallel rank {tp.rank} of {tp.size})"
    logger.info("loaded %s (%d layers) from %s%s", cfg.architecture, cfg.num_layers, checkpoint.source, shard)
    logger.info("quantization %s: %s", quantization, summary)
    model = model.to(device=device, dtype=dtype).eval()
    apply_quantization(specs, plan, dtype, device, c_kernels=kernels is not None)
    pack_weights(model)
    model.use_kernels(kernels if device.type == "cpu" else None)
    return model


def memory_bytes(model: nn.Module) -> dict[str, int]:
    """What the loaded model holds, in bytes: ``weights`` (every parameter and buffer, quantized
    codes and scales included; memory that several tensors share, as a tied one or the views of the
    quantized weights' common buffer, once) and the many-row products' ``dequant_buffer``."""
    tensors = [*model.parameters(), *model.buffers()]
    packed = {id(t): t.numel() * t.element_size() for t in tensors if t.is_mkldnn}  # oneDNN's copies: no storage
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors if not t.is_mkldnn)
    weights, end = sum(packed.values()), 0
    for start, stop in spans:  # their union
        weights += max(0, stop - max(start, end))
        end = max(end, stop)
    buffers = {id(m.buffer): m.buffer.nbytes for m in model.modules() if isinstance(m, QuantizedWeight) and m.buffer}
    return {"weights": weights, "dequant_buffer": sum(buffers.values())}
