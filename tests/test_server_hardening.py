"""Careless and hostile input against one real server (a tiny random model), issue #16: every number
and size is validated where it enters, nothing gives a 5xx, and one bad request never disturbs the
requests beside it. The cases of the issue are tests of their own; a hypothesis fuzz test covers the rest."""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import uvicorn
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from test_server import API_KEY, AUTH, Server, _free_port, start_server, stop_server
from tiny_models import VOCAB, build_tiny_model
from transformers import AutoTokenizer

from minisgl.server.args import API_KEY_ENV, add_server_args, api_key_from
from minisgl.server.errors import InternalErrors
from minisgl.server.ipc_dir import PREFIX, remove_stale_ipc_dirs

CHAT, COMPLETIONS, GENERATE, FLUSH = "/v1/chat/completions", "/v1/completions", "/generate", "/flush_cache"
# The tiny model's word-level tokenizer knows "w3" .. "w511"; the template just joins the contents.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
HI = [{"role": "user", "content": "w3 w4 w5"}]
INT64_MAX = 2**63 - 1
TOO_BIG = "Expected `int` <= 9223372036854775807"
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def stale_ipc_dirs() -> Iterator[tuple[Path, Path]]:
    """A directory of a front end that died (its pid is gone) and one of a live process (ours)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    root = Path(tempfile.gettempdir())
    stale, live = root / f"{PREFIX}{dead.pid}-test", root / f"{PREFIX}{os.getpid()}-test"
    for d in (stale, live):
        d.mkdir(exist_ok=True)
        (d / "to_scheduler").write_text("")
    yield stale, live
    for d in (stale, live):
        if d.exists():
            (d / "to_scheduler").unlink()
            d.rmdir()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, stale_ipc_dirs: tuple[Path, Path]) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("hardening")
    folder = build_tiny_model("llama", root / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(folder))
    key_file = root / "api-key"
    key_file.write_text(API_KEY + "\n")
    srv = start_server(root, "--model", str(folder), key_flags=("--api-key-file", str(key_file)))
    yield srv
    assert stop_server(srv) == 0, srv.log.read_text()[-3000:]


def post(server: Server, path: str, body: Any) -> httpx.Response:
    """``body``: bytes are sent as they are, anything else as JSON (Python's ints have no size limit)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return server.post(path, content=raw, headers={**AUTH, "Content-Type": "application/json"})


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def aborted_requests(server: Server) -> float:
    families = text_string_to_metric_families(server.get("/metrics").text)
    return sum(s.value for f in families if f.name == "minisgl_requests" for s in f.samples
               if s.name == "minisgl_requests_total" and s.labels["finish_reason"] == "abort")  # fmt: skip


# -- start-up ------------------------------------------------------------------------------------
def test_stale_ipc_dirs_are_removed_at_start(server: Server, stale_ipc_dirs: tuple[Path, Path]) -> None:
    stale, live = stale_ipc_dirs
    assert not stale.exists()  # its pid is dead: removed when the server started
    assert live.exists()  # a live process's directory is left alone
    own = list(Path(tempfile.gettempdir()).glob(f"{PREFIX}{server.proc.pid}-*"))
    assert len(own) == 1 and own[0].is_dir()  # the server's own, named after its pid
    assert own[0] not in remove_stale_ipc_dirs()  # a live front end's directory stays
    assert own[0].is_dir()


def test_a_model_that_fails_to_load_ends_the_start_with_its_cause(tmp_path: Path) -> None:
    """The scheduler process dies while loading: the server exits (no hang), says so, and leaves no
    ipc directory behind."""
    folder = build_tiny_model("llama", tmp_path / "tiny")
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    command = [sys.executable, "-m", "minisgl", "serve", "--port", str(_free_port()), "--model", str(folder)]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode != 0
    assert "the scheduler process exited with code 1 while starting" in stderr, stderr[-3000:]
    assert not list(Path(tempfile.gettempdir()).glob(f"{PREFIX}{proc.pid}-*"))


def test_api_key_from_a_file(server: Server) -> None:
    assert httpx.post(server.url + CHAT, json={"messages": HI}).status_code == 401
    assert server.get("/v1/models").status_code == 200


def test_api_key_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert api_key_from(parser.parse_args([])) is None
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert api_key_from(parser.parse_args([])) == "from-env"
    key_file = tmp_path / "key"
    key_file.write_text("  from-file\n")
    assert api_key_from(parser.parse_args(["--api-key-file", str(key_file)])) == "from-file"
    assert api_key_from(parser.parse_args(["--api-key", "from-flag"])) == "from-flag"
    key_file.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        api_key_from(parser.parse_args(["--api-key-file", str(key_file)]))
    with pytest.raises(ValueError, match="cannot read --api-key-file"):
        api_key_from(parser.parse_args(["--api-key-file", str(tmp_path / "missing")]))
    with pytest.raises(SystemExit):  # one source on the command line at most
        parser.parse_args(["--api-key", "a", "--api-key-file", str(key_file)])


# -- the cases of the issue ----------------------------------------------------------------------
TINY_TEMPERATURE_CASES = [
    (CHAT, {"messages": HI, "max_tokens": 8, "ignore_eos": True}, lambda r: r["choices"][0]["message"]["content"]),
    (COMPLETIONS, {"prompt": "w3 w4", "max_tokens": 8, "ignore_eos": True}, lambda r: r["choices"][0]["text"]),
    (GENERATE, {"text": "w3 w4", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}, lambda r: r["output_ids"]),
]  # fmt: skip


@pytest.mark.parametrize("path,body,output", TINY_TEMPERATURE_CASES, ids=["chat", "completions", "generate"])
@pytest.mark.parametrize("temperature", [1e-38, 1e-6, 5e-324])
def test_temperature_near_zero_is_greedy(server: Server, path: str, body: Any, output: Any, temperature: float) -> None:
    def with_temperature(t: float) -> dict[str, Any]:
        if path == GENERATE:
            return {**body, "sampling_params": {**body["sampling_params"], "temperature": t}}
        return {**body, "temperature": t}

    greedy = post(server, path, with_temperature(0.0))
    tiny = post(server, path, with_temperature(temperature))
    assert greedy.status_code == 200 and tiny.status_code == 200, tiny.text
    assert output(tiny.json()) == output(greedy.json())
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


ISSUE_CASES: list[tuple[str, str, Any, str, str | None]] = [
    # (case, endpoint, body (bytes are sent raw), part of the message, param); all get 400.
    ("token id 2^70", COMPLETIONS, {"prompt": [5, 2**70]}, TOO_BIG, "prompt[1]"),
    ("token id 2^70 native", GENERATE, {"input_ids": [2**70]}, TOO_BIG, "input_ids[0]"),
    ("token id in int64 but not in the vocabulary", COMPLETIONS, {"prompt": [INT64_MAX]},
     f"prompt token ids must be integers in [0, {VOCAB})", None),
    ("stop token id 2^70", COMPLETIONS, {"prompt": "w3", "stop_token_ids": [2**70]}, TOO_BIG, "stop_token_ids[0]"),
    ("max_tokens 2^64", CHAT, {"messages": HI, "max_tokens": 2**64}, TOO_BIG, "max_tokens"),
    ("max_tokens int64 max", CHAT, {"messages": HI, "max_tokens": INT64_MAX}, "exceeds the context of 1024 tokens", None),
    ("max_new_tokens 2^64", GENERATE, {"text": "w3", "sampling_params": {"max_new_tokens": 2**64}}, TOO_BIG,
     "sampling_params.max_new_tokens"),
    ("max_completion_tokens -2^64", CHAT, {"messages": HI, "max_completion_tokens": -(2**64)},
     "Expected `int` >= -9223372036854775808", "max_completion_tokens"),
    ("seed 2^64", COMPLETIONS, {"prompt": "w3", "seed": 2**64}, TOO_BIG, "seed"),
    ("seed overflow with n", COMPLETIONS, {"prompt": "w3", "seed": INT64_MAX, "n": 2, "temperature": 1},
     ("seed must be an integer in [-9223372036854775808, 9223372036854775807], got 9223372036854775808 "
      "(sample 1 of n=2 uses seed + 1)"), "seed"),
    ("n 2^70", CHAT, {"messages": HI, "n": 2**70}, TOO_BIG, "n"),
    ("top_k 2^70", CHAT, {"messages": HI, "top_k": 2**70}, TOO_BIG, "top_k"),
    ("top_k beyond the vocabulary", CHAT, {"messages": HI, "top_k": VOCAB + 1}, f"top_k must be -1 or in [1, {VOCAB}]",
     "top_k"),
    ("temperature 1e400", CHAT, b'{"messages": [{"role": "user", "content": "w3"}], "temperature": 1e400}',
     "Number out of range", "temperature"),
    ("temperature NaN", CHAT, b'{"messages": [{"role": "user", "content": "w3"}], "temperature": NaN}',
     "invalid JSON", None),
    ("top_p -Infinity", GENERATE, b'{"text": "w3", "sampling_params": {"top_p": -Infinity}}', "invalid JSON", None),
    ("1000-deep JSON in a known field", CHAT, f'{{"messages": {nested(1000)}}}'.encode(),
     "JSON nested 1001 levels deep; the limit is 64", None),
    ("1000-deep JSON in an unknown field", CHAT, f'{{"messages": [], "extra": {nested(1000)}}}'.encode(),
     "JSON nested 1001 levels deep; the limit is 64", None),
    ("1000-deep JSON, native", GENERATE, f'{{"text": "w3", "x": {{"y": {nested(999)}}}}}'.encode(),
     "JSON nested 1001 levels deep", None),
    ("1000-deep JSON alone", COMPLETIONS, nested(1000).encode(), "JSON nested 1000 levels deep", None),
    ("17 stop strings", COMPLETIONS, {"prompt": "w3", "stop": ["x"] * 17}, "stop may hold at most 16 strings, got 17",
     "stop"),
    ("a stop string of 257 characters", CHAT, {"messages": HI, "stop": "x" * 257}, "at most 256 characters", "stop"),
    ("65 stop token ids", GENERATE, {"text": "w3", "sampling_params": {"stop_token_ids": [3] * 65}},
     "stop_token_ids may hold at most 64 ids, got 65", "stop_token_ids"),
    ("1025 messages", CHAT, {"messages": HI * 1025}, "Expected `array` of length <= 1024", "messages"),
    ("33 prompts", COMPLETIONS, {"prompt": ["w3"] * 33}, "at most 32 prompts per request, got 33", "prompt"),
]  # fmt: skip


@pytest.mark.parametrize("case,path,body,message,param", ISSUE_CASES, ids=[c[0] for c in ISSUE_CASES])
def test_issue_case_gets_400(server: Server, case: str, path: str, body: Any, message: str, param: str | None) -> None:
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert message in error["message"], error
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def poll_health_while(server: Server, work: threading.Thread) -> list[int]:
    """Status codes of /health polled until ``work`` ends (each poll with a timeout, no timing claim)."""
    statuses = []
    with httpx.Client(timeout=30) as client:
        while work.is_alive() or not statuses:
            statuses.append(client.get(server.url + "/health").status_code)
    return statuses


def test_100k_stop_strings_get_400_and_health_stays_responsive(server: Server) -> None:
    result: dict[str, httpx.Response] = {}
    body = {"messages": HI, "stop": [f"s{i}" for i in range(100_000)]}
    work = threading.Thread(target=lambda: result.setdefault("r", post(server, CHAT, body)))
    work.start()
    statuses = poll_health_while(server, work)
    work.join()
    assert result["r"].status_code == 400
    assert result["r"].json()["error"]["message"] == "stop may hold at most 16 strings, got 100000"
    assert set(statuses) == {200}


def test_the_most_stop_strings_allowed_do_not_stall_health(server: Server) -> None:
    # 16 stop strings of 256 characters that never match: the stop check runs on every token.
    stop = [(f"q{i}" * 100)[:256] for i in range(10, 26)]
    body = {"text": "w3 w4", "stream": True, "sampling_params": {"max_new_tokens": 200, "ignore_eos": True,
                                                                 "temperature": 0, "stop": stop}}  # fmt: skip
    result: dict[str, Any] = {}

    def stream() -> None:
        with httpx.stream("POST", server.url + GENERATE, json=body, headers=AUTH, timeout=TIMEOUT_S) as r:
            result["status"] = r.status_code
            result["events"] = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]

    work = threading.Thread(target=stream)
    work.start()
    statuses = poll_health_while(server, work)
    work.join()
    assert set(statuses) == {200}
    assert result["status"] == 200, result["events"]
    assert result["events"][-1] == "[DONE]"
    last = json.loads(result["events"][-2])
    assert last["meta_info"]["finish_reason"] == {"type": "length"} and len(last["output_ids"]) == 200


