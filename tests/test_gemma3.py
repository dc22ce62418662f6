"""Gemma 3 (text) against transformers: tiny random models with sliding and full layers (windows
smaller than the prompts) give transformers' greedy tokens and logits in fp32, alone, batched, in
chunks and from the radix cache, from a Hugging Face folder (new and old config keys) and from a
GGUF written in llama.cpp's layout with a SentencePiece vocabulary, which tokenizes as
transformers' GGUF loader does; a mixed-quantization file runs quantized; files and configs the
engine cannot serve are refused by name."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import gguf
import pytest
import torch
from conftest import assert_idle_balanced, hf_greedy
from gguf_writer import SpmVocab, train_spm, write_gguf
from tiny_models import VOCAB, build_tiny_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from minisgl import LLM, SamplingParams
from minisgl.layers.linear import Linear
from minisgl.layers.quant import Int4Weight, Int8Weight
from minisgl.models.config import ModelConfig
from minisgl.models.gguf import gguf_model_folder, gguf_tokenizer
from minisgl.models.perplexity import sequence_logits

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)
PROMPT_LENS = (3, 20, 41, 9)
Q = gguf.GGMLQuantizationType
TEXTS = [
    "Hello world, it's 2026!",
    "  leading spaces\n\n\ttabs and newlines...",
    "Über café naïve — 日本語のテキスト",
    "bytes only here: ß∑ 中文 🎉",  # none of these characters is a piece: byte fallback
    "<start_of_turn>user\nhi<end_of_turn>",
]
TEMPLATE = (
    "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "<start_of_turn>model"
)


def old_style_config(folder: Path) -> Path:
    """The folder's config as Gemma 3 checkpoints on the Hub spell it (transformers 4): flat RoPE
    keys with linear scaling for the full layers, and a pattern instead of ``layer_types``."""
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["layer_types"], cfg["rope_parameters"]
    cfg |= {"sliding_window_pattern": 3, "rope_theta": 30000.0, "rope_local_base_freq": 500.0}
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": 4.0}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module", params=["gemma3_alternating", "gemma3_pattern6", "old_style"])
def gemma_folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "old_style":
        return old_style_config(build_tiny_model("gemma3_pattern6", folder))
    return build_tiny_model(request.param, folder)


def prompts(seed: int = 5) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENS]


def test_config_keys_as_transformers_reads_them(gemma_folder: Path) -> None:
    hf = AutoConfig.from_pretrained(gemma_folder)
    ours = ModelConfig.from_folder(gemma_folder)
    assert ours.layer_windows == tuple(hf.sliding_window if t == "sliding_attention" else None for t in hf.layer_types)
    assert ours.local_rope_theta == hf.rope_parameters["sliding_attention"]["rope_theta"]
    assert ours.rope_theta == hf.rope_parameters["full_attention"]["rope_theta"]
    assert (ours.rope_scaling or {}).get("factor") == hf.rope_parameters["full_attention"].get("factor")
    assert any(ours.layer_windows) and None in ours.layer_windows  # both kinds of layer


@pytest.mark.parametrize("kind", ["gemma3_alternating", "gemma3_pattern6"])
def test_greedy_tokens_match_transformers(kind: str, tmp_path: Path) -> None:
    folder = build_tiny_model(kind, tmp_path / kind)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = prompts()
    reference = [hf_greedy(hf, p, GREEDY.max_tokens) for p in ids]
    llm = LLM(str(folder), quantization="none", num_page_override=1024, max_prefill_tokens=16)
    try:
        assert [o["token_ids"] for o in llm.generate(ids, GREEDY, use_tqdm=False)] == reference  # batched, chunked
        assert [llm.generate([p], GREEDY, use_tqdm=False)[0]["token_ids"] for p in ids] == reference
        again = llm.generate([ids[2]], GREEDY, use_tqdm=False)[0]  # its prefix is in the radix cache now
        assert again["meta"]["cached_tokens"] > 0 and again["token_ids"] == reference[2]
        assert_idle_balanced(llm)
    finally:
        llm.shutdown()


def test_logits_match_transformers(gemma_folder: Path) -> None:
    """Every position's logits (the soft-capping, which no greedy choice shows, included), in
    chunks smaller than the prompt and larger than the window."""
    hf = AutoModelForCausalLM.from_pretrained(gemma_folder, dtype=torch.float32).eval()
    ids = prompts()[2]
    with torch.inference_mode():
        expected = hf(torch.tensor([ids])).logits[0]
    llm = LLM(str(gemma_folder), quantization="none", num_page_override=64)
    try:
        ours = sequence_logits(llm.scheduler.engine.model, ids, chunk=5)
        torch.testing.assert_close(ours.cpu(), expected, atol=1e-4, rtol=1e-4)
    finally:
        llm.shutdown()


def gemma_vocab() -> SpmVocab:
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    return train_spm(VOCAB, specials, {"pad": 0, "eos": 1, "bos": 2, "unk": 3}, add_bos=True, add_space_prefix=False)


def llama2_vocab() -> SpmVocab:
    specials = ["<unk>", "<s>", "</s>"]
    return train_spm(VOCAB, specials, {"unk": 0, "bos": 1, "eos": 2}, add_bos=True, add_space_prefix=True)


def test_gemma3_gguf_gives_transformers_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's layout: norms stored as 1 + weight, no LM head (tied), the window and global
    RoPE base in the metadata, its default layer pattern and local base."""
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    folder = build_tiny_model("gemma3_pattern6", tmp_path / "m")
    path = write_gguf(folder, tmp_path / "gemma3.gguf", "default", spm=gemma_vocab(), chat_template=TEMPLATE)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = prompts(7)
    reference = [hf_greedy(hf, p, GREEDY.max_tokens) for p in ids]
    llm = LLM(str(path), quantization="none", num_page_override=1024, max_prefill_tokens=16)
    try:
        config = ModelConfig.from_folder(gguf_model_folder(path))
        assert config.layer_windows == (6, 6, 6, 6, 6, None)
        assert config.eos_token_ids == (1, 5)  # <eos>, and <end_of_turn>, which ends a chat turn
        assert [o["token_ids"] for o in llm.generate(ids, GREEDY, use_tqdm=False)] == reference
        assert [llm.generate([p], GREEDY, use_tqdm=False)[0]["token_ids"] for p in ids] == reference
        chat = llm.apply_chat_template([{"role": "user", "content": "hi"}])
        text = "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model"  # the file's template
        assert chat == llm.tokenizer.encode(text, add_special_tokens=False)
        assert_idle_balanced(llm)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_sentencepiece_gguf_tokenizes_like_transformers_gguf_loader(arch: str, tmp_path: Path) -> None:
    """Gemma's and Llama 2's SentencePiece vocabularies (scores, byte fallback, BOS as the file
    says): the same ids and text as transformers' own GGUF loader gives."""
    folder = build_tiny_model("gemma3_pattern6" if arch == "gemma3" else "llama", tmp_path / "m")
    vocab = gemma_vocab() if arch == "gemma3" else llama2_vocab()
    path = write_gguf(folder, tmp_path / f"{arch}.gguf", "default", spm=vocab, chat_template=TEMPLATE)
    reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    converted = gguf_tokenizer(gguf_model_folder(path, tmp_path / "cache"))  # what the engine loads
    assert type(converted) is type(reference)
    byte_ids = {i for i, t in enumerate(vocab.tokens) if t.startswith("<0x")}
    for text in TEXTS:
        ids = reference.encode(text)
        assert converted.encode(text) == ids, text
        assert ids[0] == vocab.special_ids["bos"], text  # the file says add BOS
        assert converted.decode(ids) == reference.decode(ids), text
    assert byte_ids & set(reference.encode(TEXTS[3]))  # the byte fallback was exercised
    if arch == "gemma3":  # no space prefix: plain text comes back as it was
        plain = TEXTS[:4]
        assert [converted.decode(converted.encode(t), skip_special_tokens=True) for t in plain] == plain
    assert converted.chat_template == TEMPLATE


