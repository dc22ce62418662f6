"""Smoke test of ``python -m benchmarks`` at tiny sizes: workload generators, the offline and online
runners against real engines, the report and the plots. Checks that results are produced and sane,
never how fast anything was (the CPU is shared)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import assert_idle_balanced, llama_cpp_and_default_gguf
from gguf import GGMLQuantizationType, GGUFReader
from gguf_writer import train_bpe, write_gguf
from tiny_models import VOCAB, build_tiny_model
from transformers import AutoTokenizer

from benchmarks import dense_folder as dense_folder_module
from benchmarks import machine, paired
from benchmarks.cli import main
from benchmarks.corpus import PERSONAS
from benchmarks.hit_rate import best_hit_rate, reusable_tokens
from benchmarks.scale_model import SCALE_MODELS, write_scale_model
from benchmarks.server import server_available
from benchmarks.workloads import COPY_CUE_LEN, WORKLOADS, Conversations, Sizes, Workload, build
from minisgl import LLM, SamplingParams
from minisgl.layers.linear import Linear
from minisgl.layers.quant import Int4Weight
from minisgl.models.gguf_tensors import GGUFTensors

TINY = Sizes(
    groups=2,
    prompts_per_group=3,
    system_len=40,
    question_len=6,
    conversations=2,
    rounds=2,
    chat_system_len=40,
    turn_len=6,
    random_prompts=3,
    random_len=12,
    output_len=3,
    single_prompts=2,
    single_len=8,
    single_output_len=5,
    long_prompts=1,
    long_len=30,
    long_output_len=2,
    copy_prompts=1,
    copy_context_len=20,
    copy_output_len=3,
)
TINY_FLAGS = [f"--{k.replace('_', '-')}={v}" for k, v in vars(TINY).items()]


def play(workload: Workload, output_len: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, output) pairs of a workload, with a fixed fake answer standing in for the model."""
    conversations, sent = Conversations(), []
    for turns in workload.rounds:
        for turn in turns:
            prompt, output = conversations.prompt(turn), [7] * output_len
            conversations.record(turn, prompt, output)
            sent.append((prompt, output))
    return sent


def test_best_hit_rate_counts_shared_prefixes_and_history() -> None:
    assert reusable_tokens([([1, 2, 3, 4], [9, 9]), ([1, 2, 3, 5], [9])]) == (3, 8)
    # A follow-up that resends prompt + answer reuses all but the answer's last (never fed) token.
    assert reusable_tokens([([1, 2], [3, 4]), ([1, 2, 3, 4, 5], [6])]) == (3, 7)
    # Identical prompts: the last token is always computed.
    assert reusable_tokens([([1, 2, 3], [4]), ([1, 2, 3], [4])]) == (2, 6)
    assert best_hit_rate([]) == 0.0


def test_workloads_from_the_real_tokenizer() -> None:
    from minisgl.models.source import resolve_model_path

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(None)))
    except FileNotFoundError as e:
        pytest.skip(str(e))
    sizes = Sizes()
    shared, chat, rand = build(["shared-prefix", "multi-turn", "random"], tokenizer, sizes, seed=0)
    assert shared.num_requests == sizes.groups * sizes.prompts_per_group
    assert {len(t.new_ids) for t in shared.rounds[0]} == {sizes.system_len + sizes.question_len}
    assert any(tokenizer.decode(t.new_ids).startswith(p[:30]) for p in PERSONAS for t in shared.rounds[0])
    assert len(chat.rounds) == sizes.rounds and all(len(r) == sizes.conversations for r in chat.rounds)
    assert rand.num_requests == sizes.random_prompts
    # Shared-prefix: all but the first prompt of each group can reuse the whole system prompt.
    floor = (
        (sizes.prompts_per_group - 1)
        / sizes.prompts_per_group
        * sizes.system_len
        / (sizes.system_len + sizes.question_len)
    )
    assert floor <= best_hit_rate(play(shared, sizes.output_len)) < 1
    assert best_hit_rate(play(chat, sizes.output_len)) > 0.5  # every later round resends its history
    assert best_hit_rate(play(rand, sizes.output_len)) < 0.01
    # Copy: one request at a time, each ending with a run of its context (where the answer picks up).
    [copy] = build(["copy"], tokenizer, sizes, seed=0)
    assert len(copy.rounds) == sizes.copy_prompts and copy.max_concurrency == 1
    for [turn] in copy.rounds:
        context, cue = turn.new_ids[: sizes.copy_context_len], turn.new_ids[-COPY_CUE_LEN:]
        assert any(context[i : i + COPY_CUE_LEN] == cue for i in range(len(context)))
    # Seeded: the same seed gives the same ids, another seed different ones.
    again = build(["shared-prefix"], tokenizer, sizes, seed=0)[0]
    assert again.rounds == shared.rounds
    assert build(["shared-prefix"], tokenizer, sizes, seed=1)[0].rounds != shared.rounds


