"""Find a model, read its safetensors and build the model with fused projections."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

from minisgl.layers.linear import Partition, pack_weights
from minisgl.models.config import ModelConfig
from minisgl.models.decoder import DecoderForCausalLM
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


def load_model(
    folder: Path, dtype: torch.dtype, device: torch.device, max_positions: int, tp: TPGroup | None = None
) -> DecoderForCausalLM:
    """The model, or with ``tp`` this rank's shard of it."""
    cfg = ModelConfig.from_folder(folder)
    cls = model_class(cfg.architecture)
    model = cls(cfg, max_positions, tp)
    _load_weights(model, folder)
    shard = "" if tp is None else f" (tensor-parallel rank {tp.rank} of {tp.size})"
    logger.info("loaded %s (%d layers) from %s%s", cfg.architecture, cfg.num_layers, folder, shard)
    model = model.to(device=device, dtype=dtype).eval()
    pack_weights(model)
    return model
