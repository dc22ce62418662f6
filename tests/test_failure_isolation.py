"""An error that belongs to one request fails that request alone (issue #16): its client is told what
went wrong, its KV goes back, and the requests beside it finish with their normal outputs.

The fault (``fault_injection``) is injected into the sampling of one request, or into its grammar
(its mask, or a grammar that rejects the sampled token)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import assert_idle_balanced
from fault_injection import FAIL_AT_CALL, FAULT, FAULTY_SEED, faulty
from test_server import AUTH, Server, start_server, stop_server
from tiny_models import build_tiny_model

import minisgl.sampler
from minisgl import LLM, SamplingParams
from minisgl.request import Req

TESTS = Path(__file__).parent
PROMPTS = [[5, 6, 7, 8], [100, 200, 300], [42] * 20]


def params(seed: int | None) -> SamplingParams:
    return SamplingParams(max_tokens=12, temperature=1.0 if seed is not None else 0.0, seed=seed, ignore_eos=True)


def test_a_failing_sampler_fails_only_its_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = LLM(str(build_tiny_model("llama", tmp_path / "m")), num_page_override=1024, max_seq_len_override=256)
    batch = [params(1), params(FAULTY_SEED), params(None)]
    normal = llm.generate(PROMPTS, batch, use_tqdm=False)
    assert [o["meta"]["finish_reason"] for o in normal] == ["length"] * 3
    monkeypatch.setattr(minisgl.sampler, "probabilities", faulty(minisgl.sampler.probabilities))
    llm.flush_cache()
    outs = llm.generate(PROMPTS, batch, use_tqdm=False)
    assert outs[1]["meta"]["finish_reason"] == "error"
    assert outs[1]["meta"]["error"] == f"sampling failed: {FAULT}"
    assert outs[1]["token_ids"] == normal[1]["token_ids"][: FAIL_AT_CALL - 1]  # it ran until the fault
    for i in (0, 2):
        assert outs[i]["token_ids"] == normal[i]["token_ids"] and outs[i]["meta"]["error"] is None
    assert_idle_balanced(llm)
    assert llm.generate([PROMPTS[0]], params(1), use_tqdm=False)[0]["token_ids"] == normal[0]["token_ids"]
    llm.shutdown()



def grammar_params(seed: int) -> SamplingParams:
    # The tiny model's tokens are the words w3..w511 (no spaces): the output is 3 to 6 of w5 / w6 / w7.
    return SamplingParams(max_tokens=12, temperature=1.0, seed=seed, regex=r"(w5|w6|w7){3,6}")


def run_grammar_batch(llm: LLM, break_one: Callable[[Req], None] | None = None) -> list[Req]:
    """Two constrained requests and a greedy one in one batch; ``break_one`` sabotages the second."""
    sched = llm.scheduler
    batch = [grammar_params(1), grammar_params(2), params(None)]
    reqs = [sched.make_request(i, ids, p) for i, (ids, p) in enumerate(zip(PROMPTS, batch))]
    if break_one is not None:
        break_one(reqs[1])
    for req in reqs:
        sched.add(req)
    while sched.has_work:
        sched.step()
    return reqs


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLM]:
    folder = build_tiny_model("llama", tmp_path_factory.mktemp("grammar") / "m")
    llm = LLM(str(folder), num_page_override=1024, max_seq_len_override=256)
    yield llm
    llm.shutdown()


def injected_fault(*_: object) -> None:
    raise RuntimeError("injected fault")


def test_a_failing_grammar_mask_fails_only_its_request(tiny_llm: LLM) -> None:
    normal = run_grammar_batch(tiny_llm)
    assert [r.finish_reason for r in normal] == ["stop", "stop", "length"]
    tiny_llm.flush_cache()
    reqs = run_grammar_batch(tiny_llm, lambda req: setattr(req.grammar, "fill_bitmask", injected_fault))
    assert reqs[1].finish_reason == "error" and reqs[1].error == f"grammar failed: {FAULT}"
    assert reqs[1].output_ids == []  # its first mask failed: nothing was sampled for it
    for i in (0, 2):
        assert reqs[i].finish_reason == normal[i].finish_reason and reqs[i].error is None
        assert reqs[i].output_ids == normal[i].output_ids
    assert_idle_balanced(tiny_llm)


def test_a_grammar_the_vocabulary_cannot_write_fails_only_its_request_saying_so(tiny_llm: LLM) -> None:
    # The words w3..w511 start "w5x" but none writes its "x": after w5 the grammar allows no token.
    normal = tiny_llm.generate([PROMPTS[0]], grammar_params(1), use_tqdm=False)[0]
    outs = tiny_llm.generate(PROMPTS[:2], [grammar_params(1), SamplingParams(regex="w5x", max_tokens=5)], use_tqdm=False)
    assert outs[0]["token_ids"] == normal["token_ids"] and outs[0]["meta"]["error"] is None
    assert outs[1]["meta"]["finish_reason"] == "error" and outs[1]["text"] == "w5"
    assert "the grammar allows no token of the model's vocabulary here" in outs[1]["meta"]["error"]
    assert_idle_balanced(tiny_llm)


def test_a_token_its_grammar_rejects_fails_only_its_request(tiny_llm: LLM) -> None:
    normal = run_grammar_batch(tiny_llm)
    tiny_llm.flush_cache()
    rejected: list[int] = []

    def reject(token: int) -> bool:
        rejected.append(token)
        return False

    reqs = run_grammar_batch(tiny_llm, lambda req: setattr(req.grammar, "accept", reject))
    assert rejected == [normal[1].output_ids[0]]  # the mask still allowed the normal first token
    assert reqs[1].finish_reason == "error"
    assert reqs[1].error == f"token handling failed: RuntimeError: sampled token {rejected[0]} is outside the request's grammar"
    assert reqs[1].output_ids == []  # the rejected token is not part of the output
    for i in (0, 2):
        assert reqs[i].output_ids == normal[i].output_ids and reqs[i].error is None
    assert_idle_balanced(tiny_llm)
    out = tiny_llm.generate([PROMPTS[1]], grammar_params(2), use_tqdm=False)[0]  # the engine carries on
    assert out["token_ids"] == normal[1].output_ids and out["meta"]["error"] is None

@pytest.fixture(scope="module")
def faulty_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("faulty")
    folder = build_tiny_model("llama", root / "tiny")
    (root / "inject").mkdir()
    (root / "inject" / "sitecustomize.py").write_text("from fault_injection import install\n\ninstall()\n")
    pythonpath = os.pathsep.join([str(root / "inject"), str(TESTS), os.environ.get("PYTHONPATH", "")])
    srv = start_server(root, "--model", str(folder), env={"PYTHONPATH": pythonpath})
    yield srv
    assert stop_server(srv) == 0, srv.log.read_text()[-3000:]


def completion(server: Server, seed: int | None, stream: bool = False) -> httpx.Response:
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 12, "ignore_eos": True, "stream": stream,
            "temperature": 0.0 if seed is None else 1.0, "seed": seed}  # fmt: skip
    return server.post("/v1/completions", json=body)


def test_server_fails_only_the_faulty_request(faulty_server: Server) -> None:
    server = faulty_server
    normal = {seed: completion(server, seed).json()["choices"][0]["text"] for seed in (None, 1)}
    with ThreadPoolExecutor(3) as pool:
        futures = {seed: pool.submit(completion, server, seed) for seed in (None, 1, FAULTY_SEED)}
        results = {seed: f.result() for seed, f in futures.items()}
    failed = results[FAULTY_SEED]
    assert failed.status_code == 500
    error = failed.json()["error"]
    assert error["message"] == f"the request failed: sampling failed: {FAULT}"
    assert error["type"] == "server_error" and error["code"] == "request_failed"
    for seed in (None, 1):
        assert results[seed].status_code == 200
        assert results[seed].json()["choices"][0]["text"] == normal[seed]
    # Streamed, the failure arrives as an error object after the tokens that came before it.
    with httpx.stream("POST", server.url + "/generate", headers=AUTH, timeout=120, json={
        "input_ids": [5, 6, 7], "stream": True,
        "sampling_params": {"max_new_tokens": 12, "seed": FAULTY_SEED, "temperature": 1.0, "ignore_eos": True},
    }) as r:  # fmt: skip
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == {"error": {"message": f"the request failed: sampling failed: {FAULT}",
                                    "type": "server_error", "param": None, "code": "request_failed"}}  # fmt: skip
    assert events[-2]["output_ids"] and "error" not in events[-2]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    server.assert_idle_balanced()
    assert f"failed: sampling failed: {FAULT}" in server.log.read_text()  # the scheduler logged it
