"""The prefill planner decides (a ``PrefillPlan``), the scheduler applies it; while nothing can be
admitted the planner does not order the queue (which matches every waiting prompt in the cache)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import assert_idle_balanced
from tiny_models import VOCAB, build_tiny_model

from minisgl import LLM, SamplingParams
from minisgl.scheduler.prefill import default_prefill_tokens
from minisgl.tuning import MAX_PREFILL_ACTIVATIONS, MAX_PREFILL_TOKENS

GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def test_full_rows_skip_the_prefix_match_and_plans_move_nothing(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = LLM(str(tiny), num_page_override=1024, max_running_req=2)
    sched = llm.scheduler
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, VOCAB, (20,), generator=g).tolist() for _ in range(6)]
    reqs = [sched.make_request(i, ids, GREEDY) for i, ids in enumerate(prompts)]
    for req in reqs:
        sched.add(req)
    sched.step()  # admits two: every page-table row is taken
    assert sched.running == reqs[:2] and list(sched.waiting) == reqs[2:]
    matches = 0
    cache = sched.cache_manager.cache

    def counting(original: Callable[..., object]) -> Callable[..., object]:
        def count(*args: object, **kwargs: object) -> object:
            nonlocal matches
            matches += 1
            return original(*args, **kwargs)

        return count

    for name in ("match_prefix", "match_len"):  # the lookup that admits, and the peek that ranks
        monkeypatch.setattr(cache, name, counting(getattr(cache, name)))
    plan = sched.planner.plan(sched.waiting, sched.running)
    assert (plan.reqs, plan.lens, plan.admitted) == ([], [], [])
    assert list(sched.waiting) == reqs[2:]  # planning moved nothing
    for _ in range(4):  # decode steps while both rows stay taken
        sched.step()
    assert matches == 0
    while sched.has_work:
        sched.step()
    assert matches > 0  # once rows freed up, the waiting requests were matched and admitted
    assert all(len(r.output_ids) == GREEDY.max_tokens for r in reqs)
    assert_idle_balanced(llm)


def test_a_short_prompt_is_not_starved_by_long_prefills(tiny: Path) -> None:
    llm = LLM(str(tiny), num_page_override=4096, max_prefill_tokens=256)
    sched = llm.scheduler
    g = torch.Generator().manual_seed(1)
    longs = [torch.randint(3, VOCAB, (900,), generator=g).tolist() for _ in range(3)]
    short = torch.randint(3, VOCAB, (10,), generator=g).tolist()
    alone = llm.generate([short], GREEDY, use_tqdm=False)[0]["token_ids"]
    llm.flush_cache()
    reqs = [sched.make_request(i, ids, GREEDY) for i, ids in enumerate([*longs, short])]
    for req in reqs:  # the short prompt arrives last, behind 2,700 prompt tokens
        sched.add(req)
    first = sched.step()
    assert [o.rid for o in first] == [3]  # its first token comes from the very first pass
    # The long prompt queued first got the rest of that pass's budget (chunked), and the next pass
    # is all long prompts: nothing is reserved while no short prompt waits.
    assert reqs[0].device_len == 256 - 10
    sched.step()
    assert reqs[0].device_len == 256 - 10 + 256
    while sched.has_work:
        sched.step()
    assert reqs[3].output_ids == alone
    assert all(len(r.output_ids) == GREEDY.max_tokens for r in reqs)
    assert_idle_balanced(llm)


@pytest.mark.parametrize("hidden_size", [64, 576, 1024, 2048, 3072, 4096, 8192])
def test_default_prefill_budget_bounds_a_pass_activations(hidden_size: int) -> None:
    """The default budget: MAX_PREFILL_TOKENS, or the most tokens whose hidden states fit
    MAX_PREFILL_ACTIVATIONS (a 1.7B model's 2,048-wide states: 1,024 tokens)."""
    budget = default_prefill_tokens(hidden_size)
    assert budget <= MAX_PREFILL_TOKENS and budget * hidden_size <= MAX_PREFILL_ACTIVATIONS
    assert budget == MAX_PREFILL_TOKENS or (budget + 1) * hidden_size > MAX_PREFILL_ACTIVATIONS


def test_the_prefill_budget_is_the_config_or_the_model_default(tmp_path: Path) -> None:
    folder = build_tiny_model("llama", tmp_path / "m")
    assert LLM(str(folder), num_page_override=64).scheduler.planner.max_prefill_tokens == MAX_PREFILL_TOKENS
    assert LLM(str(folder), num_page_override=64, max_prefill_tokens=7).scheduler.planner.max_prefill_tokens == 7