def test_full_harness_on_a_tiny_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = build_tiny_model("llama", tmp_path / "model")
    out = tmp_path / "out"
    online = "minisgl" if server_available() else "none"
    monkeypatch.setenv("MINISGL_BENCH_CACHE", str(tmp_path / "no-peers"))  # peers never run in the suite
    # One thread: on a shared CPU, multi-threaded torch stalls at every barrier while a thread waits for a core.
    status = main([
        "--model", str(model), "--token-source", "random", "--out", str(out), "--threads", "1",
        "--systems", "minisgl,minisgl-naive,hf,hf-batch,llama.cpp", "--online", online, "--hf-batch-size", "2",
        "--peers", "llama-server,vllm", "--llama-server-parallel", "1,4", *TINY_FLAGS,
    ])  # fmt: skip

    report = json.loads((out / "results.json").read_text())
    assert status == 0, report["skipped"]
    for name in ["results.md", "throughput.png", "hit_rate.png"] + (["ttft.png", "latency.png"] if online != "none" else []):
        assert (out / name).stat().st_size > 0, name
    assert report["machine"]["cores"] >= 1 and report["machine"]["torch"]
    # llama.cpp and llama-server need a GGUF file (the tiny model is a folder); vLLM is not installed in
    # the empty cache folder: each is listed with its reason, and the run goes on.
    reasons = {s["system"]: s["reason"] for s in report["skipped"]}
    assert list(reasons) == ["llama.cpp", "llama-server-np1", "llama-server-np4", "vllm"], reasons
    assert "GGUF" in reasons["llama-server-np4"] and "python -m benchmarks.peers setup" in reasons["vllm"]
    assert "Not run" in (out / "results.md").read_text()

    runs = {(r["mode"], r["system"], r["workload"]): r for r in report["runs"]}
    expected = 4 + (online != "none")
    assert len(runs) == len(WORKLOADS) * expected
    lengths = {"single-stream": TINY.single_output_len, "long-prompt": TINY.long_output_len, "copy": TINY.copy_output_len}
    for r in runs.values():
        output_len = lengths.get(r["workload"], TINY.output_len)
        assert r["output_tokens"] == r["requests"] * output_len
        assert 0.0 <= r["hit_rate"] <= r["best_hit_rate"] <= 1.0, r
        assert r["duration_s"] > 0 and r["output_tokens_per_s"] > 0
        assert 0.0 <= r["agreement"]["identical"] <= 1.0
        assert isinstance(r["others_cpu_s"], float), r  # measured for every row on Linux
    assert runs[("offline", "minisgl", "shared-prefix")]["hit_rate"] > 0.3
    assert runs[("offline", "minisgl", "multi-turn")]["hit_rate"] > 0.3
    for mode, system in [("offline", "minisgl-naive"), ("offline", "hf"), ("offline", "hf-batch")]:
        assert runs[(mode, system, "shared-prefix")]["hit_rate"] == 0.0
    assert runs[("offline", "minisgl", "random")]["best_hit_rate"] < 0.2
    # Greedy fp32: the naive cache and transformers give the reference's tokens exactly.
    for system in ("minisgl-naive", "hf"):
        assert runs[("offline", system, "shared-prefix")]["agreement"]["identical"] == 1.0, system

    if online != "none":
        served = runs[("online", "minisgl", "shared-prefix")]
        assert served["hit_rate"] > 0.3
        # Each session resends its history (prompt and answer as text) on its next turn.
        assert runs[("online", "minisgl", "multi-turn")]["hit_rate"] > 0.3
        # Single-stream sends one request at a time: their end-to-end times add up to at most the wall time.
        single = runs[("online", "minisgl", "single-stream")]
        assert single["latency"]["e2e_s"]["mean"] * single["requests"] <= single["duration_s"]
        for key in ("ttft_s", "e2e_s"):
            assert served["latency"][key]["p50"] > 0, key
        assert len(served["ttft_s"]) == served["requests"] and all(t > 0 for t in served["ttft_s"])
        assert served["latency"]["e2e_s"]["p99"] >= served["latency"]["ttft_s"]["p50"]
        # The server's /metrics counters saw the same prompt tokens the responses reported.
        assert served["extra"]["metrics_delta"]["prompt_tokens"] == served["prompt_tokens"]
        # Each server row says how long it took to be ready and its processes' peak memory.
        assert served["extra"]["ready_s"] > 0 and served["extra"]["server_peak_rss_bytes"] > 0
        assert "peak memory (GiB)" in (out / "results.md").read_text()
        long = runs[("online", "minisgl", "long-prompt")]
        assert long["prompt_tokens"] == TINY.long_prompts * TINY.long_len


