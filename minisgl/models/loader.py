"""Find a model, read its safetensors and build the model with fused projections."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors import safe_open

from minisgl.models.config import ModelConfig
from minisgl.models.decoder import DecoderForCausalLM
from minisgl.models.registry import model_class

logger = logging.getLogger("minisgl.loader")

# Checkpoint matrices that become one fused parameter, in row order.
_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
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


def _read_checkpoint(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} has no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                weights[name] = f.get_tensor(name)
    return weights


def _fuse(weights: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    for i in range(num_layers):
        prefix = f"model.layers.{i}."
        for fused, parts in _FUSED.items():
            for kind in ("weight", "bias"):
                names = [f"{prefix}{part}.{kind}" for part in parts]
                if all(name in weights for name in names):
                    weights[f"{prefix}{fused}.{kind}"] = torch.cat([weights.pop(name) for name in names])
    return weights


def load_model(folder: Path, dtype: torch.dtype, device: torch.device, max_positions: int) -> DecoderForCausalLM:
    cfg = ModelConfig.from_folder(folder)
    cls = model_class(cfg.architecture)
    model = cls(cfg, max_positions)
    weights = _fuse(_read_checkpoint(folder), cfg.num_layers)
    if cfg.tie_word_embeddings:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint in {folder} does not fit {cls.__name__}: missing {missing}, unexpected {unexpected}")
    logger.info("loaded %s (%d layers) from %s", cfg.architecture, cfg.num_layers, folder)
    return model.to(device=device, dtype=dtype).eval()
