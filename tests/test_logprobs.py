"""Log-probabilities of output and prompt tokens (``SamplingParams.logprobs``, ``prompt_logprobs``): the model's
own, against transformers; untouched by how the token is chosen; the same alone, batched and with drafts; one per
output token; the prompt's scored within a pass's bound; and the tokens' bytes and text they are reported with."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import torch
from conftest import assert_idle_balanced, c_kernels_or_skip
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tiny_models import VOCAB
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from minisgl import LLM, SamplingParams
from minisgl.models.source import load_tokenizer
from minisgl.sampler import Sampler
from minisgl.sampling import TokenLogprob
from minisgl.text.token_bytes import TokenBytes


def generate(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[dict[str, Any]]:
    return llm.generate(prompts, params, use_tqdm=False)


@torch.inference_mode()
def test_logprobs_are_transformers_log_softmax(fresh_smollm: LLM, hf_smollm: PreTrainedModel) -> None:
    prompts = [fresh_smollm.encode(t) for t in ("The capital of France is", "def fibonacci(n):")]
    outputs = generate(fresh_smollm, prompts, SamplingParams(max_tokens=8, ignore_eos=True, logprobs=5))
    for prompt, out in zip(prompts, outputs):
        full = prompt + out["token_ids"]
        logits = hf_smollm(torch.tensor([full])).logits[0, len(prompt) - 1 : -1].float()
        reference = torch.log_softmax(logits, dim=-1)
        assert len(out["logprobs"]) == len(out["token_ids"]) == 8
        for token, lp, ref in zip(out["token_ids"], out["logprobs"], reference):
            assert lp.logprob == pytest.approx(float(ref[token]), abs=1e-3)
            values, ids = ref.topk(5)
            assert [i for i, _ in lp.top] == ids.tolist()
            assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=1e-3)
            assert lp.top[0] == (token, lp.logprob)  # greedy: the most likely token, the same value


@torch.inference_mode()
def test_prompt_logprobs_are_transformers_log_softmax(fresh_smollm: LLM, hf_smollm: PreTrainedModel) -> None:
    """Every prompt token's but the first's, whether or not the prompt is cached: a request that asks for
    them reuses no cached prefix."""
    prompt = fresh_smollm.encode("The capital of France is Paris. The capital of Germany is")
    params = SamplingParams(max_tokens=2, prompt_logprobs=3)
    reference = torch.log_softmax(hf_smollm(torch.tensor([prompt])).logits[0, :-1].float(), dim=-1)
    for _ in range(2):  # the second time the prompt is in the cache
        out = generate(fresh_smollm, [prompt], params)[0]
        assert out["meta"]["cached_tokens"] == 0 and out["logprobs"] is None
        scores = out["prompt_logprobs"]
        assert len(scores) == len(prompt) and scores[0] is None
        for token, lp, ref in zip(prompt[1:], scores[1:], reference):
            assert lp.logprob == pytest.approx(float(ref[token]), abs=1e-3)
            values, ids = ref.topk(3)
            assert [i for i, _ in lp.top] == ids.tolist()
            assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=1e-3)
    assert fresh_smollm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)[0]["meta"]["cached_tokens"] > 0


def test_scoring_requests_keep_within_the_scored_tokens_of_a_pass(plain: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """The logits of every prompt token of a scoring request are kept: a pass holds at most
    ``max_scored_tokens`` of them, however many such requests wait, while other requests prefill as usual."""
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (40, 30, 50)]
    params = [SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=2)] * 2 + [SamplingParams(max_tokens=4)]
    plain.flush_cache()
    whole = generate(plain, prompts, params)
    plain.flush_cache()
    monkeypatch.setattr(plain.scheduler.planner, "max_scored_tokens", 16)
    sched = plain.scheduler
    reqs = [sched.make_request(100 + i, p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]
    for req in reqs:
        sched.add(req)
    scoring_passes = 0
    while sched.has_work:
        before = [r.device_len for r in reqs]
        sched.step()
        scored = sum(r.device_len - b for r, b in zip(reqs[:2], before) if b < r.prompt_len)
        assert scored <= 16
        scoring_passes += scored > 0
        if scoring_passes == 1:
            assert reqs[2].device_len == 50  # the request that does not score prefilled whole in the first pass
    assert scoring_passes == -(-(40 + 30) // 16)
    for req, out in zip(reqs, whole):
        assert req.output_ids == out["token_ids"]
    for req, out in zip(reqs[:2], whole):
        assert len(req.prompt_token_logprobs) == req.prompt_len and req.prompt_token_logprobs[0] is None
        for chunked, at_once in zip(req.prompt_token_logprobs[1:], out["prompt_logprobs"][1:]):
            assert chunked is not None and at_once is not None
            assert chunked.logprob == pytest.approx(at_once.logprob, abs=1e-4)
            assert [i for i, _ in chunked.top] == [i for i, _ in at_once.top]
    assert_idle_balanced(plain)


def test_logprobs_are_the_models_whatever_chooses_the_token(plain: LLM) -> None:
    """Temperature, top-k, penalties and biases choose the token; its log-probability stays the model's."""
    prompt = [[5, 6, 7, 8, 9]]
    plain.flush_cache()
    first = generate(plain, prompt, SamplingParams(max_tokens=1, logprobs=20))[0]["logprobs"][0]
    forced, value = first.top[-1]  # the 20th most likely token
    plain.flush_cache()
    params = SamplingParams(
        max_tokens=1, temperature=0.7, top_k=3, seed=1, presence_penalty=1.5, logit_bias={forced: 100.0}, logprobs=20
    )
    out = generate(plain, prompt, params)[0]
    assert out["token_ids"] == [forced]
    assert out["logprobs"] == [TokenLogprob(value, first.top)]
    assert generate(plain, prompt, SamplingParams(max_tokens=1))[0]["logprobs"] is None  # not asked for


