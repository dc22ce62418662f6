"""Sliding-window layers keep only their window's KV (``kvcache/window.py``): the window slot map against
a plain reference, the pool sizing, and tiny windowed models (Gemma 3, Mistral, Qwen2 with a window)
whose window pool is far smaller than their prompts, token-exact against transformers with the window
KV of cached prefixes evicted under pressure, accounting balanced after every step."""

from __future__ import annotations

import argparse
import logging
import random
import re
from pathlib import Path

import pytest
import torch
from conftest import assert_idle_balanced, hf_greedy
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import VOCAB, build_tiny_model
from transformers import AutoModelForCausalLM

from minisgl import LLM, SamplingParams
from minisgl.cli import add_engine_args, config_from_args
from minisgl.config import EngineConfig
from minisgl.kvcache.pool import KVPool
from minisgl.kvcache.radix_cache import RadixPrefixCache
from minisgl.kvcache.window import (
    WindowSlots,
    full_slots_in_budget,
    slots_per_request,
    window_pool_slots,
)

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


# -- the slot map ----------------------------------------------------------------------------------
def reference_usable_len(present: list[bool], window: int, page_size: int) -> int:
    """The longest whole-page prefix whose last window - 1 tokens all have window KV, by brute force."""
    best = 0
    for end in range(page_size, len(present) + 1, page_size):
        if all(present[max(0, end - window + 1) : end]):
            best = end
    return best


@settings(max_examples=300, deadline=None)
@given(
    present=st.lists(st.booleans(), max_size=40),
    window=st.integers(2, 12),
    page_size=st.sampled_from([1, 2, 4]),
)
def test_usable_len_matches_reference(present: list[bool], window: int, page_size: int) -> None:
    slots = WindowSlots(len(present), len(present), window)
    full = torch.arange(len(present))
    slots.assign(full[torch.tensor(present, dtype=torch.bool)])
    assert slots.usable_len(full, page_size) == reference_usable_len(present, window, page_size)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["assign", "release", "adopt"]), st.lists(st.integers(0, 15), max_size=8))))
def test_slot_map_against_a_dict(ops: list[tuple[str, list[int]]]) -> None:
    """Assign, release and adopt keep every window slot free or held by exactly one full slot, as a
    plain dict of full slot -> window slot says."""
    slots = WindowSlots(16, 12, 4)
    model: dict[int, int] = {}
    for op, raw in ops:
        full = torch.tensor(sorted(set(raw)), dtype=torch.int64)
        if op == "assign":
            missing = [s for s in full.tolist() if s not in model]
            if len(missing) > slots.free_size:
                with pytest.raises(RuntimeError, match="window KV pool exhausted"):
                    slots.assign(full)
                continue
            slots.assign(full)
            model |= {s: int(slots.slot_of[s]) for s in missing}
        elif op == "release":
            assert slots.release(full) == sum(s in model for s in full.tolist())
            for s in full.tolist():
                model.pop(s, None)
        else:  # the first half computed again as the second half: move what the first half lacks
            half = len(full) // 2
            cached, dupes = full[:half], full[half : 2 * half]
            slots.adopt(cached, dupes)
            for c, d in zip(cached.tolist(), dupes.tolist()):
                if c not in model and d in model:
                    model[c] = model.pop(d)
        slots.check_integrity()
        assert {s: int(w) for s, w in enumerate(slots.slot_of.tolist()) if w} == model
        assert slots.free_size + len(model) == slots.capacity


@settings(max_examples=200, deadline=None)
@given(
    budget=st.integers(0, 10**7),
    full_bytes=st.integers(0, 5000),
    window_bytes=st.integers(1, 5000),
    ratio=st.floats(0.01, 1.0),
    min_slots=st.integers(1, 300),
)
def test_budget_split_is_the_largest_that_fits(
    budget: int, full_bytes: int, window_bytes: int, ratio: float, min_slots: int
) -> None:
    def cost(n: int) -> int:
        return n * full_bytes + (window_pool_slots(n, ratio, min_slots) + 1) * window_bytes

    n = full_slots_in_budget(budget, full_bytes, window_bytes, ratio, min_slots)
    assert (n == 0 or cost(n) <= budget) and cost(n + 1) > budget  # 0: not even one slot fits
    assert window_pool_slots(n, ratio, min_slots) <= n


def test_bad_settings_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="at least 2 positions"):
        WindowSlots(8, 8, 1)
    for ratio in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="window_kv_ratio"):
            EngineConfig(window_kv_ratio=ratio)
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert config_from_args(parser.parse_args(["--window-kv-ratio", "0.5"])).window_kv_ratio == 0.5


def test_radix_match_stops_where_the_window_kv_ends() -> None:
    """A cached prefix is matched (and peeked) only up to where its last window - 1 tokens have window KV."""
    slots = WindowSlots(64, 64, 4)
    cache = RadixPrefixCache("cpu", 1, lambda s: slots.usable_len(s, 1))
    ids = torch.arange(100, 120)
    full = torch.arange(20)
    cache.insert_prefix(ids, full)
    slots.assign(full[:10])  # positions 0-9 only
    assert cache.match_len(ids) == 10
    assert cache.match_prefix(ids).handle.cached_len == 10
    slots.release(full[7:8])  # a hole: the window before position 10 reads position 7
    assert cache.match_len(ids) == 7
    slots.assign(full)
    assert cache.match_len(ids) == 20
    cache.check_integrity()