def test_abort_counter_counts_only_admitted_requests(server: Server) -> None:
    before = aborted_requests(server)
    # Every sample is rejected (the context is 1024 tokens): none was admitted, none was aborted.
    r = post(server, COMPLETIONS, {"prompt": "w3", "n": 4, "max_tokens": 2000, "temperature": 1, "seed": 1})
    assert r.status_code == 400 and "exceeds the context" in r.json()["error"]["message"]
    server.wait_idle()
    assert aborted_requests(server) == before


# -- unexpected errors ---------------------------------------------------------------------------
def test_an_unexpected_error_is_a_500_body_and_the_connection_stays(caplog: pytest.LogCaptureFixture) -> None:
    app = FastAPI()
    app.add_middleware(InternalErrors)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    @app.get("/ok")
    async def ok() -> dict[str, str]:
        return {"status": "ok"}

    port = _free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run)
    thread.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while not uv.started:
            threading.Event().wait(0.05)
        with caplog.at_level(logging.ERROR, logger="minisgl.server"):
            conn.request("GET", "/boom")
            r = conn.getresponse()
            body = json.loads(r.read())
        sock = conn.sock
        assert r.status == 500 and r.getheader("connection") != "close"
        error = body["error"]
        assert error["type"] == "server_error" and error["code"] == "internal_error"
        request_id = error["message"].rsplit(" ", 1)[1]
        assert error["message"] == f"internal error (RuntimeError); request id {request_id}"
        assert any(request_id in rec.getMessage() and rec.exc_info for rec in caplog.records)
        conn.request("GET", "/ok")  # the same keep-alive connection
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}
        assert conn.sock is sock
        conn.close()
    finally:
        uv.should_exit = True
        thread.join(30)