def test_logprobs_are_the_same_alone_batched_and_with_drafts(plain: LLM, spec: LLM) -> None:
    g = torch.Generator().manual_seed(1)
    randoms = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (3, 20, 70)]
    prompts = [*randoms, [5, 6, 7, 8, 9, 10] * 6, [300, 301] * 20 + [7]]
    params = SamplingParams(max_tokens=24, ignore_eos=True, logprobs=3)
    alone = []
    for prompt in prompts:
        plain.flush_cache()
        alone.append(generate(plain, [prompt], params)[0])
    plain.flush_cache()
    batched = generate(plain, prompts, params)
    spec.flush_cache()
    accepted = spec.stats()["accepted_draft_tokens"]
    drafted = generate(spec, prompts, params)
    assert spec.stats()["accepted_draft_tokens"] > accepted  # the tiny model repeats itself
    for a, b, d in zip(alone, batched, drafted):
        assert a["token_ids"] == b["token_ids"] == d["token_ids"]
        assert len(a["logprobs"]) == len(a["token_ids"])
        assert b["logprobs"] == a["logprobs"]
        for x, y in zip(d["logprobs"], a["logprobs"]):  # drafts: the same tokens, rows of other passes
            assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
            assert [i for i, _ in x.top] == [i for i, _ in y.top]
    assert_idle_balanced(plain)
    assert_idle_balanced(spec)


def test_every_token_of_a_grammar_request_has_its_logprob(fresh_smollm: LLM) -> None:
    """Jump-forward appends the text a grammar forces without sampling it, so it has no log-probability:
    a request that asks for them samples every token instead. The grammar chooses the tokens, not their figures:
    the first position's most likely token is the unconstrained one's, which the grammar forbids there."""
    assert fresh_smollm.scheduler.jump_forward
    prompt = [fresh_smollm.encode("Is the sky blue? Answer:")]
    free = generate(fresh_smollm, prompt, SamplingParams(max_tokens=1, logprobs=1))[0]["logprobs"][0]
    fresh_smollm.flush_cache()
    pattern = r"The answer is (yes|no), because [a-z ]{1,30}\."
    out = generate(fresh_smollm, prompt, SamplingParams(max_tokens=24, regex=pattern, logprobs=1))[0]
    assert len(out["logprobs"]) == len(out["token_ids"]) > 5
    assert all(lp.logprob <= 0.0 and len(lp.top) == 1 for lp in out["logprobs"])
    assert out["token_ids"][0] != free.top[0][0] and out["logprobs"][0].top == free.top
    if out["meta"]["finish_reason"] == "stop":
        assert re.fullmatch(pattern, out["text"]), out["text"]


@pytest.mark.parametrize("top", [0, 1, 3])
def test_token_logprobs_are_log_softmax_with_and_without_the_c_kernels(top: int) -> None:
    """The log-sum-exp and the most likely token from the C kernels, or torch's (CUDA, no compiler)."""
    g = torch.Generator().manual_seed(top)
    logits = torch.randn(5, 1000, generator=g) * 6
    chosen = torch.randint(0, 1000, (5,), generator=g)
    reference = torch.log_softmax(logits.double(), dim=-1)
    for sampler in (Sampler(kernels=None), Sampler(kernels=c_kernels_or_skip())):
        for row, (lp, ref) in enumerate(zip(sampler.token_logprobs(logits, chosen, top), reference)):
            assert lp.logprob == pytest.approx(float(ref[chosen[row]]), abs=1e-5)
            values, ids = ref.topk(top)
            assert [i for i, _ in lp.top] == ids.tolist()
            assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=1e-5)


# -- the tokens' spelling ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def default_tokens() -> TokenBytes:
    return TokenBytes(load_tokenizer(None))


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40))
def test_byte_level_tokens_spell_the_text_byte_for_byte(default_tokens: TokenBytes, text: str) -> None:
    """Multi-byte characters split across tokens included: each token's bytes, joined, are the text's."""
    ids = default_tokens.tokenizer.encode(text, add_special_tokens=False)
    assume(default_tokens.tokenizer.decode(ids) == text)  # what the tokenizer keeps (it drops some controls)
    assert b"".join(default_tokens.bytes_of(i) for i in ids) == text.encode()
    assert all(default_tokens.text_of(i) == default_tokens.bytes_of(i).decode(errors="replace") for i in ids)


def test_special_tokens_are_spelled_as_they_read(default_tokens: TokenBytes) -> None:
    end = default_tokens.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert default_tokens.bytes_of(end) == b"<|im_end|>"


def test_a_byte_level_decoder_within_a_sequence_is_one() -> None:
    tokenizer = copy.deepcopy(load_tokenizer(None))
    tokenizer.backend_tokenizer.decoder = decoders.Sequence([decoders.ByteLevel()])
    tokens = TokenBytes(tokenizer)
    ids = tokenizer.encode("naïve 🙂", add_special_tokens=False)
    assert b"".join(tokens.bytes_of(i) for i in ids) == "naïve 🙂".encode()


def test_sentencepiece_word_boundaries_and_byte_fallback() -> None:
    vocab = {"<unk>": 0, "\u2581hi": 1, "<0xE4>": 2, "<0xBD>": 3, "<0xA0>": 4, "there": 5}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")))
    tokens = TokenBytes(tokenizer)
    assert tokens.bytes_of(1) == b" hi" and tokens.bytes_of(5) == b"there"
    assert b"".join(tokens.bytes_of(i) for i in (2, 3, 4)) == "你".encode()
    assert tokens.text_of(2) == "\ufffd"  # a part of a character