def test_gguf_whose_tensors_do_not_fit_gemma3_metadata_is_refused(tmp_path: Path) -> None:
    folder = build_tiny_model("gemma3", tmp_path / "m")
    vocab = gemma_vocab()
    heads = write_gguf(folder, tmp_path / "heads.gguf", "default", metadata={"attention.head_count": 8}, spm=vocab)
    with pytest.raises(ValueError, match=r"do not match its metadata \(gemma3_text\).*wrong shapes .*q_proj"):
        gguf_model_folder(heads, tmp_path / "cache")
    no_norm = write_gguf(folder, tmp_path / "norm.gguf", "default", drop=("blk.1.post_ffw_norm.weight",), spm=vocab)
    with pytest.raises(ValueError, match=r"missing \['model.layers.1.post_feedforward_layernorm.weight'\]"):
        gguf_model_folder(no_norm, tmp_path / "cache")


def test_gguf_layer_pattern_as_the_file_states_it(tmp_path: Path) -> None:
    """llama.cpp's default (every 6th layer full), a period the file states, no window at all."""
    folder = build_tiny_model("gemma3_pattern6", tmp_path / "m")
    vocab = gemma_vocab()
    cases = {
        "default": ({}, (6, 6, 6, 6, 6, None)),
        "period": ({"attention.sliding_window_pattern": 2}, (6, None, 6, None, 6, None)),
        "full": ({"attention.sliding_window": 0}, ()),
    }
    for name, (metadata, windows) in cases.items():
        path = write_gguf(folder, tmp_path / f"{name}.gguf", "default", metadata=metadata, spm=vocab)
        assert ModelConfig.from_folder(gguf_model_folder(path, tmp_path / "cache")).layer_windows == windows, name


