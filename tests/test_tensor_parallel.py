"""Tensor parallelism over gloo (CPU): the same greedy tokens as one rank, balanced KV on every rank,
and a dead rank is reported within seconds instead of hanging the engine."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_idle_balanced
from tiny_models import VOCAB, build_tiny_model

from minisgl import LLM, SamplingParams
from minisgl.config import EngineConfig
from minisgl.distributed.sharding import even_range, max_kv_heads, shard_heads

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)
# Generous: ranks start in fresh interpreters on a shared 2-core machine. Only "does not hang" is tested.
HANG_LIMIT_S = 120


def call_with_limit(fn: Callable[[], Any], limit: float = HANG_LIMIT_S) -> Any:
    """``fn()``'s result or exception; fails the test if it is still running after ``limit`` s."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 (re-raised below)
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"still running after {limit} s: the engine hangs"
    if "error" in box:
        raise box["error"]
    return box.get("result")


def tokens(llm: LLM, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    return [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]


def assert_ranks_agree(llm: LLM, kv_heads: list[int]) -> None:
    """Rank 0's accounting balances, and every rank wrote the same KV slots in the same steps
    (``check_ranks`` raises if any rank's slots, checksum, steps or tokens differ from rank 0's)."""
    assert_idle_balanced(llm)  # runs check_ranks through check_accounting too
    reports = llm.scheduler.runner.check_ranks()
    assert [r["kv_heads"] for r in reports] == kv_heads
    assert reports[0]["slots_written"] > 0


# -- sharding arithmetic ---------------------------------------------------------------------------
def test_even_ranges_cover_everything() -> None:
    for n, parts in [(49152, 2), (7, 3), (3, 4), (1536, 2)]:
        ranges = [even_range(n, parts, i) for i in range(parts)]
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in pairwise(ranges))
        assert max(e - s for s, e in ranges) - min(e - s for s, e in ranges) <= 1


def test_head_shards_uneven_and_replicated() -> None:
    # SmolLM2 at TP=2: 3 KV heads split 2 + 1, each with its 3 query heads per KV head.
    assert [(s.q, s.kv) for s in (shard_heads(9, 3, 2, r) for r in range(2))] == [((0, 6), (0, 2)), ((6, 9), (2, 3))]
    assert max_kv_heads(9, 3, 2) == 2
    # Fewer KV heads than ranks: each KV head is replicated on a team of ranks sharing its query heads.
    shards = [shard_heads(9, 3, 6, r) for r in range(6)]
    assert [s.kv for s in shards] == [(0, 1), (0, 1), (1, 2), (1, 2), (2, 3), (2, 3)]
    assert [s.q for s in shards] == [(0, 2), (2, 3), (3, 5), (5, 6), (6, 8), (8, 9)]
    for s in shards:  # every query head the rank computes reads the KV head it holds
        assert all(q // 3 == s.kv[0] for q in range(*s.q))
    with pytest.raises(ValueError, match="divide the ranks"):
        shard_heads(9, 3, 4, 0)
    with pytest.raises(ValueError, match="at least one"):
        shard_heads(4, 2, 8, 0)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="multiple of nnodes"):
        EngineConfig(tp_size=3, nnodes=2, dist_init_addr="h:1")
    with pytest.raises(ValueError, match="needs dist_init_addr"):
        EngineConfig(tp_size=4, nnodes=2)
    with pytest.raises(ValueError, match="node_rank"):
        EngineConfig(tp_size=2, nnodes=2, node_rank=2, dist_init_addr="h:1")
    with pytest.raises(ValueError, match="host:port"):
        EngineConfig(tp_size=2, dist_init_addr="nohost")
    assert EngineConfig(tp_size=4, nnodes=2, dist_init_addr="10.0.0.1:29500").tp_per_node == 2


