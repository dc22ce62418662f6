"""Write a Hugging Face folder as a GGUF file laid out the way llama.cpp's ``convert_hf_to_gguf.py``
lays it out, with the ``gguf`` package's writer and its own tensor-name map (not minisgl's): the
metadata keys its ``TextModel`` writes, llama's Q/K row permutation (llama only), MoE experts
stacked into one [experts, out, in] tensor per projection, gemma3's norms stored as 1 + weight, a
byte-level BPE tokenizer with its pre-tokenizer name, padded to the embedding's rows with
``[PAD{i}]`` tokens, or a SentencePiece vocabulary (``SpmVocab``) as ``_set_vocab_sentencepiece``
writes one. All data F32, so the converted model can be compared token for token, unless a
quantization type is asked for."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import gguf
import gguf.quants
import numpy as np
from safetensors.numpy import load_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# llama.cpp's architecture for each HF class (it writes Mistral as llama).
GGUF_ARCH = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3moe",
    "Gemma3ForCausalLM": "gemma3",
}

# The split regexes of the tokenizers llama.cpp names "qwen2" and "llama-bpe" (Llama 3), as in
# those models' tokenizer.json.
SPLITS = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2026, isn't it? We'll see: 12345 + 678 = 13023.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)  # (recursive)\n",
    "Über café naïve — 日本語のテキスト, emoji 🤖!! \"Quoted\" [brackets] {braces} x=(foo)+bar;",
    "  leading spaces\n\n\ttabs and\r\nnewlines... (hello) world's end, they're done, I'd say.",
]


def train_bpe(pre: str, vocab_size: int) -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer pre-tokenized like the named llama.cpp tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(SPLITS[pre]), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL[0], eos_token=SPECIAL[0])


@dataclass(frozen=True)
class SpmVocab:
    """A SentencePiece BPE vocabulary as llama.cpp's ``_set_vocab_sentencepiece`` writes it:
    pieces with their scores and types (``gguf.TokenType``), the special ids, BOS added or not."""

    tokens: list[str]
    scores: list[float]
    types: list[int]
    special_ids: dict[str, int]  # bos / eos / unk / pad -> id
    add_bos: bool
    add_space_prefix: bool


def train_spm(
    vocab_size: int, specials: list[str], special_ids: dict[str, int], add_bos: bool, add_space_prefix: bool
) -> SpmVocab:
    """``specials`` (control tokens; ``<unk>`` the unknown one) first, then the 256 byte-fallback
    pieces ``<0x00>``..``<0xFF>``, then BPE pieces learned on the corpus over ``▁``-joined words,
    best first (score -rank), padded with ``[PAD{i}]`` to ``vocab_size``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    room = vocab_size - len(specials) - 256 - 8
    tok.train_from_iterator(_CORPUS * 20, trainers.BpeTrainer(vocab_size=room, limit_alphabet=100))
    pieces = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [gguf.TokenType.UNKNOWN if t == "<unk>" else gguf.TokenType.CONTROL for t in specials]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(pieces)
    scores = [0.0] * (len(specials) + 256) + [-float(i) for i in range(len(pieces))]
    pad = vocab_size - len(tokens)
    tokens += [f"[PAD{len(tokens) + i}]" for i in range(pad)]
    types += [gguf.TokenType.UNUSED] * pad
    scores += [-1e9] * pad
    return SpmVocab(tokens, scores, [int(t) for t in types], special_ids, add_bos, add_space_prefix)


def _write_spm(writer: gguf.GGUFWriter, vocab: SpmVocab) -> None:
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab.tokens)
    writer.add_token_scores(vocab.scores)
    writer.add_token_types(vocab.types)
    adders: dict[str, Callable[[int], None]] = {
        "bos": writer.add_bos_token_id,
        "eos": writer.add_eos_token_id,
        "unk": writer.add_unk_token_id,
        "pad": writer.add_pad_token_id,
    }
    for name, token_id in vocab.special_ids.items():
        adders[name](token_id)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(vocab.add_space_prefix)