@pytest.mark.parametrize(
    "cfg, problem",
    [
        ({"architectures": ["Gemma3ForConditionalGeneration"]}, "multimodal"),
        ({"attn_logit_softcapping": 50.0}, "attention soft-capping"),
        ({"use_bidirectional_attention": True}, "causal"),
        ({"hidden_activation": "gelu_new"}, "activation 'gelu_new'"),
    ],
)
def test_configs_the_engine_cannot_serve_are_refused(cfg: dict, problem: str, tmp_path: Path) -> None:
    folder = build_tiny_model("gemma3", tmp_path / "m")
    config = json.loads((folder / "config.json").read_text()) | cfg
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=problem):
        LLM(str(folder), quantization="none", num_page_override=64)


def test_mixed_quantization_runs_quantized_where_a_kernel_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Q4_K_M-like mix (Q4_K, Q5_0, Q6_K, Q8_0, and a Q3_K the CPU path has no kernel for):
    Q4_K runs on the file's int4 codes, 5-8 bit types as int8, Q3_K dense with the log saying so;
    the logits track the dequantized fp32 model."""
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    # Wide enough for K-quant blocks of 256 columns.
    folder = build_tiny_model("gemma3", tmp_path / "m", hidden_size=256, intermediate_size=256, head_dim=64)
    mix = {"token_embd": Q.Q6_K, "attn_q": Q.Q4_K, "attn_k": Q.Q5_0, "attn_v": Q.Q6_K, "attn_output": Q.Q3_K,
           "ffn_gate": Q.Q4_K, "ffn_up": Q.Q4_K, "ffn_down": Q.Q8_0}  # fmt: skip
    path = write_gguf(folder, tmp_path / "mix.gguf", "default", qtype=mix, spm=gemma_vocab())
    # The CPU's kernels: on CUDA the layers hold dense copies of the quantized values.
    exact = LLM(str(path), quantization="none", num_page_override=256, device="cpu")
    with caplog.at_level(logging.INFO, logger="minisgl.loader"):
        quantized = LLM(str(path), num_page_override=256, device="cpu")  # auto
    try:
        model = quantized.scheduler.engine.model
        layer = model.model.layers[0]
        assert isinstance(layer.self_attn.qkv_proj.quantized, Int8Weight)  # Q4_K + Q5_0 + Q6_K rows together
        assert isinstance(layer.mlp.gate_up_proj.quantized, Int4Weight)  # Q4_K: the file's codes
        assert isinstance(layer.mlp.down_proj.quantized, Int8Weight)
        assert layer.self_attn.o_proj.quantized is None and layer.self_attn.o_proj.weight is not None
        assert isinstance(model.lm_head.quantized, Int8Weight)  # tied to the Q6_K embedding
        assert "dense (Q3_K: no CPU kernel for it)" in caplog.text
        assert sum(isinstance(m, Linear) and m.quantized is None for m in model.modules()) == 2  # the o_projs
        ids = prompts(3)[2]
        reference = sequence_logits(exact.scheduler.engine.model, ids)
        ours = sequence_logits(model, ids)
        assert ((ours - reference).std() / reference.std()).item() < 0.05
        assert len(quantized.generate([ids], GREEDY, use_tqdm=False)[0]["token_ids"]) == GREEDY.max_tokens
        assert_idle_balanced(quantized)
    finally:
        exact.shutdown()
        quantized.shutdown()


def test_int4_gemma_layers_go_layer_by_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every projection int4 (Q4_0), yet no Gemma layer is handed to the fused C decode step, which
    computes Llama's layer."""
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    folder = build_tiny_model("gemma3", tmp_path / "m")
    path = write_gguf(folder, tmp_path / "q4_0.gguf", "default", qtype=Q.Q4_0, spm=gemma_vocab())
    llm = LLM(str(path), num_page_override=64, device="cpu")
    try:
        model = llm.scheduler.engine.model
        assert all(isinstance(m.quantized, Int4Weight) for m in model.modules() if isinstance(m, Linear))
        assert all(layer.fused_weights() is None for layer in model.model.layers)
        assert model._fused_decoder is None
    finally:
        llm.shutdown()
