"""Speculative decoding with n-gram drafts: the drafter against plain references, and outputs token for
token the same as without speculation (greedy, seeded sampling, stops and max_tokens inside a draft,
chunked prefill, radix hits), the sampled distribution unchanged, the KV balanced."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_idle_balanced
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2
from tiny_models import VOCAB

from minisgl import LLM, SamplingParams
from minisgl.batch import AttentionKind
from minisgl.cli import add_engine_args, config_from_args, main
from minisgl.config import EngineConfig
from minisgl.kvcache.radix_cache import RadixPrefixCache
from minisgl.request import Req
from minisgl.scheduler.forward_pass import ForwardPass
from minisgl.scheduler.speculative import PROBE_INTERVAL, NgramDrafter, PassCost, paying_tokens
from minisgl.scheduler.stats import StatsSnapshot
from minisgl.server.metrics import ServerMetrics
from minisgl.tuning import DRAFT_MAX_PASS_ROWS

ITEMS = "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine"
CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
COPY_PROMPTS = [
    f"Repeat this list exactly, in the same order: {ITEMS}\nRepeated list: {ITEMS}\nAgain: ",
    f"Rename add to plus in this code and print it again.\n{CODE}\nThe code with add renamed to plus:\n",
    "Quote the first sentence. The library opens at nine and closes at eight. It is closed on Sundays. Quote:",
    "What is the capital of France?",
]


# -- the drafter -------------------------------------------------------------------------------
def reference_draft(tokens: list[int], ngram_min: int, ngram_max: int, length: int) -> list[int]:
    """What followed the latest earlier occurrence of the longest suffix, by brute force: the sequence
    is assumed to go on as it did there, so the copy reads the tokens it has already drafted."""
    for n in range(ngram_max, ngram_min - 1, -1):
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tokens[len(tokens) - n :]:
                extended = list(tokens)
                for i in range(length):
                    extended.append(extended[start + n + i])
                return extended[len(tokens) :]
    return []


def decoding_req(prompt: list[int], max_tokens: int) -> Req:
    req = Req(0, list(prompt), SamplingParams(max_tokens=max_tokens))
    req.device_len = len(prompt) - 1  # as after its prefill: only the last token is left to compute
    return req


def grow(req: Req, tokens: list[int]) -> None:
    req.token_ids.extend(tokens)
    req.device_len = req.seq_len - 1


@settings(max_examples=200, deadline=None)
@given(
    chunks=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=6),
    sizes=st.tuples(st.integers(1, 4), st.integers(0, 3)),
    max_draft=st.integers(1, 6),
)
def test_drafts_follow_the_latest_earlier_occurrence_of_the_longest_suffix(
    chunks: list[list[int]], sizes: tuple[int, int], max_draft: int
) -> None:
    ngram_min, ngram_max = sizes[0], sizes[0] + sizes[1]
    drafter = NgramDrafter(RadixPrefixCache("cpu"), max_draft, ngram_min, ngram_max)
    req = decoding_req(chunks[0], max_tokens=100)
    for chunk in chunks[1:] + [[]]:  # the index grows with the request's tokens
        draft = drafter.drafts([req]).get(req, [])
        assert draft == reference_draft(req.token_ids, ngram_min, ngram_max, max_draft)
        grow(req, chunk)


def test_a_draft_leaves_room_for_the_token_after_it_within_max_tokens() -> None:
    drafter = NgramDrafter(RadixPrefixCache("cpu"), 8, 2, 2)
    req = decoding_req([1, 2, 3, 4, 5, 6, 1, 2], max_tokens=4)
    assert drafter.drafts([req])[req] == [3, 4, 5]  # 3 drafted + 1 sampled after them = max_tokens
    grow(req, [3, 4, 5])
    assert req not in drafter.drafts([req])  # one token left: nothing to draft


def rejected_draft_lengths(drafter: NgramDrafter, req: Req) -> list[int]:
    """The request's draft lengths over 4 x PROBE_INTERVAL passes that reject every draft."""
    lengths = []
    for _ in range(4 * PROBE_INTERVAL):
        draft = drafter.drafts([req]).get(req, [])
        lengths.append(len(draft))
        if draft:
            drafter.verified(req, len(draft), 0)
    return lengths