# -- fuzz ----------------------------------------------------------------------------------------
INTERESTING_INTS = [0, 1, -1, 2, VOCAB, 2**31, 2**53 + 1, INT64_MAX, 2**63, -(2**63), -(2**63) - 1, 2**64, 2**70, 10**40]
INTERESTING_FLOATS = [0.0, -0.0, 1e-38, 5e-324, 1e-5, 9.99e-6, 0.5, 1.0, 1.5, 100.0, 100.0001, 1e308, -1e308]
ints = st.one_of(st.integers(-3, 40), st.sampled_from(INTERESTING_INTS), st.integers(-(2**80), 2**80))
floats = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(INTERESTING_FLOATS))
strings = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "w3 w4", "w9999", "\x00", "\ud800", "\U0001f4a5" * 3, "user", "system", "x" * 5000]),
)
keys = st.one_of(st.text(max_size=8), st.sampled_from(["role", "content", "type", "text", "include_usage"]))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), ints, floats, strings),
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(keys, inner, max_size=5)),
    max_leaves=20,
)
numbers = st.one_of(ints, floats)
token_lists = st.one_of(st.lists(ints, max_size=8), st.builds(lambda n, t: [t] * n, st.integers(0, 5000), ints))
short_strings = st.text(max_size=4)
string_lists = st.one_of(
    st.lists(strings, max_size=20), st.builds(lambda n, t: [t] * n, st.integers(0, 5000), short_strings)
)
content_parts = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": strings}))
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "robot"]), "content": strings | content_parts},
    optional={"reasoning_content": strings},
)
# What each field is fuzzed with: values of its own type, extreme ones included (and, now and then, anything).
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    **dict.fromkeys(["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty"], numbers),
    **dict.fromkeys(["top_k", "seed", "max_tokens", "max_completion_tokens", "max_new_tokens", "n", "best_of"], numbers),
    **dict.fromkeys(["ignore_eos", "stream", "echo"], st.booleans()),
    **dict.fromkeys(["text", "model", "cache_salt", "suffix"], strings),
    **dict.fromkeys(["logprobs", "top_logprobs", "top_logprobs_num", "logprob_start_len"], st.one_of(st.booleans(), ints)),
    "return_logprob": st.booleans(),
    "stop": st.one_of(strings, string_lists),
    "stop_token_ids": token_lists,
    "input_ids": token_lists,
    "prompt": st.one_of(strings, token_lists, string_lists, st.lists(token_lists, max_size=4)),
    "messages": st.one_of(st.lists(message, max_size=5), st.builds(lambda n: HI * n, st.integers(0, 3000))),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "logit_bias": st.dictionaries(strings, numbers, max_size=3),
    "tools": st.lists(json_values, max_size=3),
    "chat_template_kwargs": st.dictionaries(
        strings | st.sampled_from(["tokenize", "chat_template", "messages", "enable_thinking"]), json_values, max_size=3
    ),
    "unknown": json_values,
}
SAMPLING_FIELDS = ["temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos"]
OPENAI_FIELDS = [*SAMPLING_FIELDS, "model", "stream", "stream_options", "max_tokens", "n", "cache_salt", "logprobs",
                 "presence_penalty", "frequency_penalty", "logit_bias", "unknown"]  # fmt: skip
