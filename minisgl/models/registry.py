"""Architecture name (``config.json``'s ``architectures[0]``) → model class."""

from __future__ import annotations

from minisgl.models.decoder import DecoderForCausalLM
from minisgl.registry import Registry


class LlamaForCausalLM(DecoderForCausalLM):
    pass


class MistralForCausalLM(DecoderForCausalLM):
    """Llama's layout; its config's ``sliding_window`` limits attention to that many positions."""


class Qwen2ForCausalLM(DecoderForCausalLM):
    qkv_bias = True


class Qwen3ForCausalLM(DecoderForCausalLM):
    qk_norm = True


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    """Qwen3 attention; sparse MoE blocks where the config's MoE settings say so."""

    qk_norm = True


MODEL_REGISTRY: Registry[type[DecoderForCausalLM]] = Registry(
    "unsupported architecture",
    {
        "LlamaForCausalLM": LlamaForCausalLM,
        "MistralForCausalLM": MistralForCausalLM,
        "Qwen2ForCausalLM": Qwen2ForCausalLM,
        "Qwen3ForCausalLM": Qwen3ForCausalLM,
        "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    },
)


def model_class(architecture: str) -> type[DecoderForCausalLM]:
    return MODEL_REGISTRY.get(architecture)