def test_paired_ratios_alternate_the_order_and_compare_within_a_round() -> None:
    assert paired.order(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert paired.order(["a", "b", "c"], 1) == ["c", "b", "a"]
    walls = {("a", "w", 0): 2.0, ("b", "w", 0): 4.0, ("a", "w", 1): 6.0, ("b", "w", 1): 3.0}
    assert paired.speed_ratios(walls, ["a", "b"], "w", 2) == {"a": [1.0, 1.0], "b": [0.5, 2.0]}
    table = paired.report(walls, {key: 0.0 for key in walls}, ["a", "b"], ["w"], 2)
    assert table[-1] == "| w | b | 4.00 / 3.00 | 0.50 / 2.00 | **1.25** | 0.50-2.00 | 0.0 |"
    assert [paired.seconds(x) for x in (12.345, 0.1, 0.0041)] == ["12.35", "0.10", "0.0041"]  # a tiny run is not 0.00


@pytest.mark.parametrize(
    "readings, longest_s, waited_s",
    [([0.25, 0.05, 0.001], 10.0, 0.75), ([None], 10.0, 0.25), ([0.25] * 9, 1.0, 1.0)],
    ids=["a core, a fifth, then quiet", "nothing to read", "never quiet"],
)
def test_the_wait_for_a_quiet_machine_lasts_while_others_keep_a_core_busy(
    monkeypatch: pytest.MonkeyPatch, readings: list[float | None], longest_s: float, waited_s: float
) -> None:
    """The others' CPU seconds in each 0.25 s window, read in turn: the wait ends after the first window
    under 5% of a core, after the first where nothing can be read, and at ``longest_s`` at the latest."""
    clock = [0.0]
    monkeypatch.setattr(machine.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(machine.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    used = iter(readings)
    monkeypatch.setattr(machine.OtherLoad, "used_s", lambda self: next(used))
    assert machine.wait_for_quiet(longest_s=longest_s) == pytest.approx(waited_s)


@pytest.mark.skipif(not server_available(), reason="this checkout has no minisgl/server")
def test_paired_runs_offline_and_two_servers_up_at_once_on_a_tiny_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its waits for a quiet machine (up to 5 minutes once all are up) are for figures: this test checks the
    # table, and took 8 minutes while other work ran on the machine.
    monkeypatch.setattr(paired, "wait_for_quiet", lambda longest_s=0.0: 0.0)
    model = build_tiny_model("llama", tmp_path / "model")
    out = tmp_path / "paired.md"
    status = paired.main([
        "--model", str(model), "--token-source", "random", "--threads", "1", "--repeats", "2",
        "--systems", "offline:minisgl-nospec,minisgl-nospec", "--workloads", "random,single-stream",
        "--serve", "per-token=--speculative-algorithm none --stream-interval-ms 0", "--out", str(out), *TINY_FLAGS,
    ])  # fmt: skip
    assert status == 0
    text = out.read_text()
    assert "- per-token: minisgl server, --speculative-algorithm none --stream-interval-ms 0" in text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith(("| random", "| single-stream"))]
    systems = ["offline:minisgl-nospec", "minisgl-nospec", "per-token"]
    assert [(r[0], r[1]) for r in rows] == [(f"| {w}", s) for w in ("random", "single-stream") for s in systems]
    for row in rows:
        walls = [float(x) for x in row[2].split(" / ")]
        assert len(walls) == 2 and all(w > 0 for w in walls)
    assert rows[0][3] == "1.00 / 1.00"  # the baseline against itself


def test_llamacpp_reuses_the_previous_prompt_only() -> None:
    gguf = llama_cpp_and_default_gguf()
    from benchmarks.systems.llamacpp import generate_in_child
    shared = list(range(1000, 1040))
    a, b, c = shared + [5, 6], shared + [7, 8], [9] + shared
    # In a child process: a llama.cpp that faults on this CPU fails this test with its signal, not the run.
    first_round, after_reset = generate_in_child(gguf, [[a, b, c], [a]], output_len=4, threads=1)
    assert [len(x.output_ids) for x in first_round + after_reset] == [4, 4, 4, 4]
    assert [x.cached_tokens for x in first_round] == [0, len(shared), 0]
    assert after_reset[0].cached_tokens == 0


def test_moe_decode_counts_the_experts_a_step_reads(tmp_path: Path) -> None:
    from benchmarks.moe_decode import measure

    folder = build_tiny_model("qwen3_moe", tmp_path / "moe")  # 8 experts, top-2
    one, many = measure(folder, 1, prompt_len=12, output_len=4), measure(folder, 6, prompt_len=12, output_len=4)
    assert one["tok_s"] > 0 and many["tok_s"] > 0
    assert one["active_params"] == many["active_params"]
    # One token reads its top-2 experts per MoE layer: exactly its active parameters.
    assert one["bytes_per_step"] == pytest.approx(one["active_params"] * 4)
    # Six tokens reach more distinct experts, so a step reads more than one token's worth.
    assert many["bytes_per_step"] > one["bytes_per_step"]


@pytest.fixture(scope="module")
def small_vocab_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GGUF with a 512-token vocabulary, for scale models whose tokenizer is quick to read."""
    folder = build_tiny_model("llama", tmp_path_factory.mktemp("vocab"))
    train_bpe("llama-bpe", VOCAB - 100).save_pretrained(folder)  # GGUF pads the vocabulary to 512
    return write_gguf(folder, folder / "vocab.gguf", "llama-bpe")


def test_dense_folder_of_a_large_model_is_sharded_and_loads_as_the_files_values(
    small_vocab_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder the folder-only peers load, written in shards of at most ``shard_bytes`` (one shard's
    values in memory at a time) with Hugging Face's index: transformers loads every tensor as the file's
    dequantized values, the q/k rows in its own order, the untied LM head too."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(dense_folder_module, "CACHE", tmp_path / "dense")
    shape = replace(SCALE_MODELS["scale-7b"].shape, hidden=64, layers=2, ffn=128, heads=4, kv_heads=2, head_dim=16)
    gguf = write_scale_model(shape, tmp_path / "tiny.gguf", tokenizer_from=small_vocab_gguf)
    folder = dense_folder_module.dense_folder(gguf, shard_bytes=200_000)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 2 and set(index["weight_map"].values()) == {f.name for f in shards}
    tensors = GGUFTensors(gguf)
    assert sorted(index["weight_map"]) == sorted(tensors.names())
    for shard in shards:
        names = [name for name, file in index["weight_map"].items() if file == shard.name]
        assert len(names) == 1 or sum(math.prod(tensors.shape(n)) * 4 for n in names) <= 200_000
    state = AutoModelForCausalLM.from_pretrained(str(folder)).state_dict()
    assert "lm_head.weight" in index["weight_map"]
    for name in tensors.names():
        assert torch.equal(state[name], tensors.dense(name)), name


@pytest.mark.parametrize("name", sorted(SCALE_MODELS))
def test_scale_model_shape_loads_quantized_and_decodes_in_one_call(
    name: str, small_vocab_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny model with each scale model's layers (its architecture, biases, head norms, LM head, metadata):
    minisgl runs every projection on the file's own int4 codes, a decode step reads exactly the
    file's Q4_1 bytes plus the LM head, and each decode step is one C call (decode_layer.c)."""
    from benchmarks.decode_per_byte import measure
    from benchmarks.roofline import weight_bytes_per_step

    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    shape = SCALE_MODELS[name].shape
    # Heads of 32 where the file states head_dim (q has 128 rows for a hidden size of 64), else hidden / heads.
    head_dim = 32 if shape.states_head_dim else 16
    tiny = replace(shape, hidden=64, layers=2, ffn=128, heads=4, kv_heads=2, head_dim=head_dim)
    path = write_scale_model(tiny, tmp_path / f"{name}.gguf", tokenizer_from=small_vocab_gguf)
    written = path.stat().st_mtime_ns
    assert write_scale_model(tiny, path, tokenizer_from=small_vocab_gguf) == path
    assert path.stat().st_mtime_ns == written  # reused, not written again
    q4_bytes = sum(int(t.n_bytes) for t in GGUFReader(path).tensors if t.tensor_type == GGMLQuantizationType.Q4_1)
    assert q4_bytes > 0
    llm = LLM(str(path), num_page_override=256)
    try:
        model = llm.scheduler.engine.model
        layers = model.model.layers
        assert model.config.head_dim == tiny.head_dim and model.config.vocab_size == VOCAB
        assert model.config.tie_word_embeddings == tiny.tied
        linears = [m for m in layers.modules() if isinstance(m, Linear)]
        assert linears and all(m.weight is None and isinstance(m.quantized, Int4Weight) for m in linears)
        assert all(p.dim() == 1 for p in layers.parameters())  # norms and biases only: no dense matrix is alive
        attn = layers[0].self_attn
        assert (attn.qkv_proj.bias is not None) == tiny.qkv_bias and (attn.q_norm is not None) == tiny.qk_norm
        lm_head = model.lm_head.quantized
        assert lm_head is not None
        head_bytes = sum(b.numel() * b.element_size() for b in lm_head.buffers())
        assert weight_bytes_per_step(llm, rows=1) == q4_bytes + head_bytes
        params = SamplingParams(max_tokens=4, ignore_eos=True)
        outputs = llm.generate([[5, 9, 200, 17], [7, 81]], params, use_tqdm=False)
        assert [len(o["token_ids"]) for o in outputs] == [4, 4]
        assert_idle_balanced(llm)
        if llm.scheduler.engine.kernels is None:
            pytest.skip("the C kernels do not build here: no single-call decode step")
    finally:
        llm.shutdown()
    result = measure(str(path), "auto", prompt_len=8, output_len=4)
    assert result["single_call"], result
    assert result["weight_bytes"] == q4_bytes + head_bytes and result["kv_bytes"] > 0
    assert result["tok_s"] > 0 and result["weight_gbps"] > 0
