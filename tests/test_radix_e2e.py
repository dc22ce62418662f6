"""RadixAttention end to end on SmolLM2: what is computed, what is reused, and that outputs never change."""

from __future__ import annotations

import pytest
from conftest import assert_idle_balanced, hf_greedy
from transformers import PreTrainedModel

from minisgl import LLM, SamplingParams

SYSTEM = (
    "You are a meticulous assistant for a small public library. You answer questions about opening hours, "
    "borrowing rules, late fees, digital lending, study rooms and events. Keep answers short and factual. "
    "The library opens at nine in the morning and closes at eight in the evening on weekdays, and at five "
    "on Saturdays. It is closed on Sundays. Members may borrow up to twelve items for three weeks. "
)
QUESTIONS = [
    "When does the library open on Saturday?",
    "How many books can I borrow?",
    "Is the library open on Sunday?",
    "Can I renew a loan online?",
    "Where are the study rooms?",
    "Do you lend e-books?",
]
MAX_TOKENS = 8
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.fixture(scope="module")
def prompts(smollm: LLM) -> list[list[int]]:
    ids = [smollm.tokenizer.encode(SYSTEM + "Question: " + q + "\nAnswer:") for q in QUESTIONS]
    shared = {common_prefix(a, b) for i, a in enumerate(ids) for b in ids[i + 1 :]}
    assert len(shared) == 1, "the questions must share exactly the system prompt"
    return ids


@pytest.fixture(scope="module")
def shared_len(prompts: list[list[int]]) -> int:
    return common_prefix(prompts[0], prompts[1])


@pytest.fixture(scope="module")
def reference(hf_smollm: PreTrainedModel, prompts: list[list[int]]) -> list[list[int]]:
    return [hf_greedy(hf_smollm, ids, MAX_TOKENS) for ids in prompts]


def prefill_delta(llm: LLM, run: object) -> int:
    before = llm.stats()["prefill_tokens"]
    run()  # type: ignore[operator]
    return llm.stats()["prefill_tokens"] - before


def test_shared_system_prompt_is_computed_once(
    fresh_smollm: LLM, prompts: list[list[int]], shared_len: int, reference: list[list[int]]
) -> None:
    outs: list[dict] = []
    computed = prefill_delta(fresh_smollm, lambda: outs.extend(fresh_smollm.generate(prompts, GREEDY, use_tqdm=False)))
    assert computed == len(prompts[0]) + sum(len(p) - shared_len for p in prompts[1:])
    assert [o["token_ids"] for o in outs] == reference
    assert [o["meta"]["cached_tokens"] for o in outs] == [0] + [shared_len] * (len(prompts) - 1)
    # The same prompts again: everything but the last prompt token of each is cached.
    again: list[dict] = []
    assert prefill_delta(fresh_smollm, lambda: again.extend(fresh_smollm.generate(prompts, GREEDY, use_tqdm=False))) == len(prompts)
    assert [o["token_ids"] for o in again] == reference


def test_radix_equals_naive_with_page_size_16(prompts: list[list[int]], shared_len: int, reference: list[list[int]]) -> None:
    llm = LLM(num_page_override=512, page_size=16, quantization="none")
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o["token_ids"] for o in outs] == reference
    aligned = shared_len // 16 * 16
    assert [o["meta"]["cached_tokens"] for o in outs[1:]] == [aligned] * (len(prompts) - 1)
    assert_idle_balanced(llm)
    llm.shutdown()


def test_second_chat_turn_reuses_prompt_and_answer(fresh_smollm: LLM) -> None:
    params = SamplingParams(max_tokens=24)
    turn1 = [{"role": "user", "content": "Name one planet of the solar system."}]
    first_ids = fresh_smollm.apply_chat_template(turn1)
    [answer] = fresh_smollm.chat([turn1], params, use_tqdm=False)
    turn2 = turn1 + [{"role": "assistant", "content": answer["text"]}, {"role": "user", "content": "And another one?"}]
    second_ids = fresh_smollm.apply_chat_template(turn2)
    [second] = fresh_smollm.chat([turn2], params, use_tqdm=False)
    # Everything both turns share is reused, which covers the first prompt and the answer's tokens.
    shared = common_prefix(first_ids + answer["token_ids"], second_ids)
    assert shared > len(first_ids) + len(answer["token_ids"]) // 2
    assert second["meta"]["cached_tokens"] == min(shared, len(first_ids) + len(answer["token_ids"]) - 1)


def test_identical_short_prompts_in_one_batch_share_pages(fresh_smollm: LLM) -> None:
    # Short enough that both are prefilled in the same pass: the second's KV duplicates the first's.
    ids = fresh_smollm.tokenizer.encode("Tell me a fun fact about cats.")
    outs = fresh_smollm.generate([ids, ids, ids], GREEDY, use_tqdm=False)
    assert outs[0]["token_ids"] == outs[1]["token_ids"] == outs[2]["token_ids"]
    usage = fresh_smollm.scheduler.kv_usage()
    # One copy of the prompt and one of each distinct answer path stays cached, nothing twice.
    assert usage["evictable"] == len(ids) + MAX_TOKENS - 1


def test_pool_too_small_completes_everything_by_evicting(prompts: list[list[int]], reference: list[list[int]]) -> None:
    llm = LLM(num_page_override=200, max_running_req=4, quantization="none")
    outs = llm.generate(prompts + prompts[::-1], GREEDY, use_tqdm=False)
    assert [o["token_ids"] for o in outs] == reference + reference[::-1]
    assert llm.stats()["kv_evicted_total"] > 0
    assert_idle_balanced(llm)
    llm.shutdown()


def test_cache_salt_isolates_namespaces(fresh_smollm: LLM, prompts: list[list[int]]) -> None:
    fresh_smollm.generate([prompts[0]], GREEDY, use_tqdm=False, cache_salt="alice")
    [other] = fresh_smollm.generate([prompts[0]], GREEDY, use_tqdm=False, cache_salt="bob")
    [same] = fresh_smollm.generate([prompts[0]], GREEDY, use_tqdm=False, cache_salt="alice")
    assert other["meta"]["cached_tokens"] == 0
    assert same["meta"]["cached_tokens"] == len(prompts[0]) - 1


def test_flush_refused_while_running(fresh_smollm: LLM, prompts: list[list[int]]) -> None:
    req = fresh_smollm.scheduler.make_request(10**6, prompts[0], GREEDY)
    fresh_smollm.scheduler.add(req)
    with pytest.raises(RuntimeError, match="cannot flush"):
        fresh_smollm.flush_cache()
    fresh_smollm.scheduler.abort(req.rid)
    fresh_smollm.flush_cache()
    assert fresh_smollm.scheduler.kv_usage()["evictable"] == 0