# -- end to end ------------------------------------------------------------------------------------
def test_smollm_tp2_matches_tp1(smollm: LLM) -> None:
    prompts = [smollm.tokenizer.encode(p) for p in ("The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,")]
    if smollm.scheduler.engine.device.type == "cpu":
        reference = tokens(smollm, prompts)
    else:  # compare like with like: gloo ranks run on the CPU
        cpu = LLM(num_page_override=2048, device="cpu", quantization="none")
        reference = tokens(cpu, prompts)
        cpu.shutdown()
    llm = call_with_limit(lambda: LLM(tp_size=2, num_page_override=2048, device="cpu", quantization="none"))
    try:
        assert call_with_limit(lambda: tokens(llm, prompts)) == reference
        # 9 query / 3 KV heads over 2 ranks: rank 0 holds KV heads 0-1, rank 1 holds KV head 2.
        assert_ranks_agree(llm, kv_heads=[2, 1])
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 query / 2 KV heads, untied LM head: everything divides by 2."""
    return build_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3"))


def test_tiny_qwen3_tp2_matches_tp1_with_chunks_pages_and_cache_hits(tiny_qwen3: Path) -> None:
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(3, VOCAB, (40,), generator=g).tolist()
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (1, 9, 70)]
    prompts += [prefix + [7, 8, 9], prefix + [10, 11]]  # a shared prefix: radix hits on the second pass
    options: dict[str, Any] = {"num_page_override": 512, "page_size": 4, "max_prefill_tokens": 32, "device": "cpu"}
    scoring = SamplingParams(max_tokens=4, ignore_eos=True, logprobs=2, prompt_logprobs=2)
    ref_llm = LLM(str(tiny_qwen3), **options)
    reference = tokens(ref_llm, prompts)
    ref_scores = ref_llm.generate(prompts[1:3], scoring, use_tqdm=False)
    ref_llm.shutdown()
    llm = call_with_limit(lambda: LLM(str(tiny_qwen3), tp_size=2, **options))
    try:
        assert call_with_limit(lambda: tokens(llm, prompts)) == reference
        again = call_with_limit(lambda: tokens(llm, prompts))  # now mostly from the prefix cache
        assert again == reference
        # Scored prompt rows go to every rank with the sampled ones (the 70-token prompt: over 3 chunks).
        scores = call_with_limit(lambda: llm.generate(prompts[1:3], scoring, use_tqdm=False))
        for got, want in zip(scores, ref_scores):
            assert got["token_ids"] == want["token_ids"]
            for name in ("prompt_logprobs", "logprobs"):
                values = [x.logprob for x in got[name] if x is not None]
                assert values == pytest.approx([x.logprob for x in want[name] if x is not None], abs=1e-3)
        # Alone, the 70-token prompt's first chunks sample no row: no logits to gather on any rank.
        llm.flush_cache()
        assert call_with_limit(lambda: tokens(llm, [prompts[2]])) == [reference[2]]
        assert llm.stats()["cached_tokens"] > 0
        assert_ranks_agree(llm, kv_heads=[1, 1])
    finally:
        llm.shutdown()


def test_tiny_qwen3_tp2_with_speculative_decoding_matches_tp1(tiny_qwen3: Path) -> None:
    """Verification passes (several sampled rows per request) broadcast like any other batch."""
    prompts = [[5, 6, 7, 8, 9, 10] * 6, [300, 301] * 20 + [7], list(range(40, 80))]
    options: dict[str, Any] = {"num_page_override": 512, "page_size": 4, "device": "cpu"}
    ref_llm = LLM(str(tiny_qwen3), **options)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    reference = tokens(ref_llm, prompts, params)
    ref_llm.shutdown()
    llm = call_with_limit(lambda: LLM(str(tiny_qwen3), tp_size=2, speculative_algorithm="ngram", **options))
    try:
        assert call_with_limit(lambda: tokens(llm, prompts, params)) == reference
        assert call_with_limit(lambda: tokens(llm, prompts, params)) == reference  # drafts from the tree
        assert llm.stats()["accepted_draft_tokens"] > 0
        assert_ranks_agree(llm, kv_heads=[1, 1])
    finally:
        llm.shutdown()


@pytest.mark.parametrize("kind", ["qwen3_moe", "gemma3_alternating"])
def test_tiny_moe_and_gemma3_tp2_match_tp1(kind: str, tmp_path: Path) -> None:
    """Qwen3-MoE: every expert's intermediate dimension split over the ranks, one all-reduce per MoE
    block. Gemma 3: its norms replicated, sliding and full layers, soft-capped logits gathered."""
    folder = build_tiny_model(kind, tmp_path / kind)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (1, 12, 50, 23)]
    options: dict[str, Any] = {"num_page_override": 512, "max_prefill_tokens": 32, "device": "cpu"}
    ref_llm = LLM(str(folder), **options)
    reference = tokens(ref_llm, prompts)
    ref_llm.shutdown()
    llm = call_with_limit(lambda: LLM(str(folder), tp_size=2, **options))
    try:
        assert call_with_limit(lambda: tokens(llm, prompts)) == reference
        assert_ranks_agree(llm, kv_heads=[1, 1])
    finally:
        llm.shutdown()


def test_quantized_gguf_tp2_matches_tp1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank builds its share of the file's int4 weights from the blocks: column shards take rows,
    row shards whole 32-column groups (qwen3's o_proj and down_proj: 128 columns, 64 a rank). The int4
    kernel's per-group rounding of the input is the same on a shard, so the ranks' sums differ from one
    rank's only in their order."""
    import gguf
    from gguf_writer import train_bpe, write_gguf

    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    folder = build_tiny_model("qwen3", tmp_path / "qwen3", num_attention_heads=4, head_dim=32)
    train_bpe("qwen2", VOCAB - 100).save_pretrained(folder)
    path = write_gguf(folder, tmp_path / "q4_0.gguf", "qwen2", qtype=gguf.GGMLQuantizationType.Q4_0)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (1, 9, 40)]
    options: dict[str, Any] = {"num_page_override": 512, "max_prefill_tokens": 16, "device": "cpu", "kv_dtype": "float32"}
    ref_llm = LLM(str(path), **options)
    assert all(m.quantized is not None for m in ref_llm.scheduler.engine.model.modules() if hasattr(m, "quantized"))
    reference = tokens(ref_llm, prompts)
    ref_llm.shutdown()
    llm = call_with_limit(lambda: LLM(str(path), tp_size=2, **options))
    try:
        assert call_with_limit(lambda: tokens(llm, prompts)) == reference
        assert_ranks_agree(llm, kv_heads=[1, 1])
    finally:
        llm.shutdown()