def test_the_draft_length_falls_to_zero_and_probes_again() -> None:
    drafter = NgramDrafter(RadixPrefixCache("cpu"), 8, 1, 1)
    req = decoding_req([7] * 50, max_tokens=1000)
    lengths = rejected_draft_lengths(drafter, req)
    assert lengths[:5] == [8, 4, 2, 1, 0]
    probes = [i for i, n in enumerate(lengths) if i >= 4 and n]
    assert probes and all(n == 1 for n in (lengths[i] for i in probes))
    assert len(probes) <= 4  # one probe per PROBE_INTERVAL passes
    drafter.verified(req, 1, 1)  # a kept probe turns drafting on again
    assert len(drafter.drafts([req])[req]) == 1
    drafter.verified(req, 1, 1)
    assert len(drafter.drafts([req])[req]) == 2


# -- what a draft's rows cost ---------------------------------------------------------------------
def timed(fixed: float, per_row: float, rows: list[int]) -> PassCost:
    """A PassCost that has seen passes of these row counts on a machine with this line."""
    cost = PassCost()
    for n in rows:
        cost.observe(n, fixed + per_row * n)
    return cost


def test_pass_cost_fits_the_line_through_the_passes_once_their_rows_vary() -> None:
    assert timed(0.004, 0.002, [1] * 50).line is None  # one row count: no slope to see
    cost = timed(0.004, 0.002, [1] * 50 + [4, 1, 6, 1, 9, 1])
    assert cost.line == pytest.approx((0.004, 0.002))
    assert cost.row_share(1) == pytest.approx(0.002 / 0.006)
    assert cost.row_share(8) == pytest.approx(0.016 / 0.020)
    for _ in range(200):  # the rows stop varying: the last line is kept
        cost.observe(1, 0.006)
    assert cost.line == pytest.approx((0.004, 0.002))


def test_pass_cost_follows_a_machine_that_slows_down() -> None:
    cost = timed(0.004, 0.002, [1, 5, 2, 8] * 20)
    for _ in range(60):
        for n in (1, 5, 2, 8):
            cost.observe(n, 2 * (0.004 + 0.002 * n))
    assert cost.line == pytest.approx((0.008, 0.004), rel=0.01)


@given(keep_rate=st.floats(0.0, 1.0), bar=st.floats(0.0, 1.0), most=st.integers(0, 20))
def test_paying_tokens_are_those_kept_with_a_chance_over_the_bar(keep_rate: float, bar: float, most: int) -> None:
    count = paying_tokens(keep_rate, bar, most)
    assert count == sum(keep_rate**i > bar for i in range(1, most + 1))


def test_a_draft_is_as_long_as_its_tokens_pay_for_their_rows() -> None:
    """A pass whose fixed cost is twice a row's: alone, a draft token pays from a one-in-three chance
    of being kept; among 8 requests, from eight in ten."""
    cost = timed(0.004, 0.002, [1, 3, 1, 5] * 10)
    drafter = NgramDrafter(RadixPrefixCache("cpu"), 8, 1, 1, cost)
    req = decoding_req([7] * 50, max_tokens=1000)
    lengths = []
    for _ in range(6):
        draft = drafter.drafts([req])[req]
        lengths.append(len(draft))
        drafter.verified(req, len(draft), len(draft))  # every draft is kept
    # Keep rates 1/2, 2/3, 4/5, 8/9, then over 0.94: 0.5 > 1/3 > 0.5^2, (2/3)^2 > 1/3 > (2/3)^3, ...
    assert lengths == [1, 2, 4, 8, 8, 8]
    crowd = [decoding_req([7] * 50, max_tokens=1000) for _ in range(7)]
    # Kept 32 of 33: (32/33)^7 = 0.806 > 0.8 > (32/33)^8; the others' even prior pays for nothing.
    assert drafter.drafts([req, *crowd]) == {req: [7] * 7}


def test_drafts_that_never_pay_are_only_probed() -> None:
    cost = timed(0.0015, 0.002, [1, 3, 1, 5] * 10)  # alone, a row is 4/7 of the pass: over the even prior
    lengths = rejected_draft_lengths(NgramDrafter(RadixPrefixCache("cpu"), 8, 1, 1, cost), decoding_req([7] * 50, 1000))
    assert lengths == [int((i + 1) % PROBE_INTERVAL == 0) for i in range(4 * PROBE_INTERVAL)]


