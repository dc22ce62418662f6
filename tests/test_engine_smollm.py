"""SmolLM2 (the default GGUF) against transformers: greedy tokens must be identical."""

from __future__ import annotations

import pytest
from conftest import hf_greedy
from transformers import PreTrainedModel

from minisgl import LLM, SamplingParams

PROMPTS = [
    "The capital of France is",
    "1, 2, 3, 4,",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "Translate to French: 'Good morning, my friend.'",
    "The three primary colors are",
    "Water boils at a temperature of",
    "Q: What is the largest planet in our solar system?\nA:",
]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def prompt_ids(smollm: LLM) -> list[list[int]]:
    chat = smollm.apply_chat_template([{"role": "user", "content": "Name a primary color."}])
    return [smollm.tokenizer.encode(p) for p in PROMPTS] + [chat]


@pytest.fixture(scope="module")
def reference(hf_smollm: PreTrainedModel, prompt_ids: list[list[int]]) -> list[list[int]]:
    return [hf_greedy(hf_smollm, ids, MAX_TOKENS) for ids in prompt_ids]


GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


def test_batch_matches_transformers(fresh_smollm: LLM, prompt_ids: list[list[int]], reference: list[list[int]]) -> None:
    outs = fresh_smollm.generate(prompt_ids, GREEDY, use_tqdm=False)
    assert [o["token_ids"] for o in outs] == reference


@pytest.mark.parametrize("cache_type", ["naive", "radix"])
def test_one_at_a_time_matches_transformers(
    cache_type: str, prompt_ids: list[list[int]], reference: list[list[int]]
) -> None:
    llm = LLM(num_page_override=4096, cache_type=cache_type, quantization="none")
    for ids, ref in zip(prompt_ids, reference):
        assert llm.generate([ids], GREEDY, use_tqdm=False)[0]["token_ids"] == ref
    llm.scheduler.check_accounting()
    llm.shutdown()


def test_text_api_and_meta(fresh_smollm: LLM) -> None:
    out = fresh_smollm.generate("The capital of France is", SamplingParams(max_tokens=8), use_tqdm=False)[0]
    assert out["text"] == fresh_smollm.tokenizer.decode(out["token_ids"], skip_special_tokens=True)
    meta = out["meta"]
    assert meta["prompt_tokens"] == len(fresh_smollm.tokenizer.encode("The capital of France is"))
    assert meta["completion_tokens"] == len(out["token_ids"]) <= 8
    assert meta["finish_reason"] in ("stop", "length")


def test_chat_applies_template_and_stops_at_eos(fresh_smollm: LLM) -> None:
    [out] = fresh_smollm.chat([[{"role": "user", "content": "Say hi."}]], SamplingParams(max_tokens=64), use_tqdm=False)
    assert out["meta"]["finish_reason"] == "stop"
    assert out["token_ids"][-1] == fresh_smollm.tokenizer.eos_token_id
    assert "<|im_end|>" not in out["text"] and out["text"].strip()