BASES: dict[str, tuple[dict[str, Any], list[str]]] = {
    CHAT: (
        {"messages": HI, "max_tokens": 4},
        [*OPENAI_FIELDS, "messages", "max_completion_tokens", "tools", "top_logprobs", "chat_template_kwargs"],
    ),
    COMPLETIONS: ({"prompt": "w3 w4", "max_tokens": 4}, [*OPENAI_FIELDS, "prompt", "echo", "suffix", "best_of"]),
    GENERATE: (
        {"text": "w3 w4", "sampling_params": {"max_new_tokens": 4}},
        ["text", "input_ids", "stream", "return_logprob", "top_logprobs_num", "logprob_start_len", "unknown"],
    ),
}


@st.composite
def fields(draw: st.DrawFn, names: list[str]) -> dict[str, Any]:
    chosen = draw(st.lists(st.sampled_from(names), max_size=3, unique=True))
    return {name: draw(st.one_of(FIELDS[name], FIELDS[name], FIELDS[name], json_values)) for name in chosen}


@st.composite
def near_valid_body(draw: st.DrawFn, path: str) -> dict[str, Any]:
    """A well-formed body with a few fields set to extreme values of their type, or to anything."""
    base, names = BASES[path]
    body = {**base, **draw(fields(names))}
    if path == GENERATE and draw(st.booleans()):
        body["sampling_params"] = {**base["sampling_params"], **draw(fields([*SAMPLING_FIELDS, "max_new_tokens"]))}
    return body


