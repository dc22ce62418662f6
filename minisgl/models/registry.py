"""Architecture name (``config.json``'s ``architectures[0]``) → model class."""

from __future__ import annotations

from minisgl.models.decoder import DecoderForCausalLM, DecoderStyle
from minisgl.registry import Registry


class LlamaForCausalLM(DecoderForCausalLM):
    pass


class MistralForCausalLM(DecoderForCausalLM):
    """Llama's layout; its config's ``sliding_window`` limits attention to that many positions."""


class Qwen2ForCausalLM(DecoderForCausalLM):
    style = DecoderStyle(qkv_bias=True)


class Qwen3ForCausalLM(DecoderForCausalLM):
    style = DecoderStyle(qk_norm=True)


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    """Qwen3 attention; sparse MoE blocks where the config's MoE settings say so."""

    style = DecoderStyle(qk_norm=True)


class Gemma3ForCausalLM(DecoderForCausalLM):
    """Text-only Gemma 3: Gemma's norms and Q/K norms; from its config a GELU-tanh MLP, the query
    scale ``query_pre_attn_scalar ** -0.5``, sliding-window layers (``layer_types``) with their own
    RoPE base and the full layers with the global one (scaled if the config says so)."""

    style = DecoderStyle(qk_norm=True, gemma_norms=True)


MODEL_REGISTRY: Registry[type[DecoderForCausalLM]] = Registry(
    "unsupported architecture",
    {
        "LlamaForCausalLM": LlamaForCausalLM,
        "MistralForCausalLM": MistralForCausalLM,
        "Qwen2ForCausalLM": Qwen2ForCausalLM,
        "Qwen3ForCausalLM": Qwen3ForCausalLM,
        "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
        "Gemma3ForCausalLM": Gemma3ForCausalLM,
    },
)


def model_class(architecture: str) -> type[DecoderForCausalLM]:
    return MODEL_REGISTRY.get(architecture)
