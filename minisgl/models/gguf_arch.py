"""What differs between the GGUF architectures minisgl reads: tensor names, metadata, row layout.

Mirrors llama.cpp's ``convert_hf_to_gguf.py``: ``llama`` (Llama, SmolLM2, and Mistral, which
llama.cpp writes as llama), ``qwen2``, ``qwen3``, ``qwen3moe`` and ``gemma3``. Only the llama
converter permutes the Q/K rows for llama.cpp's rope kernel; the others store them as Hugging Face
does. MoE experts are stored stacked, one [experts, out, in] tensor per projection. The gemma3
converter stores every norm's gain (1 + the Hugging Face weight) and names the four norms of a
layer its own way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class GGUFArch:
    hf_architecture: str
    model_type: str
    permute_qk: bool  # llama.cpp's llama converter reorders q/k rows for its rope kernel
    qkv_bias: bool = False  # Qwen2: biases on q/k/v
    qk_norm: bool = False  # Qwen3: RMSNorm on each head of q and k
    moe: bool = False  # every block's MLP is a sparse MoE block
    gemma_norms: bool = False  # Gemma: norms before and after attention and MLP; files hold 1 + weight
    # The control token a chat turn ends with, where the file's EOS is another (Gemma's <eos>).
    end_of_turn: str | None = None

    @property
    def norm_shift(self) -> float:
        """What the file's norm weights hold beyond the Hugging Face ones."""
        return 1.0 if self.gemma_norms else 0.0

    def block_tensors(self) -> dict[str, str]:
        return {**BLOCK_TENSORS, **GEMMA_BLOCK_TENSORS} if self.gemma_norms else BLOCK_TENSORS


ARCHS: dict[str, GGUFArch] = {
    "llama": GGUFArch("LlamaForCausalLM", "llama", permute_qk=True),
    "qwen2": GGUFArch("Qwen2ForCausalLM", "qwen2", permute_qk=False, qkv_bias=True),
    "qwen3": GGUFArch("Qwen3ForCausalLM", "qwen3", permute_qk=False, qk_norm=True),
    "qwen3moe": GGUFArch("Qwen3MoeForCausalLM", "qwen3_moe", permute_qk=False, qk_norm=True, moe=True),
    "gemma3": GGUFArch(
        "Gemma3ForCausalLM",
        "gemma3_text",
        permute_qk=False,
        qk_norm=True,
        gemma_norms=True,
        end_of_turn="<end_of_turn>",
    ),
}

GLOBAL_TENSORS: dict[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

BLOCK_TENSORS: dict[str, str] = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",  # the MoE router
}

# Gemma's four norms: ffn_norm is the one before the MLP, as in llama, but Hugging Face names it
# differently there (Gemma's post_attention_layernorm normalises the attention's output).
GEMMA_BLOCK_TENSORS: dict[str, str] = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}

# llama.cpp's gemma3 loader: every 6th layer attends fully unless the file gives the pattern, the
# sliding layers rotate with base 10000 unless the file says, and (from the layer count) only the
# 62-layer model (27B) scales queries by hidden / heads instead of head_dim.
GEMMA3_SLIDING_PATTERN = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0
GEMMA3_27B_LAYERS = 62

# Stacked experts: one GGUF tensor per projection → mlp.experts.{e}.{projection} in HF.
EXPERT_TENSORS: dict[str, str] = {
    "ffn_gate_exps": "gate_proj",
    "ffn_up_exps": "up_proj",
    "ffn_down_exps": "down_proj",
}

_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def gguf_arch(name: str, file_name: str) -> GGUFArch:
    arch = ARCHS.get(name)
    if arch is None:
        raise ValueError(f"{file_name}: unsupported GGUF architecture {name!r} (supported: {sorted(ARCHS)})")
    return arch