def _metadata(arch: str, cfg: dict) -> dict[str, int | float]:
    """What TextModel.set_gguf_parameters (and the llama / qwen2moe / gemma3 converters) write."""
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)  # gemma3: the global layers' base
    meta: dict[str, int | float] = {
        "block_count": cfg["num_hidden_layers"],
        "context_length": cfg["max_position_embeddings"],
        "embedding_length": cfg["hidden_size"],
        "feed_forward_length": cfg["intermediate_size"],
        "attention.head_count": cfg["num_attention_heads"],
        "attention.head_count_kv": cfg["num_key_value_heads"],
        "rope.freq_base": float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        "attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]),
    }
    if cfg.get("head_dim") is not None:
        meta["attention.key_length"] = meta["attention.value_length"] = cfg["head_dim"]
    if arch == "llama":
        meta["vocab_size"] = cfg["vocab_size"]
        meta["rope.dimension_count"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    if arch == "gemma3":
        if "sliding_attention" in cfg["layer_types"]:
            meta["attention.sliding_window"] = cfg["sliding_window"]
        if cfg.get("final_logit_softcapping"):
            meta["final_logit_softcapping"] = float(cfg["final_logit_softcapping"])
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if experts:
        meta["expert_count"] = experts
        meta["expert_used_count"] = cfg["num_experts_per_tok"]
        meta["expert_feed_forward_length"] = cfg["moe_intermediate_size"]
    return meta


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: the rotary halves of each head interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensors(arch: str, cfg: dict, weights: dict[str, np.ndarray]) -> Iterable[tuple[str, np.ndarray]]:
    """(HF name without .weight/.bias, suffix, data), experts stacked per layer and projection."""
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for name, w in weights.items():
        if ".mlp.experts." in name:  # model.layers.L.mlp.experts.E.proj.weight
            parts = name.split(".")
            experts.setdefault((int(parts[2]), parts[6]), {})[int(parts[5])] = w
            continue
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            w = _permute(w, cfg["num_attention_heads"])
        if arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            w = _permute(w, cfg["num_key_value_heads"])
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w + np.float32(1.0)  # llama.cpp stores Gemma's gain, 1 + weight
        yield name, w
    for (layer, proj), by_expert in sorted(experts.items()):
        yield f"model.layers.{layer}.mlp.experts.{proj}.weight", np.stack([by_expert[e] for e in sorted(by_expert)])


def write_gguf(
    folder: Path,
    path: Path,
    pre: str,
    metadata: dict[str, int | float] | None = None,
    drop: tuple[str, ...] = (),
    qtype: gguf.GGMLQuantizationType | dict[str, gguf.GGMLQuantizationType] | None = None,
    spm: SpmVocab | None = None,
    chat_template: str | None = None,
    sampling: dict[str, float] | None = None,
) -> Path:
    """``folder`` (a tiny model saved with a BPE tokenizer) as the GGUF file ``path``; ``metadata``
    overrides keys, ``drop`` leaves GGUF tensors out (both to test files that do not fit); ``qtype``
    quantizes every matrix whose rows fill its blocks (with the ``gguf`` package's quantizer), as
    llama.cpp's quantizer does, the rest staying F32; a dict gives the type by GGUF tensor name
    (the first key the name contains), a mix like Q4_K_M's. The ``gguf`` package cannot quantize
    to K types: their tensors get random blocks scaled to the weight's spread (``_random_blocks``),
    so such a file is a model of its own, to be compared with its own dequantized values.
    ``spm``: that vocabulary instead of the folder's BPE tokenizer; ``sampling``: ``general.sampling.*``
    keys (``temp``, ``top_p``, ``top_k``, ``min_p``), as llama.cpp's converter writes a generation config."""
    cfg = json.loads((folder / "config.json").read_text())
    arch = GGUF_ARCH[cfg["architectures"][0]]
    names = gguf.get_tensor_name_map(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), cfg["num_hidden_layers"])
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in {**_metadata(arch, cfg), **(metadata or {})}.items():
        (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(f"{arch}.{key}", value)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    if spm is not None:
        _write_spm(writer, spm)
    else:
        _write_bpe(writer, folder, pre, cfg["vocab_size"])
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for key, value in (sampling or {}).items():
        getattr(writer, f"add_sampling_{key}")(value)

    weights = {}
    for file in sorted(folder.glob("*.safetensors")):
        weights |= load_file(str(file))
    for hf_name, w in _tensors(arch, cfg, weights):
        base, _, suffix = hf_name.rpartition(".")
        mapped = names.get_name(base)
        if mapped is None:
            raise KeyError(f"llama.cpp's {arch} layout has no tensor for {hf_name}")
        gguf_name = f"{mapped}.{suffix}"
        if gguf_name in drop:
            continue
        w = np.ascontiguousarray(w, dtype=np.float32)
        kind = _qtype_of(gguf_name, qtype)
        if kind is not None and w.ndim >= 2 and w.shape[-1] % gguf.GGML_QUANT_SIZES[kind][0] == 0:
            blocks = _random_blocks(w, kind) if kind in _SCALE_OFFSETS else gguf.quants.quantize(w, kind)
            writer.add_tensor(gguf_name, blocks, raw_dtype=kind)
        else:
            writer.add_tensor(gguf_name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# Byte offsets of the fp16 super-block scales (d, and dmin where there is one) in K-quant blocks.
_SCALE_OFFSETS = {
    gguf.GGMLQuantizationType.Q3_K: (108,),
    gguf.GGMLQuantizationType.Q4_K: (0, 2),
    gguf.GGMLQuantizationType.Q6_K: (208,),
}


def _random_blocks(w: np.ndarray, kind: gguf.GGMLQuantizationType) -> np.ndarray:
    """Blocks of ``kind`` with random codes and sub-block scales, the super-block scales set so the
    values spread like ``w``'s (every byte pattern is a valid block)."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(w.size)
    blocks = rng.integers(0, 256, (*w.shape[:-1], w.shape[-1] // block, size), dtype=np.uint8)
    unit = gguf.quants.dequantize(_set_scales(blocks, kind, 1.0), kind)  # values are linear in the scales
    return _set_scales(blocks, kind, float(w.std()) / float(unit.std())).reshape(*w.shape[:-1], -1)


def _set_scales(blocks: np.ndarray, kind: gguf.GGMLQuantizationType, scale: float) -> np.ndarray:
    out = blocks.copy()
    for offset in _SCALE_OFFSETS[kind]:
        out[..., offset : offset + 2] = np.full(out.shape[:-1], scale, dtype=np.float16)[..., None].view(np.uint8)
    return out


def _qtype_of(
    gguf_name: str, qtype: gguf.GGMLQuantizationType | dict[str, gguf.GGMLQuantizationType] | None
) -> gguf.GGMLQuantizationType | None:
    if not isinstance(qtype, dict):
        return qtype
    return next((kind for key, kind in qtype.items() if key in gguf_name), None)


def _write_bpe(writer: gguf.GGUFWriter, folder: Path, pre: str, vocab_size: int) -> None:
    """The BPE vocabulary and its added tokens, typed as llama.cpp's converter types them: special ones
    CONTROL, the others (a thinking model's ``<think>``) USER_DEFINED."""
    tok = json.loads((folder / "tokenizer.json").read_text())
    ids = dict(tok["model"]["vocab"]) | {t["content"]: t["id"] for t in tok["added_tokens"]}
    vocab = sorted(ids.items(), key=lambda kv: kv[1])
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    user_defined = {t["content"] for t in tok["added_tokens"] if not t["special"]}
    tokens = [t for t, _ in vocab] + [f"[PAD{i}]" for i in range(len(vocab), vocab_size)]
    kinds = dict.fromkeys(user_defined, gguf.TokenType.USER_DEFINED) | dict.fromkeys(special, gguf.TokenType.CONTROL)
    types = [kinds.get(t, gguf.TokenType.NORMAL) for t, _ in vocab]
    types += [gguf.TokenType.UNUSED] * (len(tokens) - len(vocab))
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tok["model"]["vocab"][SPECIAL[0]])
