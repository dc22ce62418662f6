"""The model facts the engine needs, read from a Hugging Face ``config.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class MoEConfig:
    """Sparse mixture-of-experts blocks (Qwen3-MoE): each token's MLP is the router-weighted sum of
    its top ``top_k`` experts' SwiGLU MLPs."""

    num_experts: int
    top_k: int
    intermediate_size: int  # of one expert
    norm_topk_prob: bool  # renormalise the top-k router probabilities to sum to one
    sparse_step: int  # every ``sparse_step``-th layer is sparse ...
    mlp_only_layers: tuple[int, ...]  # ... except these, which keep a dense MLP

    def is_sparse(self, layer_id: int) -> bool:
        return layer_id not in self.mlp_only_layers and (layer_id + 1) % self.sparse_step == 0


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    eos_token_ids: tuple[int, ...] = field(default=())
    moe: MoEConfig | None = None
    # Per layer: attend only to the last ``window`` positions (sliding-window attention), or None.
    layer_windows: tuple[int | None, ...] = field(default=())

    @classmethod
    def from_folder(cls, folder: Path) -> ModelConfig:
        path = folder / "config.json"
        if not path.is_file():
            raise ValueError(f"{folder} has no config.json: not a Hugging Face model folder")
        return cls.from_dict(json.loads(path.read_text()))

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        if not archs:
            raise ValueError("config.json names no architecture ('architectures' is missing)")
        # transformers >= 5 keeps rope settings in 'rope_parameters'; older configs use the flat keys.
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rope_theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        rope_scaling = None if rope_type == "default" else {**rope, "rope_type": rope_type}
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        num_heads = cfg["num_attention_heads"]
        return cls(
            architecture=archs[0],
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", False),
            eos_token_ids=eos_ids,
            moe=_moe_config(cfg),
            layer_windows=_layer_windows(cfg),
        )


def _moe_config(cfg: dict[str, Any]) -> MoEConfig | None:
    # Qwen's own configs say num_experts; transformers >= 5 writes num_local_experts.
    num_experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if not num_experts:
        return None
    return MoEConfig(
        num_experts=num_experts,
        top_k=cfg["num_experts_per_tok"],
        intermediate_size=cfg["moe_intermediate_size"],
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        sparse_step=cfg.get("decoder_sparse_step", 1),
        mlp_only_layers=tuple(cfg.get("mlp_only_layers") or ()),
    )


def _layer_windows(cfg: dict[str, Any]) -> tuple[int | None, ...]:
    """Mistral sets ``sliding_window`` for every layer; Qwen configs set it too but only apply it
    with ``use_sliding_window``, and then only to the layers ``layer_types`` marks as sliding."""
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    num_layers = cfg["num_hidden_layers"]
    if window is None:
        return ()
    types = cfg.get("layer_types") or ["sliding_attention"] * num_layers
    return tuple(window if t == "sliding_attention" else None for t in types)
