"""An error that belongs to one request fails that request alone (issue #16): its client is told what
went wrong, its KV goes back, and the requests beside it finish with their normal outputs.

The fault (``fault_injection``) is injected into the sampling of one request."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import assert_idle_balanced
from fault_injection import FAIL_AT_CALL, FAULT, FAULTY_SEED, faulty
from test_server import AUTH, Server, start_server, stop_server
from tiny_models import build_tiny_model

import minisgl.sampling
from minisgl import LLM, SamplingParams

TESTS = Path(__file__).parent
PROMPTS = [[5, 6, 7, 8], [100, 200, 300], [42] * 20]


def params(seed: int | None) -> SamplingParams:
    return SamplingParams(max_tokens=12, temperature=1.0 if seed is not None else 0.0, seed=seed, ignore_eos=True)


def test_a_failing_sampler_fails_only_its_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = LLM(str(build_tiny_model("llama", tmp_path / "m")), num_page_override=1024, max_seq_len_override=256)
    batch = [params(1), params(FAULTY_SEED), params(None)]
    normal = llm.generate(PROMPTS, batch, use_tqdm=False)
    assert [o["meta"]["finish_reason"] for o in normal] == ["length"] * 3
    monkeypatch.setattr(minisgl.sampling, "probabilities", faulty(minisgl.sampling.probabilities))
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
