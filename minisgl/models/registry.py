"""Architecture name (``config.json``'s ``architectures[0]``) → model class."""

from __future__ import annotations

from minisgl.models.decoder import DecoderForCausalLM
from minisgl.registry import Registry


class LlamaForCausalLM(DecoderForCausalLM):
    pass


class Qwen2ForCausalLM(DecoderForCausalLM):
    qkv_bias = True


class Qwen3ForCausalLM(DecoderForCausalLM):
    qk_norm = True


MODEL_REGISTRY: Registry[type[DecoderForCausalLM]] = Registry(
    "unsupported architecture",
    {"LlamaForCausalLM": LlamaForCausalLM, "Qwen2ForCausalLM": Qwen2ForCausalLM, "Qwen3ForCausalLM": Qwen3ForCausalLM},
)


def model_class(architecture: str) -> type[DecoderForCausalLM]:
    return MODEL_REGISTRY.get(architecture)
