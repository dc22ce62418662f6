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
    # Gemma 3: the sliding-window layers' own RoPE base, never scaled (None: every layer rotates alike).
    local_rope_theta: float | None = None
    # Scores are scaled by query_pre_attn_scalar ** -0.5 (Gemma; None: head_dim ** -0.5).
    query_pre_attn_scalar: float | None = None
    hidden_act: str = "silu"  # of the gated MLP
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)

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
        _check_supported(cfg, archs[0])
        rope_theta, rope_scaling, local_rope_theta = _rope(cfg)
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
            local_rope_theta=local_rope_theta,
            query_pre_attn_scalar=cfg.get("query_pre_attn_scalar"),
            hidden_act=cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu",
            final_logit_softcapping=cfg.get("final_logit_softcapping"),
        )


def _check_supported(cfg: dict[str, Any], architecture: str) -> None:
    """Refuse what the config asks for and the engine does not compute, rather than compute
    something else."""
    if architecture == "Gemma3ForConditionalGeneration":
        raise ValueError(
            "Gemma3ForConditionalGeneration is multimodal (text and images); minisgl serves text only: "
            "use a text-only checkpoint (Gemma3ForCausalLM) or the model's gemma3 GGUF"
        )
    if cfg.get("attn_logit_softcapping") is not None:
        # transformers' Gemma 3 accepts the key but does not apply it, and llama.cpp refuses it.
        cap = cfg["attn_logit_softcapping"]
        raise ValueError(f"attn_logit_softcapping={cap}: attention soft-capping is not supported")
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention: only causal attention is supported")


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None, float | None]:
    """(RoPE base, scaling or None, the sliding layers' base or None). transformers >= 5 keeps the
    settings in 'rope_parameters' (Gemma 3: one entry per layer type); older configs use the flat
    keys (Gemma 3: 'rope_local_base_freq', with 'rope_scaling' for the full-attention layers only)."""
    params = dict(cfg.get("rope_parameters") or {})
    local_theta = cfg.get("rope_local_base_freq")
    if "full_attention" in params:
        local = params.get("sliding_attention") or {}
        local_theta = local.get("rope_theta", local_theta)
        if local.get("rope_type", "default") != "default":
            raise ValueError(f"RoPE scaling on the sliding-window layers ({local}) is not supported")
        params = dict(params["full_attention"])
    rope = params or dict(cfg.get("rope_scaling") or {})
    rope_theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    rope_scaling = None if rope_type == "default" else {**rope, "rope_type": rope_type}
    if local_theta is None and cfg.get("model_type") == "gemma3_text":
        local_theta = 10000.0  # Gemma3TextConfig's default
    return rope_theta, rope_scaling, None if local_theta is None else float(local_theta)


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
    with ``use_sliding_window``, and then only to the layers ``layer_types`` marks as sliding.
    Gemma 3 configs without ``layer_types`` give a pattern: every ``sliding_window_pattern``-th
    layer (6 unless set) attends fully, the others slide."""
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    num_layers = cfg["num_hidden_layers"]
    if window is None:
        return ()
    types = cfg.get("layer_types")
    if types is None and cfg.get("model_type") == "gemma3_text":
        pattern = cfg.get("sliding_window_pattern", 6)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    types = types or ["sliding_attention"] * num_layers
    if len(types) != num_layers:
        raise ValueError(f"layer_types has {len(types)} entries for {num_layers} layers")
    return tuple(window if t == "sliding_attention" else None for t in types)
