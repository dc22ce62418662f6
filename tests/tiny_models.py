"""Tiny random-weight models, built with transformers' own configs and saved as safetensors, so
tests exercise the real folder loader without any download."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

VOCAB = 512
WINDOW = 24
_COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "eos_token_id": 1,
    "bos_token_id": 0,
}
CONFIGS = {
    "llama": lambda: LlamaConfig(**_COMMON, head_dim=16, tie_word_embeddings=True),
    "qwen2": lambda: Qwen2Config(**_COMMON),
    "qwen3": lambda: Qwen3Config(**_COMMON, head_dim=32, tie_word_embeddings=False),
    "mistral": lambda: MistralConfig(**_COMMON, head_dim=16, sliding_window=None),
    # A window shorter than most prompts plus their outputs, so that it changes the tokens.
    "mistral_window": lambda: MistralConfig(**_COMMON, head_dim=16, sliding_window=WINDOW),
    # Qwen2 with use_sliding_window: layers from max_window_layers on slide (layer 1), layer 0 does not.
    "qwen2_window": lambda: Qwen2Config(**_COMMON, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    # 8 experts, top-2; layer 1 keeps a dense MLP (mlp_only_layers), layers 0 and 2 are sparse.
    "qwen3_moe": lambda: Qwen3MoeConfig(
        **{**_COMMON, "num_hidden_layers": 3},
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        mlp_only_layers=[1],
    ),
    # As llama.cpp's gemma3 files can state it: every 6th layer full (none of 2 here: tests/test_gemma3.py
    # has more), the others within a window of 24, the sliding layers' RoPE base 10000, queries
    # scaled by head_dim ** -0.5.
    "gemma3": lambda: Gemma3TextConfig(
        **_COMMON, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16, pad_token_id=0
    ),
    # Full and sliding layers alternating, a window of 7, queries scaled by 24 ** -0.5 (not
    # head_dim's), two RoPE bases, logits soft-capped near their own spread.
    "gemma3_alternating": lambda: Gemma3TextConfig(
        **{**_COMMON, "num_hidden_layers": 4},
        head_dim=16,
        sliding_window=7,
        layer_types=["sliding_attention", "full_attention"] * 2,
        query_pre_attn_scalar=24,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 20000.0},
        },
        final_logit_softcapping=0.3,
        pad_token_id=0,
    ),
    # llama.cpp's default pattern (layer 5 full, 0-4 within a window of 6) and bases.
    "gemma3_pattern6": lambda: Gemma3TextConfig(
        **{**_COMMON, "num_hidden_layers": 6}, head_dim=16, sliding_window=6, query_pre_attn_scalar=16, pad_token_id=0
    ),
}


def _word_tokenizer(names: dict[int, str] | None = None) -> PreTrainedTokenizerFast:
    """Words "w3" .. "w511", but where ``names`` spells an id otherwise."""
    words = {i: f"w{i}" for i in range(3, VOCAB)} | (names or {})
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, **{word: i for i, word in words.items()}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def scale_weights(model: torch.nn.Module) -> None:
    """Random init gives near-uniform logits; scale weights up so greedy choices are not near-ties.
    Gemma's embeddings (tied to its LM head, already multiplied by sqrt(hidden)) are left alone: larger
    ones make each token predict itself; its norms (a gain of 1 + weight, 0 at init) get random weights."""
    gemma = model.config.model_type.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and not (gemma and "embed_tokens" in name):
                p.mul_(4.0 if gemma else 8.0)
            elif p.dim() == 1 and gemma:
                p.normal_(0.0, 0.3)


def build_tiny_model(kind: str, folder: Path, seed: int = 0, **overrides: object) -> Path:
    """``overrides`` replace config fields (e.g. ``mlp_only_layers=[]``)."""
    torch.manual_seed(seed)
    config = CONFIGS[kind]()
    for key, value in overrides.items():
        setattr(config, key, value)
    model = AutoModelForCausalLM.from_config(config)
    scale_weights(model)
    model.save_pretrained(folder)
    _word_tokenizer().save_pretrained(folder)
    return folder


def name_words(folder: Path, names: dict[int, str], chat_template: str) -> None:
    """Respells the tokenizer of a ``build_tiny_model`` folder (``names``: id -> word) and gives it
    ``chat_template``; the model is unchanged, so are its outputs' ids."""
    tokenizer = _word_tokenizer(names)
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(folder)


# Qwen3's rule in a word-level template: the prompt opens the reasoning block, or (enable_thinking false)
# holds an empty one; the answer then starts inside the block (DeepSeek-R1's templates open it so too).
THINK_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}"
    "{% if enable_thinking is defined and enable_thinking is false %}<think> </think> {% else %}<think> {% endif %}"
    "{% endif %}"
)
THINK_OPEN_ID = 3  # "w3" respelled "<think>"


def build_thinking_model(
    folder: Path, messages: list[dict[str, str]], thought_tokens: int, max_tokens: int
) -> list[int]:
    """A tiny llama (THINK_TEMPLATE) whose greedy answer to ``messages`` closes its reasoning after
    ``thought_tokens`` tokens: the vocabulary spells the id its answer has there "</think>". Returns the
    answer's ids (``max_tokens`` of them)."""
    from minisgl import LLM, SamplingParams

    build_tiny_model("llama", folder)
    name_words(folder, {THINK_OPEN_ID: "<think>"}, THINK_TEMPLATE)
    llm = LLM(str(folder), quantization="none")
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    ids: list[int] = llm.generate([llm.apply_chat_template(messages)], params, use_tqdm=False)[0]["token_ids"]
    llm.shutdown()
    close = ids[thought_tokens]
    assert close not in ids[:thought_tokens] and THINK_OPEN_ID not in ids, "pick other messages for this seed"
    name_words(folder, {THINK_OPEN_ID: "<think>", close: "</think>"}, THINK_TEMPLATE)
    return ids
