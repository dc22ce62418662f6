"""Architecture name (``config.json``'s ``architectures[0]``) → model class."""

from __future__ import annotations

from minisgl.models.decoder import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    pass


class Qwen2ForCausalLM(DecoderForCausalLM):
    qkv_bias = True


class Qwen3ForCausalLM(DecoderForCausalLM):
    qk_norm = True


MODEL_REGISTRY: dict[str, type[DecoderForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def model_class(architecture: str) -> type[DecoderForCausalLM]:
    if architecture not in MODEL_REGISTRY:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {sorted(MODEL_REGISTRY)}")
    return MODEL_REGISTRY[architecture]
