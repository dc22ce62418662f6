"""Qwen3-MoE's sparse block and Mistral's sliding window, beyond the end-to-end token checks in
test_engine_tiny.py: the block against transformers' own, experts run once per pass, and the window
really changes the tokens and survives prefix reuse from the radix cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import assert_idle_balanced, hf_greedy
from tiny_models import VOCAB, WINDOW, build_tiny_model
from transformers import AutoModelForCausalLM, Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from minisgl import LLM, SamplingParams
from minisgl.layers.moe import SparseMoE

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_sparse_moe_matches_transformers_block(norm_topk_prob: bool) -> None:
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2, norm_topk_prob=norm_topk_prob)
    theirs = Qwen3MoeSparseMoeBlock(cfg).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
    ours = SparseMoE(32, 8, 2, 24, norm_topk_prob, tp=None, part=(0, 24))
    with torch.no_grad():
        ours.gate.weight.copy_(theirs.gate.weight)
        for e, expert in enumerate(ours.experts):
            expert.gate_up_proj.weight.copy_(theirs.experts.gate_up_proj[e])
            expert.down_proj.weight.copy_(theirs.experts.down_proj[e])
    x = torch.randn(1, 50, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x[0]), theirs(x)[0], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe"))


def test_each_expert_runs_at_most_once_per_pass(tiny_moe: Path) -> None:
    llm = LLM(str(tiny_moe), num_page_override=1024)
    calls: list[tuple[int, int]] = []  # (layer, expert) of every expert call
    moe_layers = 0
    for layer_id, layer in enumerate(llm.scheduler.engine.model.model.layers):
        if isinstance(layer.mlp, SparseMoE):
            moe_layers += 1
            for e, expert in enumerate(layer.mlp.experts):
                expert.register_forward_hook(lambda *_, key=(layer_id, e): calls.append(key))
    assert moe_layers == 2  # layers 0 and 2; layer 1 is in mlp_only_layers
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (30, 7, 19, 44)]
    llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)  # one prefill pass, 100 tokens
    assert len(calls) == len(set(calls))  # no expert ran twice in the pass
    assert len(calls) > moe_layers * 2  # 200 token-expert pairs per layer reach more than top-2 experts
    assert_idle_balanced(llm)


@pytest.fixture(scope="module")
def tiny_window(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("mistral_window", tmp_path_factory.mktemp("mistral_window"))


def test_window_changes_tokens_and_survives_prefix_reuse(tiny_window: Path) -> None:
    g = torch.Generator().manual_seed(4)
    prefix = torch.randint(3, VOCAB, (3 * WINDOW,), generator=g).tolist()
    prompts = [prefix + torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (2, 9, 31)]
    hf = AutoModelForCausalLM.from_pretrained(tiny_window, dtype=torch.float32).eval()
    reference = [hf_greedy(hf, ids, GREEDY.max_tokens) for ids in prompts]
    unwindowed = AutoModelForCausalLM.from_pretrained(tiny_window, dtype=torch.float32, sliding_window=None).eval()
    assert [hf_greedy(unwindowed, ids, GREEDY.max_tokens) for ids in prompts] != reference  # the window matters

    llm = LLM(str(tiny_window), num_page_override=2048, max_prefill_tokens=20)  # radix cache, chunked prefill
    first = llm.generate([prompts[0]], GREEDY, use_tqdm=False)[0]
    rest = llm.generate(prompts[1:], GREEDY, use_tqdm=False)
    assert [first["token_ids"]] + [o["token_ids"] for o in rest] == reference
    # The later prompts reused the shared prefix, which is longer than the window, from the cache.
    assert all(o["meta"]["cached_tokens"] >= len(prefix) for o in rest)
    assert_idle_balanced(llm)


def test_per_layer_windows_match_transformers(tmp_path: Path) -> None:
    folder = build_tiny_model("qwen2_window", tmp_path / "q")
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (70, 40, 5)]
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    reference = [hf_greedy(hf, ids, GREEDY.max_tokens) for ids in prompts]
    full = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, layer_types=["full_attention"] * 2).eval()
    assert [hf_greedy(full, ids, GREEDY.max_tokens) for ids in prompts] != reference  # layer 1's window matters
    llm = LLM(str(folder), num_page_override=1024, max_prefill_tokens=16)
    assert llm.scheduler.engine.model_config.layer_windows == (None, WINDOW)
    assert [o["token_ids"] for o in llm.generate(prompts, GREEDY, use_tqdm=False)] == reference
    assert_idle_balanced(llm)