# -- the radix tree's continuations ----------------------------------------------------------------
def reference_continuation(sequences: list[list[int]], context: list[int], max_len: int) -> list[int]:
    """Token by token, the next token of the latest inserted sequence that extends what is known."""
    known = list(context)
    while len(known) < len(context) + max_len:
        extending = [s for s in sequences if len(s) > len(known) and s[: len(known)] == known]
        if not extending:
            break
        known.append(extending[-1][len(known)])
    return known[len(context) :]


@settings(max_examples=200, deadline=None)
@given(
    sequences=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=10), min_size=1, max_size=6),
    pick=st.integers(0, 5),
    cut=st.integers(0, 10),
    max_len=st.integers(1, 8),
)
def test_continuation_follows_the_latest_use_and_touches_nothing(
    sequences: list[list[int]], pick: int, cut: int, max_len: int
) -> None:
    cache = RadixPrefixCache("cpu")
    slots = 0
    for seq in sequences:
        cache.insert_prefix(torch.tensor(seq), torch.arange(slots, slots + len(seq)))
        slots += len(seq)
    context = sequences[pick % len(sequences)][:cut]
    before = cache.render()
    got = cache.continuation(torch.tensor(context, dtype=torch.int64), None, max_len)
    assert got == reference_continuation(sequences, context, max_len)
    assert cache.render() == before  # no split, no LRU refresh
    cache.check_integrity()
    assert cache.continuation(torch.tensor(context, dtype=torch.int64), "other", max_len) == []


@pytest.mark.parametrize("page_size", [1, 2])
def test_continuation_with_pages(page_size: int) -> None:
    cache = RadixPrefixCache("cpu", page_size)
    cache.insert_prefix(torch.tensor([1, 2, 3, 4, 5, 6, 7, 8]), torch.arange(8))
    assert cache.continuation(torch.tensor([1, 2, 3]), None, 4) == [4, 5, 6, 7]
    assert cache.continuation(torch.tensor([1, 2, 9]), None, 4) == []
    assert cache.continuation(torch.tensor([1, 2, 3, 4, 5, 6, 7, 8]), None, 4) == []
    cache.insert_prefix(torch.tensor([1, 2, 3, 4, 10, 11, 12, 13]), torch.arange(8, 16))
    assert cache.continuation(torch.tensor([1, 2, 3]), None, 4) == [4, 10, 11, 12]


# -- end to end on SmolLM2 ---------------------------------------------------------------------
def run(llm: LLM, prompts: list[str] | list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Any]:
    return llm.generate(prompts, params, use_tqdm=False)  # type: ignore[arg-type]


def test_smollm_greedy_is_the_same_with_drafts_alone_and_batched(fresh_smollm: LLM) -> None:
    llm, params = fresh_smollm, SamplingParams(max_tokens=24)
    shipped, defaults = llm.scheduler.drafter, EngineConfig()
    try:
        llm.scheduler.drafter = None  # the shared engine, without speculation for the reference
        plain = [o["token_ids"] for o in run(llm, COPY_PROMPTS, params)]
        llm.flush_cache()
        # The default drafter, drafting whatever a row costs (this test's draft counts must not depend on timing).
        llm.scheduler.drafter = NgramDrafter(
            llm.scheduler.cache_manager.cache,
            defaults.speculative_max_draft,
            defaults.speculative_ngram_min,
            defaults.speculative_ngram_max,
        )
        before = llm.stats()
        assert run(llm, COPY_PROMPTS[:1], params)[0]["token_ids"] == plain[0]
        llm.flush_cache()  # the batch drafts from the prompts, not from the tree
        assert [o["token_ids"] for o in run(llm, COPY_PROMPTS, params)] == plain
        stats = llm.stats()
    finally:
        llm.scheduler.drafter = shipped
    assert stats["accepted_draft_tokens"] - before["accepted_draft_tokens"] > 24  # the copy prompts are copied
    assert stats["tokens_per_step"] > 1.0 and 0.0 < stats["acceptance_rate"] <= 1.0


