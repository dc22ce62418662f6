"""GGUF files of every supported architecture (llama, Mistral written as llama, qwen2, qwen3,
qwen3moe, gemma3), written from tiny random HF folders the way llama.cpp writes them: the converted model
gives transformers' greedy tokens for the original folder, its tokenizer encodes like the original
BPE tokenizer (pre-tokenizer included), and files whose tensors do not fit their metadata are refused."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch
from conftest import assert_idle_balanced, hf_greedy
from gguf_writer import SPLITS, train_bpe, write_gguf
from tiny_models import VOCAB, build_tiny_model
from tokenizers import Tokenizer, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from minisgl import LLM, SamplingParams
from minisgl.layers.linear import Linear
from minisgl.layers.quant import Int4Weight, Int8Weight
from minisgl.models.gguf import gguf_model_folder
from minisgl.models.perplexity import sequence_logits

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)
# (tiny model, its tokenizer's llama.cpp pre-tokenizer name, the HF class the GGUF converts to)
KINDS = {
    "llama": ("llama-bpe", "LlamaForCausalLM"),
    "mistral": ("llama-bpe", "LlamaForCausalLM"),  # llama.cpp writes Mistral as llama
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen2", "Qwen3ForCausalLM"),
    "qwen3_moe": ("qwen2", "Qwen3MoeForCausalLM"),
    "gemma3": ("llama-bpe", "Gemma3ForCausalLM"),  # llama.cpp's converter takes a BPE vocabulary as gpt2
}
SAMPLES = [
    "Hello world, it's 2026!",
    "x=(foo)+bar; 1234567 apples",
    "  leading spaces\n\n\ttabs\r\nand newlines...",
    "def f(n):\n    return n if n < 2 else f(n - 1)  # (recursive)",
    "Über café — 日本語 🤖 they're",
    "<|im_start|>user\nhi<|im_end|>",
]


def tiny_with_bpe(kind: str, folder: Path) -> Path:
    # llama.cpp's qwen3moe graph has a MoE block in every layer: no mlp_only_layers in its files.
    build_tiny_model(kind, folder, **({"mlp_only_layers": []} if kind == "qwen3_moe" else {}))
    train_bpe(KINDS[kind][0], VOCAB - 100).save_pretrained(folder)  # GGUF pads the vocabulary to 512
    return folder


@pytest.fixture(scope="module", params=sorted(KINDS))
def tiny_gguf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    kind = request.param
    folder = tiny_with_bpe(kind, tmp_path_factory.mktemp(kind))
    return kind, folder, write_gguf(folder, folder.parent / f"{kind}.gguf", KINDS[kind][0])


def test_gguf_gives_transformers_tokens(tiny_gguf: tuple[str, Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    kind, folder, gguf_path = tiny_gguf
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path))
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (3, 20, 41, 9)]
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    reference = [hf_greedy(hf, ids, GREEDY.max_tokens) for ids in prompts]
    llm = LLM(str(gguf_path), num_page_override=1024, max_prefill_tokens=16)  # radix cache, chunked prefill
    assert AutoConfig.from_pretrained(gguf_model_folder(gguf_path)).architectures == [KINDS[kind][1]]
    assert [o["token_ids"] for o in llm.generate(prompts, GREEDY, use_tqdm=False)] == reference
    assert [llm.generate([p], GREEDY, use_tqdm=False)[0]["token_ids"] for p in prompts] == reference
    assert_idle_balanced(llm)


@pytest.mark.parametrize("pre", sorted(SPLITS))
def test_tokenizer_from_gguf_encodes_like_the_original(pre: str, tmp_path: Path) -> None:
    kind = "qwen3" if pre == "qwen2" else "llama"
    folder = tiny_with_bpe(kind, tmp_path / "m")
    original = AutoTokenizer.from_pretrained(folder)
    converted = AutoTokenizer.from_pretrained(gguf_model_folder(write_gguf(folder, tmp_path / "m.gguf", pre), tmp_path / "cache"))
    for text in SAMPLES:
        ids = original.encode(text)
        assert converted.encode(text) == ids, text
        assert converted.decode(ids) == text
    # The samples tell pre-tokenizers apart: GPT-2's default split gives other tokens for some.
    plain = Tokenizer.from_file(str(folder / "tokenizer.json"))
    plain.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # use_regex: GPT-2's split
    assert any(plain.encode(text).ids != original.encode(text) for text in SAMPLES)


def test_gguf_whose_tensors_do_not_fit_its_metadata_is_refused(tmp_path: Path) -> None:
    folder = tiny_with_bpe("qwen3_moe", tmp_path / "m")
    wrong_heads = write_gguf(folder, tmp_path / "heads.gguf", "qwen2", metadata={"attention.head_count": 8})
    with pytest.raises(ValueError, match=r"GGUF tensors do not match its metadata .*wrong shapes .*q_proj"):
        gguf_model_folder(wrong_heads, tmp_path / "cache")
    no_expert = write_gguf(folder, tmp_path / "experts.gguf", "qwen2", drop=("blk.1.ffn_up_exps.weight",))
    with pytest.raises(ValueError, match=r"missing \['model.layers.1.mlp.experts.0.up_proj.weight'"):
        gguf_model_folder(no_expert, tmp_path / "cache")
    assert not any((tmp_path / "cache" / "gguf").iterdir())  # nothing half-converted is cached


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_quantized_gguf_runs_in_place_on_its_own_codes(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Q4_0 file (what does not fill 32-column groups requantized to int8) runs on its quantized
    weights alone: no dense weight is held or written, prefill (many rows) and decode (few) track
    the dequantized fp32 model, the KV cache is 16-bit, a batch decodes as its requests alone."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(cache))
    folder = tiny_with_bpe(kind, tmp_path / kind)
    path = write_gguf(folder, tmp_path / "q4_0.gguf", KINDS[kind][0], qtype=gguf.GGMLQuantizationType.Q4_0)
    exact = LLM(str(path), quantization="none", num_page_override=512)
    quantized = LLM(str(path), num_page_override=512)  # auto
    try:
        model = quantized.scheduler.engine.model
        linears = [m for m in model.modules() if isinstance(m, Linear)]
        assert all(m.weight is None and m.quantized is not None for m in linears)
        assert any(isinstance(m.quantized, Int4Weight) for m in linears)
        assert all(p.dim() == 1 for p in model.parameters())  # norms only: no dense matrix is alive
        assert quantized.scheduler.engine.pool.k.dtype == torch.bfloat16
        assert exact.scheduler.engine.pool.k.dtype == torch.float32
        memory = quantized.scheduler.engine.memory
        assert memory["weights"] < 0.5 * exact.scheduler.engine.memory["weights"]
        ids = torch.randint(3, VOCAB, (70,), generator=torch.Generator().manual_seed(0)).tolist()
        reference = sequence_logits(exact.scheduler.engine.model, ids)
        # 16 rows a pass and all 70 in one. Q4_0's codes are the file's own: what differs is the
        # activations' rounding (15 bits per group of 32), well within the spread of the logits.
        for chunk in (16, len(ids)):
            ours = sequence_logits(model, ids, chunk)
            assert ((ours - reference).std() / reference.std()).item() < 0.05, chunk
        prompts = [ids[:5], ids[10:30], ids[40:43]]
        alone = [quantized.generate([p], GREEDY, use_tqdm=False)[0]["token_ids"] for p in prompts]
        quantized.flush_cache()
        assert [o["token_ids"] for o in quantized.generate(prompts, GREEDY, use_tqdm=False)] == alone
        assert_idle_balanced(quantized)
    finally:
        exact.shutdown()
        quantized.shutdown()
    # int8 asked for: every projection rounded to int8 from the file's dequantized values, not the file's int4.
    rounded = LLM(str(path), quantization="int8", num_page_override=64)
    try:
        assert all(isinstance(m.quantized, Int8Weight) for m in rounded.scheduler.engine.model.modules() if isinstance(m, Linear))
    finally:
        rounded.shutdown()
    written = [p for p in cache.rglob("*") if p.is_file() and p.parent.name != "kernels"]
    assert written and not any(p.suffix in (".safetensors", ".bin") for p in written)
