"""GGUF -> HF folder conversion, checked against transformers' own GGUF loader."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from minisgl.models.gguf import convert_gguf, default_model_path

try:
    GGUF_PATH = default_model_path()
except FileNotFoundError as e:
    pytest.skip(f"default model not available: {e}", allow_module_level=True)

SAMPLES = [
    "Hello world",
    "  leading spaces, trailing tabs\t\t",
    "The capital of France is Paris.\nNew line!",
    "def f(x):\n    return x ** 2  # code",
    "Ünïcödé — 日本語 — emoji 🤖",
    "<|im_start|>user\nhi<|im_end|>",
]


def hf_reference_model(gguf_path: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("minisgl-cache")


@pytest.fixture(scope="module")
def folder(cache_root: Path) -> Path:
    return convert_gguf(GGUF_PATH, cache_root)


@pytest.fixture(scope="module")
def reference() -> PreTrainedModel:
    return hf_reference_model(GGUF_PATH)


@pytest.fixture(scope="module")
def model(folder: Path) -> PreTrainedModel:
    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model


def test_weights_equal_transformers_gguf_load(model: PreTrainedModel, reference: PreTrainedModel) -> None:
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert ours[name].dtype == torch.float32, name
        assert torch.equal(ours[name], tensor), name


def test_safetensors_uses_hf_names_and_ties_embeddings(folder: Path) -> None:
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names
    assert "model.layers.29.self_attn.q_proj.weight" in names
    assert "model.norm.weight" in names
    assert "lm_head.weight" not in names  # the GGUF has no output.weight


def test_config_matches_reference(folder: Path, reference: PreTrainedModel) -> None:
    ours, theirs = AutoConfig.from_pretrained(folder), reference.config
    assert ours.architectures == ["LlamaForCausalLM"]
    assert (ours.num_hidden_layers, ours.hidden_size, ours.num_attention_heads, ours.num_key_value_heads) == (
        30, 576, 9, 3,
    )
    for key in (
        "intermediate_size", "head_dim", "vocab_size", "max_position_embeddings",
        "tie_word_embeddings", "bos_token_id", "eos_token_id",
    ):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert ours.rope_parameters["rope_theta"] == pytest.approx(theirs.rope_parameters["rope_theta"])
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps)
    assert ours.dtype == torch.float32


def test_tokenizer_matches_transformers_gguf_tokenizer(folder: Path) -> None:
    ours = AutoTokenizer.from_pretrained(folder)
    theirs = AutoTokenizer.from_pretrained(str(GGUF_PATH.parent), gguf_file=GGUF_PATH.name)
    for text in SAMPLES:
        ids = ours.encode(text)
        assert ids == theirs.encode(text), text
        assert ours.decode(ids) == theirs.decode(ids) == text
    assert (ours.bos_token_id, ours.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id)
    assert ours.chat_template and ours.chat_template == theirs.chat_template
    messages = [{"role": "user", "content": "What is 2+2?"}]
    prompt = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert prompt == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_converted_model_generates_sensible_text(folder: Path, model: PreTrainedModel) -> None:
    # Independent of transformers' GGUF loader: a wrong q/k un-permutation would scramble rope
    # and the model would not answer this.
    tokenizer = AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids["input_ids"].shape[1]:])


def test_second_call_is_cached(folder: Path, cache_root: Path) -> None:
    mtimes = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    start = time.perf_counter()
    again = convert_gguf(GGUF_PATH, cache_root)
    elapsed = time.perf_counter() - start
    assert again == folder
    assert elapsed < 0.2, f"cached call took {elapsed:.3f} s"
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == mtimes
    # Only the finished folder is left behind: no temp dirs from the conversion.
    assert list((cache_root / "gguf").iterdir()) == [folder]


def test_cache_dir_from_env(folder: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(cache_root))
    assert convert_gguf(GGUF_PATH) == folder


def test_non_gguf_file_raises(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_text("definitely not a GGUF file")
    with pytest.raises(ValueError, match="not a GGUF file"):
        convert_gguf(bogus, tmp_path / "cache")


def test_unsupported_architecture_raises(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    path = tmp_path / "tiny-bert.gguf"
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"unsupported GGUF architecture 'bert' \(supported: \['llama', 'qwen2', 'qwen3', 'qwen3moe'\]\)"):
        convert_gguf(path, tmp_path / "cache")
    assert not any((tmp_path / "cache" / "gguf").iterdir())  # the temp dir was cleaned up