# -- end to end on a tiny model (conftest's tiny_llama, plain and spec) -----------------------------
def tiny_prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    randoms = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (1, 5, 17, 40, 100)]
    return [*randoms, [5, 6, 7, 8, 9, 10] * 6, [300, 301] * 20 + [7], randoms[3] * 3]


def ids(outputs: list[Any]) -> list[list[int]]:
    return [o["token_ids"] for o in outputs]


def test_tiny_greedy_is_the_same_batched_chunked_and_with_radix_hits(plain: LLM, spec: LLM, tiny_llama: Path) -> None:
    prompts = tiny_prompts()
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    reference = ids(run(plain, prompts, params))
    before = spec.stats()["accepted_draft_tokens"]
    assert ids(run(spec, prompts, params)) == reference
    assert spec.stats()["accepted_draft_tokens"] > before  # the tiny model repeats itself
    # Again: every prompt is a radix hit, and the tree holds each output after its prompt, which is
    # drafted from the tree and kept nearly whole.
    before = spec.stats()
    assert ids(run(spec, prompts, params)) == reference
    after = spec.stats()
    assert after["cached_tokens"] > before["cached_tokens"]
    assert after["accepted_draft_tokens"] - before["accepted_draft_tokens"] >= len(prompts) * 40 // 2
    assert_idle_balanced(spec)
    chunked = LLM(str(tiny_llama), num_page_override=4096, max_prefill_tokens=16, page_size=4, speculative_algorithm="ngram")
    assert ids(run(chunked, prompts, params)) == reference
    assert ids([run(chunked, [p], params)[0] for p in prompts]) == reference
    assert_idle_balanced(chunked)
    chunked.shutdown()


def test_stops_and_max_tokens_inside_drafts_cut_where_they_would(plain: LLM, spec: LLM) -> None:
    prompt = [300, 301] * 20 + [7]
    full = run(plain, [prompt], SamplingParams(max_tokens=40, ignore_eos=True))[0]["token_ids"]
    words = plain.tokenizer.decode(full).split()
    variants = [SamplingParams(max_tokens=k, ignore_eos=True) for k in range(1, 40)]
    variants += [SamplingParams(max_tokens=40, stop_token_ids=[t], ignore_eos=True) for t in set(full)]
    variants += [SamplingParams(max_tokens=40, stop=[" ".join(words[k : k + 2])], ignore_eos=True) for k in range(39)]
    variants += [SamplingParams(max_tokens=40, stop=[w[1:]], ignore_eos=True) for w in set(words)]  # mid-token
    expected = run(plain, [prompt] * len(variants), variants)
    spec.flush_cache()
    before = spec.stats()["accepted_draft_tokens"]
    got = run(spec, [prompt] * len(variants), variants)
    assert spec.stats()["accepted_draft_tokens"] > before
    for want, have in zip(expected, got):
        assert (have["token_ids"], have["text"], have["meta"]["finish_reason"]) == (
            want["token_ids"], want["text"], want["meta"]["finish_reason"],
        )  # fmt: skip
    assert_idle_balanced(spec)


