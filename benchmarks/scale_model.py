"""Models at the size people run on CPUs, without downloading one: random weights in a real model's
shape with the default model's tokenizer and chat template, written as a GGUF the way llama.cpp's
quantizer lays a Q4_1 file out (every projection Q4_1, the embedding Q8_0, norms and biases F32),
quantized by the ``gguf`` package's own reference code. Random weights are fine for speed and memory,
not for quality. The shapes (``SCALE_MODELS``), by the name ``--model`` takes:

- ``scale-1.7b``: SmolLM2-1.7B (llama: hidden 2048, 24 layers, FFN 8192, 32 heads, tied embeddings);
- ``scale-1.7b-qwen3``: Qwen3-1.7B (hidden 2048, 28 layers, FFN 6144, 16 heads of 128, 8 KV heads,
  RMSNorm on each head of Q and K, tied embeddings);
- ``scale-1.5b-qwen2``: Qwen2.5-1.5B (hidden 1536, 28 layers, FFN 8960, 12 heads, 2 KV heads, biases
  on Q/K/V, tied embeddings);
- ``scale-7b``: Mistral-7B (llama: hidden 4096, 32 layers, FFN 14336, 32 heads of 128, 8 KV heads, an LM
  head of its own), a 4.8 GB file. llama.cpp writes such an LM head in Q6_K; the ``gguf`` package has no
  Q6_K quantizer, so it is Q8_0 here, which minisgl runs the same way (int8 codes, one scale per row).

All state a context of 8192 tokens (the weights do not depend on it) and the default model's
vocabulary (49152 tokens), so that they differ only in the layers.

Run: python -m benchmarks.scale_model [--model scale-1.7b] [--out PATH] (about 90 s each on 2 cores, the 7B
one several minutes; reused when present).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minisgl.models.gguf import default_model_path


@dataclass(frozen=True)
class ScaleShape:
    """What a random-weight GGUF's layers look like, and the metadata llama.cpp's converter states for them."""

    arch: str  # the GGUF architecture
    like: str  # the model whose shape it is, for the file's name field
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_base: float
    rms_eps: float
    qkv_bias: bool = False  # Qwen2: F32 biases on Q/K/V
    qk_norm: bool = False  # Qwen3: F32 RMSNorm weights on each head of Q and K
    # llama.cpp's converter states attention.key_length / value_length when the config gives head_dim (Qwen3).
    states_head_dim: bool = False
    tied: bool = True  # the LM head is the embedding (no output.weight)
    context: int = 8192


@dataclass(frozen=True)
class ScaleModel:
    shape: ScaleShape
    file_name: str  # under ~/.cache/minisgl/bench/

    @property
    def path(self) -> Path:
        return Path.home() / ".cache" / "minisgl" / "bench" / self.file_name


SCALE_MODELS: dict[str, ScaleModel] = {
    "scale-1.7b": ScaleModel(
        ScaleShape("llama", "SmolLM2-1.7B", 2048, 24, 8192, 32, 32, 64, rope_base=130000.0, rms_eps=1e-5),
        "scale-1.7B-random.Q4_1.gguf",
    ),
    "scale-1.7b-qwen3": ScaleModel(
        ScaleShape("qwen3", "Qwen3-1.7B", 2048, 28, 6144, 16, 8, 128, rope_base=1e6, rms_eps=1e-6, qk_norm=True,
                   states_head_dim=True),
        "scale-1.7B-qwen3-random.Q4_1.gguf",
    ),
    "scale-1.5b-qwen2": ScaleModel(
        ScaleShape("qwen2", "Qwen2.5-1.5B", 1536, 28, 8960, 12, 2, 128, rope_base=1e6, rms_eps=1e-6, qkv_bias=True),
        "scale-1.5B-qwen2-random.Q4_1.gguf",
    ),
    "scale-7b": ScaleModel(
        ScaleShape("llama", "Mistral-7B", 4096, 32, 14336, 32, 8, 128, rope_base=10000.0, rms_eps=1e-5, tied=False),
        "scale-7B-random.Q4_1.gguf",
    ),
}  # fmt: skip
# The default model's metadata copied as is: its tokenizer, so the same prompts give the same tokens.
_TOKENIZER_KEYS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template",
)  # fmt: skip


def resolve_scale_model(model: str | None) -> str | None:
    """The GGUF file of a scale model named ``model`` (written on first use), else ``model`` as given."""
    scale = SCALE_MODELS.get(model or "")
    return model if scale is None else str(write_scale_model(scale.shape, scale.path))


def gguf_of(model: str | None) -> Path | None:
    """The GGUF file a run's model (after ``resolve_scale_model``) is: the default model's for None, None
    for a folder."""
    return default_model_path() if model is None else Path(model) if model.endswith(".gguf") else None


def write_scale_model(shape: ScaleShape, path: Path, seed: int = 0, tokenizer_from: Path | None = None) -> Path:
    """Write a model of ``shape`` to ``path`` (atomically) unless the file exists; return its path.
    Its tokenizer and vocabulary size are those of the GGUF ``tokenizer_from`` (default: the default
    model; tests give a tiny vocabulary, quicker to read)."""
    import gguf
    from gguf.quants import quantize

    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    source = gguf.GGUFReader(tokenizer_from or default_model_path())
    vocab = int(next(t for t in source.tensors if t.name == "token_embd.weight").shape[1])
    h, ff, layers, d = shape.hidden, shape.ffn, shape.layers, shape.head_dim
    q, kv = shape.heads * d, shape.kv_heads * d
    tmp = path.with_suffix(".tmp")
    writer = gguf.GGUFWriter(str(tmp), shape.arch)
    writer.add_name(f"scale model (random weights, {shape.like} shape)")
    writer.add_block_count(layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(h)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_rope_dimension_count(d)
    if shape.states_head_dim:
        writer.add_key_length(d)
        writer.add_value_length(d)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    for key in _TOKENIZER_KEYS:
        field = source.fields.get(key)
        if field is None:
            continue
        value, kind = field.contents(), field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value)
        else:
            writer.add_key_value(key, value, kind)
    rng = np.random.default_rng(seed)

    def random(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * 0.02

    def tensor(name: str, rows: int, cols: int, qtype: gguf.GGMLQuantizationType) -> None:
        writer.add_tensor(name, quantize(random(rows, cols), qtype), raw_dtype=qtype)

    def ones(name: str, size: int) -> None:
        writer.add_tensor(name, np.ones(size, dtype=np.float32))

    q4, q8 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0
    tensor("token_embd.weight", vocab, h, q8)
    if not shape.tied:
        tensor("output.weight", vocab, h, q8)
    ones("output_norm.weight", h)
    for i in range(layers):
        for name, rows, cols in (("attn_q", q, h), ("attn_k", kv, h), ("attn_v", kv, h), ("attn_output", h, q),
                                 ("ffn_gate", ff, h), ("ffn_up", ff, h), ("ffn_down", h, ff)):  # fmt: skip
            tensor(f"blk.{i}.{name}.weight", rows, cols, q4)
        if shape.qkv_bias:
            for name, size in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                writer.add_tensor(f"blk.{i}.{name}.bias", random(size))
        if shape.qk_norm:
            ones(f"blk.{i}.attn_q_norm.weight", d)
            ones(f"blk.{i}.attn_k_norm.weight", d)
        ones(f"blk.{i}.attn_norm.weight", h)
        ones(f"blk.{i}.ffn_norm.weight", h)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="scale-1.7b", choices=list(SCALE_MODELS))
    parser.add_argument("--out", type=Path, default=None, help="default: ~/.cache/minisgl/bench/<the model's file>")
    args = parser.parse_args()
    scale = SCALE_MODELS[args.model]
    start = time.perf_counter()
    path = write_scale_model(scale.shape, args.out or scale.path)
    print(f"{path}: {path.stat().st_size / 1e9:.2f} GB ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
