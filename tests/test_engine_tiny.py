"""Tiny random-weight Llama / Qwen2 / Qwen3 / Mistral (with and without a sliding window) / Qwen3-MoE
folders: the folder loader, chunking and batching."""

from __future__ import annotations

import ctypes
import ctypes.util
from pathlib import Path

import pytest
import torch
from conftest import assert_idle_balanced, hf_greedy
from tiny_models import VOCAB, build_tiny_model
from transformers import AutoModelForCausalLM

import minisgl.engine.engine as engine_module
from minisgl import LLM, SamplingParams
from minisgl.heap import retain_freed_memory
from minisgl.tuning import DECODE_RUN

MAX_TOKENS = 12
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "mistral", "mistral_window", "qwen3_moe"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(request.param, tmp_path_factory.mktemp(request.param))


def random_prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


PROMPTS = random_prompts(0, (1, 5, 17, 40, 3, 64, 100, 9))


def test_matches_transformers_batched_single_and_chunked(tiny: Path) -> None:
    hf = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    reference = [hf_greedy(hf, ids, MAX_TOKENS) for ids in PROMPTS]
    whole = LLM(str(tiny), num_page_override=2048)
    assert [o["token_ids"] for o in whole.generate(PROMPTS, GREEDY, use_tqdm=False)] == reference
    single = [whole.generate([ids], GREEDY, use_tqdm=False)[0]["token_ids"] for ids in PROMPTS]
    assert single == reference
    assert_idle_balanced(whole)
    chunked = LLM(str(tiny), num_page_override=2048, max_prefill_tokens=16, cache_type="naive")
    assert [o["token_ids"] for o in chunked.generate(PROMPTS, GREEDY, use_tqdm=False)] == reference
    assert_idle_balanced(chunked)


def test_decoding_requests_ride_along_a_chunked_prefill(tiny: Path) -> None:
    hf = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    short_ids, long_ids = PROMPTS[1], PROMPTS[6]  # 5 and 100 tokens
    llm = LLM(str(tiny), num_page_override=2048, max_prefill_tokens=16)
    sched = llm.scheduler
    short = sched.make_request(0, short_ids, GREEDY)
    sched.add(short)
    sched.step()  # the short prompt's prefill samples its first token
    long = sched.make_request(1, long_ids, GREEDY)
    sched.add(long)
    for _ in range(6):  # 96 of the long prompt's 100 tokens, 16 per pass
        outputs = sched.step()
        assert long.is_prefilling and [o.rid for o in outputs] == [0]  # the short one still streams
    assert [o.rid for o in sched.step()] == [1, 0]  # the last chunk: the long prompt's first token
    assert sched.stats.prefill_tokens == len(short_ids) + len(long_ids) and sched.stats.decode_steps == 0
    while sched.has_work:
        sched.step()
    assert short.output_ids == hf_greedy(hf, short_ids, MAX_TOKENS)
    assert long.output_ids == hf_greedy(hf, long_ids, MAX_TOKENS)
    assert_idle_balanced(llm)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_page_sizes_and_small_batches_agree(tiny: Path, page_size: int) -> None:
    base = LLM(str(tiny), num_page_override=4096 // page_size, cache_type="naive")
    expected = [o["token_ids"] for o in base.generate(PROMPTS, GREEDY, use_tqdm=False)]
    llm = LLM(str(tiny), num_page_override=4096 // page_size, page_size=page_size, max_running_req=3, max_prefill_tokens=24)
    assert [o["token_ids"] for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == expected
    assert_idle_balanced(llm)


def test_pool_smaller_than_workload_still_completes(tiny: Path) -> None:
    # Room for about two requests at a time: the rest queue until KV is released.
    llm = LLM(str(tiny), num_page_override=256, cache_type="radix")
    expected = [o["token_ids"] for o in LLM(str(tiny), num_page_override=4096).generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert [o["token_ids"] for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == expected
    assert_idle_balanced(llm)


def test_a_decoding_batch_keeps_each_request_s_keys_in_runs(tmp_path: Path) -> None:
    """A decoding request takes DECODE_RUN positions' KV slots at once (within its reservation): its
    keys lie in runs of the pool, not a batch apart; the tokens and the accounting stay the same."""
    tiny = build_tiny_model("llama", tmp_path / "llama")
    prompts = random_prompts(1, (5, 9, 3, 7))
    params = SamplingParams(max_tokens=DECODE_RUN + 8, ignore_eos=True)
    # One token a step: drafts (accepted at a pace set by timing) would end the requests sooner.
    llm = LLM(str(tiny), num_page_override=1024, speculative_algorithm="none")
    sched = llm.scheduler
    reqs = [sched.make_request(i, ids, params) for i, ids in enumerate(prompts)]
    for req in reqs:
        sched.add(req)
    for _ in range(DECODE_RUN + 1):  # the prefill pass, then DECODE_RUN decode steps
        sched.step()
    table = sched.cache_manager.table.page_table
    for req, ids in zip(reqs, prompts):
        assert req.row >= 0 and not req.is_prefilling, req.rid  # still running
        run = table[req.row, len(ids) : len(ids) + DECODE_RUN]
        assert torch.equal(run, run[0] + torch.arange(DECODE_RUN, device=run.device)), req.rid
        assert req.allocated_len == len(ids) + DECODE_RUN  # the run's end: no more yet
    while sched.has_work:
        sched.step()
    assert_idle_balanced(llm)
    fresh = LLM(str(tiny), num_page_override=1024)
    assert [r.output_ids for r in reqs] == [o["token_ids"] for o in fresh.generate(prompts, params, use_tqdm=False)]


class MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and later)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


def test_a_cpu_engine_keeps_freed_memory_for_the_next_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU engine sets malloc to keep freed memory once its model is loaded: a 64 MiB temporary comes
    from the heap, not from pages mapped for it (glibc's default for anything past 32 MiB, and returned
    to the kernel on free, so that every pass faults its pages in again), and stays in the heap once
    freed."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("the C library is not glibc 2.33 or later")
    libc.mallinfo2.restype = MallInfo2
    calls: list[bool] = []
    monkeypatch.setattr(engine_module, "retain_freed_memory", lambda: calls.append(retain_freed_memory()))
    LLM(str(build_tiny_model("llama", tmp_path / "llama")), num_page_override=64, device="cpu")
    assert calls == [True]
    mapped = libc.mallinfo2().hblkhd
    temporary = torch.ones(1 << 24)
    assert libc.mallinfo2().hblkhd <= mapped  # no new mapping
    heap = libc.mallinfo2().arena
    del temporary
    assert libc.mallinfo2().arena >= heap  # nothing given back