def test_aborts_and_rejected_drafts_leave_the_kv_balanced(spec: LLM) -> None:
    spec.flush_cache()
    scheduler = spec.scheduler
    prompts = tiny_prompts()
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    reqs = [scheduler.make_request(1000 + i, p, params) for i, p in enumerate(prompts)]
    for req in reqs:
        scheduler.add(req)
    stats = scheduler.stats
    drafted, accepted = stats.draft_tokens, stats.accepted_draft_tokens
    step = 0
    while scheduler.has_work:
        scheduler.step()
        scheduler.check_accounting()
        step += 1
        if step in (4, 8, 12):
            scheduler.abort(reqs[step // 4 + 4].rid)  # repetitive prompts: they draft
    assert stats.accepted_draft_tokens > accepted  # some drafts kept, some rejected
    assert stats.draft_tokens - drafted > stats.accepted_draft_tokens - accepted
    assert [r.finish_reason for r in reqs].count("abort") == 3
    assert_idle_balanced(spec)


def test_seeded_sampling_is_the_same_with_and_without_drafts(plain: LLM, spec: LLM) -> None:
    prompts = tiny_prompts()
    params = [
        SamplingParams(max_tokens=30, temperature=0.7, top_p=0.95, seed=s, ignore_eos=True) for s in range(len(prompts))
    ]
    reference = ids(run(plain, prompts, params))
    before = spec.stats()["accepted_draft_tokens"]
    assert ids(run(spec, prompts, params)) == reference
    assert ids([run(spec, [p], sp)[0] for p, sp in zip(prompts, params)]) == reference  # alone, with tree drafts
    assert spec.stats()["accepted_draft_tokens"] > before
    assert_idle_balanced(spec)


def test_penalties_and_logit_bias_are_the_same_with_and_without_drafts(plain: LLM, spec: LLM) -> None:
    """A penalized row's output before it includes its draft's tokens before it, so drafts verify exactly: the
    same greedy tokens with drafts as without, batched and alone."""
    prompts = tiny_prompts()
    params = [
        SamplingParams(max_tokens=30, ignore_eos=True, presence_penalty=0.1 * (i % 3), frequency_penalty=0.05 * i,
                       logit_bias={300 + i: 0.5} if i % 2 else {})
        for i in range(len(prompts))
    ]  # fmt: skip
    reference = ids(run(plain, prompts, params))
    assert reference != ids(run(plain, prompts, SamplingParams(max_tokens=30, ignore_eos=True)))
    spec.flush_cache()
    before = spec.stats()["accepted_draft_tokens"]
    assert ids(run(spec, prompts, params)) == reference
    assert ids([run(spec, [p], sp)[0] for p, sp in zip(prompts, params)]) == reference
    assert spec.stats()["accepted_draft_tokens"] > before
    assert_idle_balanced(spec)


def test_sampled_distribution_is_unchanged(plain: LLM, spec: LLM) -> None:
    """Two independent samples (different seeds), with and without speculation, of the first three
    tokens after a prompt that drafts (top-k 3: 27 outcomes): a chi-square test of homogeneity with a bound loose enough
    (p < 1e-6) never to fail by chance, which a verifier that kept drafts too often would fail."""
    prompt = [300, 301] * 20 + [7]
    n = 600

    def sample(llm: LLM, first_seed: int) -> Counter[tuple[int, ...]]:
        params = [
            SamplingParams(max_tokens=3, temperature=2.0, top_k=3, seed=seed, ignore_eos=True)
            for seed in range(first_seed, first_seed + n)
        ]
        # A few at a time: a pass drafts only while it keeps at most DRAFT_MAX_PASS_ROWS tokens.
        group = DRAFT_MAX_PASS_ROWS // 4
        outputs = [o for i in range(0, n, group) for o in run(llm, [prompt] * group, params[i : i + group])]
        return Counter(tuple(o["token_ids"]) for o in outputs)

    spec.flush_cache()
    before = spec.stats()
    with_drafts, without = sample(spec, 0), sample(plain, n)
    after = spec.stats()
    drafted = after["draft_tokens"] - before["draft_tokens"]
    assert 0 < after["accepted_draft_tokens"] - before["accepted_draft_tokens"] < drafted  # kept and rejected
    common = [k for k in with_drafts.keys() | without.keys() if with_drafts[k] + without[k] >= 10]
    rest = (n - sum(with_drafts[k] for k in common), n - sum(without[k] for k in common))
    cells = [(with_drafts[k], without[k]) for k in common] + ([rest] if sum(rest) else [])
    assert len(cells) >= 3, "the temperature must spread the samples"
    statistic = sum((a - b) ** 2 / (a + b) for a, b in cells)
    assert chi2.sf(statistic, len(cells) - 1) > 1e-6


def test_grammar_requests_decode_without_drafts(plain: LLM, spec: LLM) -> None:
    params = SamplingParams(max_tokens=12, regex=r"(w5|w6|w7){3,6}")
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    drafted = spec.stats()["draft_tokens"]
    assert ids(run(spec, [prompt], params)) == ids(run(plain, [prompt], params))
    assert spec.stats()["draft_tokens"] == drafted


# -- configuration, flags, metrics -------------------------------------------------------------------
def test_options_are_checked_and_reach_the_config() -> None:
    with pytest.raises(ValueError, match="speculative_algorithm must be none or ngram"):
        EngineConfig(speculative_algorithm="eagle")
    with pytest.raises(ValueError, match="speculative_ngram_max"):
        EngineConfig(speculative_ngram_min=3, speculative_ngram_max=2)
    with pytest.raises(ValueError, match="speculative_max_draft must be >= 1"):
        EngineConfig(speculative_max_draft=0)
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    flags = ["--speculative-algorithm", "ngram", "--speculative-max-draft", "5", "--speculative-ngram-min", "3"]
    args = parser.parse_args(flags)
    config = config_from_args(args)
    assert (config.speculative_algorithm, config.speculative_max_draft, config.speculative_ngram_min) == ("ngram", 5, 3)
    with pytest.raises(SystemExit):
        main(["generate", "x", "--speculative-algorithm", "eagle"])


def test_metrics_show_drafts(spec: LLM) -> None:
    run(spec, [[300, 301] * 20 + [7]], SamplingParams(max_tokens=20, ignore_eos=True))
    snapshot = spec.scheduler.snapshot()
    assert snapshot.counters.draft_tokens > 0
    text = ServerMetrics(lambda: snapshot).render().decode()
    for name in ("draft_tokens", "accepted_draft_tokens", "draft_acceptance_rate", "tokens_per_step"):
        assert f"minisgl_{name}" in text
    assert StatsSnapshot().as_dict()["acceptance_rate"] == 0.0


def test_the_scheduler_times_every_decode_pass_for_the_cost_and_no_prefill(tiny_llama: Path) -> None:
    """The shipped drafter's ``PassCost`` sees each decode pass once, with its rows (a token and the
    draft per request), and never a pass that prefills: its line is the decode passes' alone."""
    llm = LLM(str(tiny_llama), num_page_override=1024)
    cost = llm.scheduler.drafter.cost if llm.scheduler.drafter is not None else None
    assert cost is not None
    seen: list[int] = []
    observe = cost.observe
    cost.observe = lambda rows, seconds: seen.append(rows) or observe(rows, seconds)  # type: ignore[method-assign]
    before = llm.stats()
    run(llm, [[300, 301] * 20 + [7]], SamplingParams(max_tokens=16, ignore_eos=True))
    stats = llm.stats()
    drafted = stats["draft_tokens"] - before["draft_tokens"]
    kept = stats["accepted_draft_tokens"] - before["accepted_draft_tokens"]
    # The prefill pass samples the first token; each decode pass one more, plus the draft tokens it keeps.
    assert len(seen) == 15 - kept
    assert sum(seen) == len(seen) + drafted
    assert drafted > 0 and cost.line is not None  # the first drafts vary the rows: a line is fitted
    llm.shutdown()


def test_a_pass_with_drafts_is_a_decode_pass_over_its_tokens() -> None:
    """Every token sampled: each token is one decode query over its request's KV up to its own position
    (the decode kernels verify the draft); a pass with a prefill chunk stays an extension per request."""
    page_table = torch.arange(4 * 64).view(4, 64)
    params = SamplingParams(max_tokens=16)
    drafting, plain = Req(0, [5, 6, 7, 8, 9], params), Req(1, [3, 4], params)
    for req, row in ((drafting, 1), (plain, 3)):
        req.row, req.device_len = row, req.seq_len - 1
    work = ForwardPass.build([], [], [drafting, plain], page_table, {drafting: [10, 11]})
    batch = work.batch
    assert batch.attention is AttentionKind.DECODE
    assert batch.input_ids.tolist() == [9, 10, 11, 4]
    assert batch.table_rows.tolist() == [1, 1, 1, 3]
    assert batch.prefix_lens.tolist() == [4, 5, 6, 1] and batch.extend_lens.tolist() == [1, 1, 1, 1]
    assert batch.sample_rows.tolist() == [0, 1, 2, 3] and work.new_tokens == [3, 1]
    assert batch.out_slots.tolist() == [1 * 64 + 4, 1 * 64 + 5, 1 * 64 + 6, 3 * 64 + 1]

    prompt = Req(2, list(range(20, 30)), params)
    prompt.row = 0
    work = ForwardPass.build([prompt], [4], [drafting, plain], page_table, {drafting: [10, 11]})
    assert work.batch.attention is AttentionKind.EXTEND
    assert work.batch.table_rows.tolist() == [0, 1, 3] and work.batch.extend_lens.tolist() == [4, 3, 1]