raw_bodies = st.one_of(
    st.binary(max_size=40),
    st.integers(1, 5000).map(lambda d: f'{{"messages": [{{"role": "user", "content": {nested(d)}}}]}}'.encode()),
    st.sampled_from([b"", b"null", b"[]", b"{", b'{"messages": NaN}', b'{"prompt": Infinity}', b'{"text": 1e999}',
                     b'{"prompt": "w3", "max_tokens": 1e400}', b'{"text": "\\ud800"}', b'{"text": "w3"']),
)  # fmt: skip


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, Any]:
    path = draw(st.sampled_from([CHAT, COMPLETIONS, GENERATE] * 4 + [FLUSH]))
    if path == FLUSH:
        return path, draw(json_values)
    body = draw(st.one_of(near_valid_body(path), near_valid_body(path), near_valid_body(path), json_values, raw_bodies))
    return path, body


def test_fuzzed_bodies_never_give_5xx(server: Server) -> None:
    scheduler_pid = server.debug_kv()["scheduler_pid"]
    steady = {"messages": HI, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stream": True}

    def stream_steady() -> str:
        with httpx.stream("POST", server.url + CHAT, json=steady, headers=AUTH, timeout=TIMEOUT_S) as r:
            assert r.status_code == 200
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return "".join(c["delta"].get("content", "") for e in events[:-1] for c in json.loads(e)["choices"])

    reference = stream_steady()
    done, outputs, failures = threading.Event(), [], []

    def beside() -> None:
        while not done.is_set():
            try:
                outputs.append(stream_steady())
            except (httpx.HTTPError, AssertionError, ValueError) as e:  # reported below, in the test's thread
                failures.append(repr(e))
                return

    @settings(max_examples=250, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(request=requests())
    def fuzz(request: tuple[str, Any]) -> None:
        path, body = request
        r = post(server, path, body)
        assert r.status_code < 500, (path, r.status_code, r.text[:500])
        if r.status_code >= 400:
            assert isinstance(r.json()["error"]["message"], str)
        elif r.headers["content-type"].startswith("text/event-stream"):
            events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]" and not any('"error"' in e for e in events[:-1]), events[-3:]
        else:
            msgspec.json.decode(r.content)

    thread = threading.Thread(target=beside)
    thread.start()
    try:
        fuzz()
    finally:
        done.set()
        thread.join(TIMEOUT_S)
    assert not failures, failures
    assert outputs and all(o == reference for o in outputs), (reference, outputs)
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert server.debug_kv()["scheduler_pid"] == scheduler_pid
    server.assert_idle_balanced()