# -- engines ---------------------------------------------------------------------------------------
def workload(seed: int = 0) -> list[list[int]]:
    """Random prompts and prompts under one shared 40-token system prompt, longer than every window."""
    rng = random.Random(seed)
    system = [rng.randrange(3, VOCAB) for _ in range(40)]
    prompts = []
    for i in range(10):
        if i % 3 == 0:
            prompts.append([rng.randrange(3, VOCAB) for _ in range(rng.randrange(5, 50))])
        else:
            prompts.append(system + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 15))])
    return prompts


def run_checked(
    llm: LLM, prompts: list[list[int]], params: SamplingParams
) -> tuple[list[list[int]], list[int], list[int]]:
    """Generate step by step, checking the KV accounting after every step and the window slots held
    by running requests against their bound; (tokens, cached tokens, peak window slots in use)."""
    scheduler = llm.scheduler
    rids = list(range(len(prompts)))
    for rid, prompt in zip(rids, prompts):
        scheduler.add(scheduler.make_request(rid, prompt, params))
    tokens: dict[int, list[int]] = {rid: [] for rid in rids}
    cached: dict[int, int] = {}
    in_use: list[int] = []
    while scheduler.has_work:
        for out in scheduler.step():
            tokens[out.rid].append(out.token_id)
            cached[out.rid] = out.cached_tokens
        scheduler.check_accounting()
        in_use.append(scheduler.kv_usage().get("window_in_use", 0))
    return [tokens[r] for r in rids], [cached[r] for r in rids], in_use


@pytest.fixture(scope="module", params=["gemma3_pattern6", "gemma3_alternating", "mistral_window", "qwen2_window"])
def windowed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[int]]]:
    folder = build_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = workload()
    return folder, [hf_greedy(hf, p, GREEDY.max_tokens) for p in prompts]


@pytest.mark.parametrize(
    "options",
    [
        {"window_kv_ratio": 0.01},  # the smallest pool: one request's worth
        {"window_kv_ratio": 0.01, "page_size": 4, "num_page_override": 80},
        {"window_kv_ratio": 0.05, "speculative_algorithm": "ngram", "max_running_req": 4},
        {"window_kv_ratio": 1.0},
    ],
    ids=["smallest", "pages", "speculative", "ratio-1"],
)
def test_small_window_pools_stay_token_exact(windowed: tuple[Path, list[list[int]]], options: dict) -> None:
    folder, reference = windowed
    prompts = workload()
    config = {"num_page_override": 300, "max_prefill_tokens": 16, "max_running_req": 6} | options
    llm = LLM(str(folder), quantization="none", **config)
    try:
        window = llm.scheduler.cache_manager.window
        assert window is not None and llm.scheduler.engine.window_pool is not None
        tokens, _, in_use = run_checked(llm, prompts, GREEDY)
        assert tokens == reference
        # What running requests hold themselves never exceeds their reservations.
        per_request = slots_per_request(window.window, llm.config.max_draft)
        assert max(in_use) <= per_request * config["max_running_req"]
        # A later turn of a conversation continues from the cache, still token-exact.
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        follow = prompts[1] + reference[1] + [5, 6, 7]
        out = llm.generate([follow], GREEDY, use_tqdm=False)[0]
        assert out["token_ids"] == hf_greedy(hf, follow, GREEDY.max_tokens)
        if options["window_kv_ratio"] < 1:
            assert llm.scheduler.kv_usage()["window_evicted_total"] > 0  # the pool was under pressure
        assert_idle_balanced(llm)
    finally:
        llm.shutdown()


def test_window_pool_fits_more_tokens_in_the_same_memory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One full layer in six: at the default ratio the same budget holds over 3x the tokens of full
    attention in every layer, and the pools stay within it; the start-up log says both."""
    folder = build_tiny_model("gemma3_pattern6", tmp_path / "gemma")
    with caplog.at_level(logging.INFO, logger="minisgl.engine"):
        llm = LLM(str(folder), quantization="none", kv_memory_gb=0.01)
    try:
        engine, cfg = llm.scheduler.engine, llm.scheduler.engine.model_config
        budget = int(0.01 * 2**30)
        every_layer = budget // KVPool.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.float32)
        assert engine.pool.num_slots > 3 * every_layer
        assert engine.memory["kv_pool"] <= budget
        assert engine.pool.k.shape[0] == 1 and engine.window_pool is not None and engine.window_pool.k.shape[0] == 5
        assert llm.stats()["kv_window_capacity"] == engine.window_pool.num_slots - 1
        stated = re.search(r"(\d+) tokens fit, ([\d.]+)x the (\d+) of full attention", caplog.text)
        assert stated is not None and int(stated[1]) == engine.pool.num_slots and float(stated[2]) > 3
        assert abs(int(stated[3]) - every_layer) <= 1  # the pools' bytes, the scratch slot left out
        assert f"KV pool {engine.memory['kv_pool'] / 2**20:.1f} MiB" in caplog.text
    finally:
        llm.shutdown()


def test_shared_prefix_hits_as_with_full_attention(windowed: tuple[Path, list[list[int]]], tmp_path: Path) -> None:
    """With the default ratio and a pool with room, every request reuses what full attention's cache
    would give it: the same cached tokens as a model without windows on the same workload."""
    folder, _ = windowed
    full_attention = build_tiny_model("llama", tmp_path / "llama")
    counts = []
    for model in (folder, full_attention):
        llm = LLM(str(model), quantization="none", num_page_override=2000, max_prefill_tokens=16)
        try:
            counts.append(run_checked(llm, workload(), GREEDY)[1])
        finally:
            llm.shutdown()
    assert counts[0] == counts[1] and sum(counts[0]) > 0
