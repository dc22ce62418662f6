"""A GGUF file read in place (its config and tokenizer as a small HF folder, its tensors from the
file), checked against transformers' own GGUF loader."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from minisgl.models.gguf import default_model_path, gguf_model_folder, gguf_tokenizer
from minisgl.models.gguf_tensors import GGUFTensors

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
    return gguf_model_folder(GGUF_PATH, cache_root)


@pytest.fixture(scope="module")
def reference() -> PreTrainedModel:
    return hf_reference_model(GGUF_PATH)


def test_tensors_equal_transformers_gguf_load(reference: PreTrainedModel) -> None:
    """Every tensor under its HF name, dequantized from the file (q/k rows un-permuted), is what
    transformers reads; a tied LM head is not stored."""
    tensors, theirs = GGUFTensors(GGUF_PATH), reference.state_dict()
    assert set(tensors.names()) == set(theirs) - {"lm_head.weight"}
    assert "model.layers.29.self_attn.q_proj.weight" in tensors.names()
    for name in tensors.names():
        ours = tensors.dense(name)
        assert ours.dtype == torch.float32, name
        assert torch.equal(ours, theirs[name]), name


def _mapped_kib(path: Path) -> int:
    """Resident KiB of this process's maps of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isdigit() or line[:1] in "abcdef":  # a mapping's header line: address range, ..., path
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="needs Linux's /proc/self/smaps")
def test_read_tensors_give_their_pages_back() -> None:
    """Each tensor read hands its pages of the map back: reading them all leaves almost none of the file
    resident in the process (the weights built from them are copies), so a load never holds the file
    and the weights at once."""
    tensors = GGUFTensors(GGUF_PATH)
    int4 = [n for n in tensors.names() if tensors.type_name(n) in ("Q4_0", "Q4_1", "Q4_K")]
    assert int4, "the default model has int4 tensors"
    for name in tensors.names():
        tensors.int4(name) if name in int4 else tensors.dense(name)
    # Only pages shared by two tensors, and the header's, may stay.
    assert _mapped_kib(GGUF_PATH) * 1024 < 0.02 * GGUF_PATH.stat().st_size


def test_folder_holds_no_weights(folder: Path) -> None:
    """The weights stay in the file: the folder is its config and tokenizer, a few percent of it."""
    names = {p.name for p in folder.iterdir()}
    assert "config.json" in names and "tokenizer.json" in names
    assert not any(name.endswith((".safetensors", ".bin", ".gguf")) for name in names)
    assert sum(p.stat().st_size for p in folder.iterdir()) < 0.1 * GGUF_PATH.stat().st_size


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
    ours = gguf_tokenizer(folder)  # what the engine and the server load
    theirs = AutoTokenizer.from_pretrained(str(GGUF_PATH.parent), gguf_file=GGUF_PATH.name)
    assert type(ours) is type(theirs)  # the class AutoTokenizer chooses, chosen without it
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


def test_second_call_is_cached(folder: Path, cache_root: Path) -> None:
    mtimes = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    start = time.perf_counter()
    again = gguf_model_folder(GGUF_PATH, cache_root)
    elapsed = time.perf_counter() - start
    assert again == folder
    assert elapsed < 0.2, f"cached call took {elapsed:.3f} s"
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == mtimes
    # Only the finished folder is left behind: no temp dirs from the conversion.
    assert list((cache_root / "gguf").iterdir()) == [folder]


def test_cache_dir_from_env(folder: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(cache_root))
    assert gguf_model_folder(GGUF_PATH) == folder


def test_non_gguf_file_raises(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_text("definitely not a GGUF file")
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf_model_folder(bogus, tmp_path / "cache")


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
    with pytest.raises(ValueError, match=r"unsupported GGUF architecture 'bert' \(supported: \['gemma3', 'llama', 'qwen2', 'qwen3', 'qwen3moe'\]\)"):
        gguf_model_folder(path, tmp_path / "cache")
    assert not any((tmp_path / "cache" / "gguf").iterdir())  # the temp dir was cleaned up
