"""Find a model, read its safetensors and build the model with fused projections."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

from minisgl.layers.linear import Linear, Partition, pack_weights
from minisgl.layers.quant import QuantizedWeight
from minisgl.models.config import ModelConfig
from minisgl.models.decoder import DecoderForCausalLM
from minisgl.models.quantize import LinearSpec, apply_quantization, check_mode, plan_quantization
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


def resolve_model_path(model: str | Path | None) -> Path:
    """A Hugging Face folder as is; a GGUF file (or None: the default model) converted once."""
    from minisgl.models.gguf import convert_gguf, default_model_path

    if model is None:
        return convert_gguf(default_model_path())
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.is_file():
        return convert_gguf(path)
    raise ValueError(f"model path {str(model)!r} does not exist (expected a Hugging Face folder or a .gguf file)")


def resolve_gguf_file(model: str | Path | None) -> Path | None:
    """The GGUF file a model comes from (None: the default model's), or None for a HF folder."""
    from minisgl.models.gguf import default_model_path

    if model is None:
        return default_model_path()
    path = Path(model).expanduser()
    return path if path.is_file() else None


def _sources(param: str) -> list[str]:
    """The checkpoint tensors whose rows make up a model parameter, in row order."""
    module, _, kind = param.rpartition(".")
    for fused, parts in _FUSED.items():
        if module.endswith(fused):
            prefix = module[: -len(fused)]
            return [f"{prefix}{part}.{kind}" for part in parts]
    return [param]


def _read(f: Any, name: str, partition: Partition | None, kind: str, part: int) -> torch.Tensor:
    """One checkpoint tensor, or only this rank's slice of it: the slice is read from the file,
    the rest never is."""
    if partition is None or (partition.kind == "row" and kind == "bias"):
        return f.get_tensor(name)
    start, end = partition.ranges[part if partition.kind == "column" else 0]
    sl = f.get_slice(name)
    return sl[start:end] if partition.kind == "column" else sl[:, start:end]


def _load_weights(model: DecoderForCausalLM, folder: Path) -> None:
    """Fill every parameter from the safetensors files: fused projections are concatenated from
    their parts, and a tensor-parallel shard reads only its slices (``Partition`` of its module)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} has no *.safetensors weights")
    with ExitStack() as stack:
        handles: dict[str, Any] = {}
        for file in files:
            f = stack.enter_context(safe_open(str(file), framework="pt"))
            handles.update(dict.fromkeys(f.keys(), f))
        used = set()
        if model.config.tie_word_embeddings:
            used.add("lm_head.weight")  # tied: the embedding is the LM head (a stored copy is ignored)
        missing, wrong = [], []
        # named_parameters lists a tied LM head once, under the embedding's name.
        for name, param in model.named_parameters():
            sources = _sources(name)
            if any(s not in handles for s in sources):
                missing.append(name)
                continue
            module, _, kind = name.rpartition(".")
            partition = getattr(model.get_submodule(module), "partition", None)
            parts = [_read(handles[s], s, partition, kind, i) for i, s in enumerate(sources)]
            value = torch.cat(parts) if len(parts) > 1 else parts[0]
            if value.shape != param.shape:
                wrong.append(f"{name}: checkpoint {tuple(value.shape)}, model {tuple(param.shape)}")
                continue
            with torch.no_grad():
                param.copy_(value)
            used.update(sources)
        unexpected = sorted(set(handles) - used)
    if missing or unexpected or wrong:
        raise ValueError(
            f"checkpoint in {folder} does not fit {type(model).__name__}: missing {missing}, unexpected {unexpected}"
            + (f", wrong shapes {wrong}" if wrong else "")
        )


def _linear_specs(model: DecoderForCausalLM) -> list[LinearSpec]:
    """Every linear layer with the checkpoint tensors its weight comes from (a tied LM head: the embedding)."""
    specs: list[LinearSpec] = []
    for name, module in model.named_modules():
        if isinstance(module, Linear):
            tied = name == "lm_head" and model.config.tie_word_embeddings
            specs.append((name, module, ["model.embed_tokens.weight"] if tied else _sources(f"{name}.weight")))
    return specs


def _quantization_plan(
    linears: list[LinearSpec], mode: str, gguf_file: Path | None, tp: TPGroup | None
) -> tuple[dict[str, QuantizedWeight], str]:
    """A GGUF model's quantized weights come from the cache when they were built before."""
    from minisgl.models.gguf_quant import GGUFWeights
    from minisgl.models.quant_cache import cache_file, cached_plan

    if gguf_file is None or mode == "none":
        return plan_quantization(linears, mode, None)
    path = cache_file(gguf_file, mode, 0 if tp is None else tp.rank, 1 if tp is None else tp.size)
    return cached_plan(path, lambda: plan_quantization(linears, mode, GGUFWeights(gguf_file) if mode == "auto" else None))


def load_model(
    folder: Path,
    dtype: torch.dtype,
    device: torch.device,
    max_positions: int,
    tp: TPGroup | None = None,
    quantization: str = "none",
    gguf_file: Path | None = None,
) -> DecoderForCausalLM:
    """The model, or with ``tp`` this rank's shard of it. ``quantization``: see ``models.quantize``;
    ``gguf_file`` is the file ``folder`` was converted from (``auto`` reads its quantized blocks)."""
    check_mode(quantization)
    cfg = ModelConfig.from_folder(folder)
    cls = model_class(cfg.architecture)
    model = cls(cfg, max_positions, tp)
    _load_weights(model, folder)
    shard = "" if tp is None else f" (tensor-parallel rank {tp.rank} of {tp.size})"
    logger.info("loaded %s (%d layers) from %s%s", cfg.architecture, cfg.num_layers, folder, shard)
    linears = _linear_specs(model)
    plan, summary = _quantization_plan(linears, quantization, gguf_file, tp)
    logger.info("quantization %s: %s", quantization, summary)
    model = model.to(device=device, dtype=dtype).eval()
    apply_quantization(linears, plan, dtype)
    pack_weights(model)
    return model
