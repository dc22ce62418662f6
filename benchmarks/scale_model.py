"""A model at the size people run on CPUs, without downloading one: random weights in SmolLM2-1.7B's
shape (hidden 2048, 24 layers, FFN 8192, 32 heads, tied embeddings) with the default model's tokenizer
and chat template, written as a GGUF the way llama.cpp's quantizer lays a Q4_1 file out (every
projection Q4_1, the embedding Q8_0, norms F32), quantized by the ``gguf`` package's own reference
code. Random weights are fine for speed and memory, not for quality.

Run: python -m benchmarks.scale_model [--out PATH] (about 90 s on 2 cores; reused when present).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from minisgl.models.gguf import default_model_path

SHAPE = {"hidden": 2048, "layers": 24, "ffn": 8192, "heads": 32, "kv_heads": 32, "context": 8192}
DEFAULT_PATH = Path.home() / ".cache" / "minisgl" / "bench" / "scale-1.7B-random.Q4_1.gguf"
# The default model's metadata copied as is: its tokenizer, so the same prompts give the same tokens.
_TOKENIZER_KEYS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template",
)  # fmt: skip


def write_scale_model(path: Path, seed: int = 0) -> Path:
    """Write the file (atomically) unless it exists; return its path."""
    import gguf
    from gguf.quants import quantize

    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    source = gguf.GGUFReader(default_model_path())
    vocab = int(next(t for t in source.tensors if t.name == "token_embd.weight").shape[1])
    h, ff, layers = SHAPE["hidden"], SHAPE["ffn"], SHAPE["layers"]
    head_dim = h // SHAPE["heads"]
    tmp = path.with_suffix(".tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name("scale model (random weights, SmolLM2-1.7B shape)")
    writer.add_block_count(layers)
    writer.add_context_length(SHAPE["context"])
    writer.add_embedding_length(h)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(SHAPE["heads"])
    writer.add_head_count_kv(SHAPE["kv_heads"])
    writer.add_rope_freq_base(130000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
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

    def tensor(name: str, rows: int, cols: int, qtype: gguf.GGMLQuantizationType) -> None:
        w = rng.standard_normal((rows, cols), dtype=np.float32) * 0.02
        writer.add_tensor(name, quantize(w, qtype), raw_dtype=qtype)

    q4, q8 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0
    tensor("token_embd.weight", vocab, h, q8)
    writer.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    kv = SHAPE["kv_heads"] * head_dim
    for i in range(layers):
        for name, rows, cols in (("attn_q", h, h), ("attn_k", kv, h), ("attn_v", kv, h), ("attn_output", h, h),
                                 ("ffn_gate", ff, h), ("ffn_up", ff, h), ("ffn_down", h, ff)):  # fmt: skip
            tensor(f"blk.{i}.{name}.weight", rows, cols, q4)
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(h, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(h, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_PATH)
    args = parser.parse_args()
    start = time.perf_counter()
    path = write_scale_model(args.out)
    print(f"{path}: {path.stat().st_size / 1e9:.2f} GB ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