def arch_config(arch: GGUFArch, meta: Callable[[str, Any], Any]) -> dict[str, Any]:
    """The config.json keys particular to ``arch``, from its metadata (``meta(key, default)``, keys
    without the architecture prefix; a default of None means required)."""
    if arch.moe:
        return {
            "num_experts": meta("expert_count", None),
            "num_experts_per_tok": meta("expert_used_count", None),
            "moe_intermediate_size": meta("expert_feed_forward_length", None),
            # llama.cpp's qwen3moe graph always renormalises the top-k weights.
            "norm_topk_prob": bool(meta("expert_weights_norm", True)),
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        }
    window = meta("attention.sliding_window", 0)
    if arch.gemma_norms:
        return _gemma3_config(meta, window)
    if arch.model_type == "llama" and window:
        # A llama GGUF that states a window is a Mistral (llama.cpp's converter does not write one).
        return {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": window}
    return {}


def _gemma3_config(meta: Callable[[str, Any], Any], window: int) -> dict[str, Any]:
    layers, head_dim = meta("block_count", None), meta("attention.key_length", None)
    # The pattern, where a file gives it: a period, or one flag per layer (true: sliding).
    pattern = meta("attention.sliding_window_pattern", GEMMA3_SLIDING_PATTERN)
    sliding = [bool((i + 1) % pattern) for i in range(layers)] if isinstance(pattern, int) else list(pattern)
    if len(sliding) != layers:
        raise ValueError(f"gemma3.attention.sliding_window_pattern has {len(sliding)} entries for {layers} layers")
    if not window:  # a converted file states a window unless every layer attends fully (llama.cpp omits it then)
        sliding = [False] * layers
    scalar = head_dim
    if layers == GEMMA3_27B_LAYERS:
        scalar = meta("embedding_length", None) // meta("attention.head_count", None)
    config: dict[str, Any] = {
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "sliding_window": window or None,
        "rope_local_base_freq": float(meta("rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE)),
        "query_pre_attn_scalar": scalar,
        "hidden_activation": "gelu_pytorch_tanh",
    }
    softcap = meta("final_logit_softcapping", 0.0)
    if softcap:
        config["final_logit_softcapping"] = float(softcap)
    return config


def hf_tensors(
    arch: GGUFArch, config: dict[str, Any], gguf_name: str, w: np.ndarray
) -> Iterator[tuple[str, np.ndarray, int]]:
    """The Hugging Face tensors one GGUF tensor holds (several for stacked experts), views of ``w``,
    each with the number of heads whose rows llama.cpp interleaved (0: rows in Hugging Face's order):
    ``unpermute_qk`` puts them back, a copy, when the tensor is read, not for every layer at once."""
    if gguf_name in GLOBAL_TENSORS:
        yield GLOBAL_TENSORS[gguf_name], w, 0
        return
    m = _BLOCK_RE.fullmatch(gguf_name)
    part = m.group(2) if m is not None else None
    block_tensors = arch.block_tensors()
    if m is None or (part not in block_tensors and part not in EXPERT_TENSORS):
        # Silently dropping a tensor (e.g. llama3's rope_freqs) would give a subtly wrong model.
        raise ValueError(f"unsupported GGUF tensor {gguf_name!r}")
    layer, _, kind = m.groups()
    prefix = f"model.layers.{layer}"
    if part in EXPERT_TENSORS:
        for e in range(w.shape[0]):
            yield f"{prefix}.mlp.experts.{e}.{EXPERT_TENSORS[part]}.{kind}", w[e], 0
        return
    heads = 0
    if arch.permute_qk and part in ("attn_q", "attn_k"):
        heads = config["num_attention_heads" if part == "attn_q" else "num_key_value_heads"]
    yield f"{prefix}.{block_tensors[part]}.{kind}", w, heads


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head interleave of the two rotary halves (HF uses rotate-half)."""
    half = w.shape[0] // n_heads // 2
    # llama.cpp wrote reshape(n_heads, 2, half).swapaxes(1, 2); swapping back restores the order.
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_shapes(arch: GGUFArch, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every HF tensor the metadata implies, with its shape: what the GGUF's tensors must give."""
    hidden, d = config["hidden_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config["vocab_size"], hidden),
        "model.norm.weight": (hidden,),
    }
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (config["vocab_size"], hidden)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.input_layernorm.weight": (hidden,),
            f"{p}.post_attention_layernorm.weight": (hidden,),
            f"{p}.self_attn.q_proj.weight": (q, hidden),
            f"{p}.self_attn.k_proj.weight": (kv, hidden),
            f"{p}.self_attn.v_proj.weight": (kv, hidden),
            f"{p}.self_attn.o_proj.weight": (hidden, q),
        }
        if arch.qkv_bias:
            shapes |= {f"{p}.self_attn.q_proj.bias": (q,), f"{p}.self_attn.k_proj.bias": (kv,), f"{p}.self_attn.v_proj.bias": (kv,)}
        if arch.qk_norm:
            shapes |= {f"{p}.self_attn.q_norm.weight": (d,), f"{p}.self_attn.k_norm.weight": (d,)}
        if arch.gemma_norms:
            shapes |= {f"{p}.{n}_feedforward_layernorm.weight": (hidden,) for n in ("pre", "post")}
        if arch.moe:
            ff = config["moe_intermediate_size"]
            shapes[f"{p}.mlp.gate.weight"] = (config["num_experts"], hidden)
            for e in range(config["num_experts"]):
                x = f"{p}.mlp.experts.{e}"
                shapes |= {f"{x}.gate_proj.weight": (ff, hidden), f"{x}.up_proj.weight": (ff, hidden), f"{x}.down_proj.weight": (hidden, ff)}
        else:
            ff = config["intermediate_size"]
            shapes |= {f"{p}.mlp.gate_proj.weight": (ff, hidden), f"{p}.mlp.up_proj.weight": (ff, hidden), f"{p}.mlp.down_proj.weight": (hidden, ff)}
    return shapes


def check_tensors(arch: GGUFArch, config: dict[str, Any], got: dict[str, tuple[int, ...]], file_name: str) -> None:
    """A clear error when the tensors do not fit the metadata (a truncated or mislabelled file)."""
    want = expected_shapes(arch, config)
    missing = sorted(set(want) - set(got))
    unexpected = sorted(set(got) - set(want))
    wrong = [f"{n}: file {got[n]}, metadata implies {want[n]}" for n in sorted(set(want) & set(got)) if got[n] != want[n]]
    if missing or unexpected or wrong:
        problems = [f"{label} {items[:8]}{' ...' if len(items) > 8 else ''}" for label, items in
                    (("missing", missing), ("unexpected", unexpected), ("wrong shapes", wrong)) if items]
        raise ValueError(f"{file_name}: GGUF tensors do not match its metadata ({arch.model_type}): " + "; ".join(problems))