@pytest.mark.parametrize("when", ["idle", "mid-generation"])
def test_killed_rank_raises_instead_of_hanging(tiny_qwen3: Path, when: str) -> None:
    llm = call_with_limit(lambda: LLM(str(tiny_qwen3), tp_size=2, num_page_override=2048, device="cpu"))
    try:
        pid = llm.scheduler.runner.supervisor.pids[1]
        long = SamplingParams(max_tokens=400, ignore_eos=True)
        if when == "idle":
            os.kill(pid, signal.SIGKILL)
        else:
            call_with_limit(lambda: tokens(llm, [[5, 6, 7]]))
            threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
        with pytest.raises(RuntimeError, match=r"tensor-parallel rank 1 died \(exit code -9\)"):
            call_with_limit(lambda: tokens(llm, [[5, 6, 7], [8, 9]], long))
        # The engine stays failed with the same message.
        with pytest.raises(RuntimeError, match="tensor-parallel rank 1 died"):
            call_with_limit(lambda: tokens(llm, [[5, 6, 7]]))
    finally:
        call_with_limit(llm.shutdown)


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit may not be reaped at once in a container)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_ranks_exit_when_rank_0_dies(tiny_qwen3: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os
        from minisgl import LLM, SamplingParams
        if __name__ == "__main__":
            llm = LLM({str(tiny_qwen3)!r}, tp_size=2, num_page_override=256, device="cpu")
            llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2), use_tqdm=False)
            print(llm.scheduler.runner.supervisor.pids[1], flush=True)
            os.kill(os.getpid(), 9)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], check=False, stdout=subprocess.PIPE, text=True, timeout=HANG_LIMIT_S
    )
    assert out.returncode == -signal.SIGKILL, out
    worker = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not running(worker):
            return
        time.sleep(0.2)
    os.kill(worker, signal.SIGKILL)
    pytest.fail("rank 1 outlived rank 0 by a minute")


def test_two_nodes_over_loopback_with_replicated_kv_heads(tiny_qwen3: Path) -> None:
    """The multi-node flags on one machine: 4 ranks on 2 "nodes" (2 each; the 2 KV heads are each
    replicated on 2 ranks), node 1 started on its own with --node-rank 1."""
    reference = LLM(str(tiny_qwen3), num_page_override=256, device="cpu")
    expected = reference.generate("w5 w6 w7", SamplingParams(max_tokens=5), use_tqdm=False)[0]["text"]
    reference.shutdown()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
    common = [sys.executable, "-m", "minisgl", "generate", "w5 w6 w7", "--model", str(tiny_qwen3), "--device", "cpu"]
    common += ["--num-pages", "256", "--tp-size", "4", "--nnodes", "2", "--dist-init-addr", addr]
    node1 = subprocess.Popen([*common, "--node-rank", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        node0 = subprocess.run(
            [*common, "--node-rank", "0", "--max-tokens", "5"],
            check=False,
            stdout=subprocess.PIPE,
            text=True,
            timeout=HANG_LIMIT_S,
        )
        assert node0.returncode == 0
        assert node0.stdout.splitlines()[1] == expected
        assert node1.wait(timeout=HANG_LIMIT_S) == 0  # node 0's shutdown ends node 1
    finally:
        node1.kill()
