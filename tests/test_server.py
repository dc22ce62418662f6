"""The HTTP server end to end: a real ``python -m minisgl serve`` process on a free local port.

One server is shared by the module (started once, stopped at the end); the fault tests that kill
processes start servers of their own. Greedy outputs are compared with the offline ``LLM``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from minisgl import LLM, SamplingParams
from minisgl.sampling import RejectionCode
from minisgl.server.engine_client import Accepted
from minisgl.server.protocol import Token

API_KEY = "test-key"
MODEL = "SmolLM2-135M-Instruct"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
# 1024 KV slots: a few requests' worth, so 32 concurrent clients must queue for the pool. Dense fp32
# weights, as the offline reference (``smollm``) runs: greedy outputs must then be identical.
SERVER_ARGS = ["--num-pages", "1024", "--max-running-req", "32", "--quantization", "none"]
START_TIMEOUT_S = 300  # two busy cores: model conversion (first run) plus loading can be slow
REQUEST_TIMEOUT_S = 300


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(self.url + path, headers=AUTH, timeout=REQUEST_TIMEOUT_S, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        kw.setdefault("headers", AUTH)
        return httpx.post(self.url + path, timeout=REQUEST_TIMEOUT_S, **kw)

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=API_KEY, max_retries=0, timeout=REQUEST_TIMEOUT_S)

    def debug_kv(self) -> dict[str, Any]:
        return self.get("/debug/kv").json()

    def wait_idle(self, timeout: float = REQUEST_TIMEOUT_S) -> dict[str, Any]:
        """Poll until no request runs or waits (aborts travel asynchronously), then return kv usage."""
        deadline = time.monotonic() + timeout
        while True:
            kv = self.debug_kv()
            if kv["running"] == 0 and kv["waiting"] == 0:
                return kv
            assert time.monotonic() < deadline, f"server did not drain: {kv}"
            time.sleep(0.2)

    def assert_idle_balanced(self) -> None:
        kv = self.wait_idle()
        assert kv["ok"], kv["message"]
        assert kv["in_use"] == 0 and kv["protected"] == 0, kv
        assert kv["free"] + kv["evictable"] == kv["capacity"], kv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (a container's init may never reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _wait_dead(pid: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        assert time.monotonic() < deadline, f"process {pid} is still alive"
        time.sleep(0.1)


def start_server(
    log_dir: Path, *extra: str, key_flags: tuple[str, ...] = ("--api-key", API_KEY), env: dict[str, str] | None = None
) -> Server:
    """``key_flags``: how the server gets API_KEY (a flag, or nothing when ``env`` carries it)."""
    port = _free_port()
    log = log_dir / f"server-{port}.log"
    cmd = [sys.executable, "-m", "minisgl", "serve", "--port", str(port), *key_flags, *SERVER_ARGS, *extra]
    with open(log, "wb") as out:  # the child keeps its own handle
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=None if env is None else {**os.environ, **env}
        )
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode} while starting:\n{log.read_text()}")
        try:
            if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"server did not start in {START_TIMEOUT_S} s:\n{log.read_text()}")
        time.sleep(0.5)


def stop_server(server: Server) -> int:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(60)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(10)
    return server.proc.returncode


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("server"))
    scheduler_pid = srv.debug_kv()["scheduler_pid"]
    yield srv
    assert stop_server(srv) == 0, srv.log.read_text()[-3000:]
    _wait_dead(scheduler_pid)  # no orphan


@pytest.fixture(scope="module")
def offline(smollm: LLM) -> LLM:
    return smollm


def _chat(content: str, system: str | None = None) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]


def _greedy(max_tokens: int, **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)


# -- OpenAI endpoints ----------------------------------------------------------------------------
def test_default_server_runs_the_gguf_quantized(tmp_path: Path) -> None:
    """With quantization=auto (the default) the scheduler process loads the GGUF file itself and
    reads its 4-bit blocks (it once got the converted folder and ran dense weights), and its greedy
    output is the offline engine's with the same weights."""
    srv = start_server(tmp_path, "--quantization", "auto")  # the last flag wins over SERVER_ARGS'
    try:
        body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}
        served = srv.post("/v1/completions", json=body).json()["choices"][0]["text"]
    finally:
        assert stop_server(srv) == 0, srv.log.read_text()[-3000:]
    assert "x int4 (Q4_1, exact codes)" in srv.log.read_text(), srv.log.read_text()[-3000:]
    llm = LLM(num_page_override=1024)
    try:
        assert served == llm.generate("The capital of France is", _greedy(12), use_tqdm=False)[0]["text"]
    finally:
        llm.shutdown()


def test_health_and_models(server: Server) -> None:
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    models = server.openai().models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_matches_offline(server: Server, offline: LLM) -> None:
    messages = _chat("What is the capital of France?")
    ref = offline.chat([messages], _greedy(12), use_tqdm=False)[0]
    client = server.openai()
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    assert out.choices[0].message.content == ref["text"]
    assert out.choices[0].finish_reason == ref["meta"]["finish_reason"]
    assert out.usage is not None
    assert out.usage.prompt_tokens == ref["meta"]["prompt_tokens"]
    assert out.usage.completion_tokens == ref["meta"]["completion_tokens"]

    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=12, temperature=0,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == ref["text"]
    assert finish == ref["meta"]["finish_reason"]
    assert usage is not None and usage.completion_tokens == ref["meta"]["completion_tokens"]
    # The same prompt again: everything but the last prompt token comes from the cache.
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == ref["meta"]["prompt_tokens"] - 1


def test_completions_match_offline(server: Server, offline: LLM) -> None:
    prompts = ["The capital of France is", "def fibonacci(n):"]
    refs = offline.generate(prompts, _greedy(8), use_tqdm=False)
    client = server.openai()
    out = client.completions.create(model=MODEL, prompt=prompts, max_tokens=8, temperature=0)
    assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == [r["text"] for r in refs]
    stream = client.completions.create(model=MODEL, prompt=prompts[1], max_tokens=8, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == refs[1]["text"]


def test_repeated_system_prompt_is_cached(server: Server) -> None:
    system = "You are a terse assistant for a bakery. " * 8
    client = server.openai()
    cached = []
    for question in ("Do you sell bread?", "When do you open?"):
        out = client.chat.completions.create(model=MODEL, messages=_chat(question, system), max_tokens=4, temperature=0)
        assert out.usage is not None and out.usage.prompt_tokens_details is not None
        cached.append(out.usage.prompt_tokens_details.cached_tokens)
    assert cached[1] > 60, cached  # the system prompt (~70 tokens) came from the cache
    # cache_salt keeps tenants apart: another salt sees none of that cache.
    out = client.chat.completions.create(
        model=MODEL, messages=_chat("Do you sell bread?", system), max_tokens=1, temperature=0,
        extra_body={"cache_salt": "tenant-b"},
    )  # fmt: skip
    assert out.usage is not None and out.usage.prompt_tokens_details is not None
    assert out.usage.prompt_tokens_details.cached_tokens == 0


def test_stop_string_streamed_equals_offline(server: Server, offline: LLM) -> None:
    prompt = "List the first ten prime numbers:"
    full = offline.generate([prompt], _greedy(16), use_tqdm=False)[0]["text"]
    stop = full.strip().split()[2]  # a word from the middle of the greedy answer
    ref = offline.generate([prompt], _greedy(16, stop=[stop]), use_tqdm=False)[0]
    assert ref["meta"]["finish_reason"] == "stop"
    client = server.openai()
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stop=stop)
    assert out.choices[0].text == ref["text"] and out.choices[0].finish_reason == "stop"
    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stop=[stop], stream=True
    )
    pieces = [c.choices[0].text for c in stream if c.choices]
    assert "".join(pieces) == ref["text"]
    assert stop not in "".join(pieces)


def test_n_samples_with_seed(server: Server) -> None:
    client = server.openai()
    kw: dict[str, Any] = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 4,
        "temperature": 1.0,
        "seed": 7,
        "n": 2,
    }
    first, again = client.completions.create(**kw), client.completions.create(**kw)
    assert len(first.choices) == 2 and {c.index for c in first.choices} == {0, 1}
    assert [c.text for c in first.choices] == [c.text for c in again.choices]  # seeded: reproducible
    assert first.usage is not None and first.usage.completion_tokens == 8


def test_penalties_and_logit_bias_match_offline(server: Server, offline: LLM) -> None:
    prompt = "List the colors: red, blue, red, blue, red,"
    penalties = {"presence_penalty": 0.5, "frequency_penalty": 1.5}
    ref = offline.generate([prompt], _greedy(12, **penalties), use_tqdm=False)[0]
    assert ref["token_ids"] != offline.generate([prompt], _greedy(12), use_tqdm=False)[0]["token_ids"]
    client = server.openai()
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, **penalties)
    assert out.choices[0].text == ref["text"]
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 12, "temperature": 0, **penalties}}
    assert server.post("/generate", json=body).json()["output_ids"] == ref["token_ids"]
    forced = offline.tokenizer.encode(" banana", add_special_tokens=False)[0]
    ref = offline.generate([prompt], _greedy(3, logit_bias={forced: 100.0}), use_tqdm=False)[0]
    assert ref["token_ids"] == [forced] * 3
    out = client.chat.completions.create(
        model=MODEL, messages=_chat("Name a fruit."), max_tokens=3, temperature=0, logit_bias={str(forced): 100}
    )
    assert out.choices[0].message.content == offline.tokenizer.decode([forced] * 3)


# -- native API, cache control -----------------------------------------------------------------
def test_native_generate(server: Server, offline: LLM) -> None:
    prompt = "The three primary colors are"
    ref = offline.generate([prompt], _greedy(8), use_tqdm=False)[0]
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    out = server.post("/generate", json=body).json()
    assert out["text"] == ref["text"] and out["output_ids"] == ref["token_ids"]
    assert out["meta_info"]["prompt_tokens"] == ref["meta"]["prompt_tokens"]
    assert out["meta_info"]["finish_reason"] == {"type": ref["meta"]["finish_reason"]}

    with httpx.stream(
        "POST", server.url + "/generate", json={**body, "stream": True}, headers=AUTH, timeout=REQUEST_TIMEOUT_S
    ) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])  # chunks carry the text so far
    assert last["text"] == ref["text"] and last["output_ids"] == ref["token_ids"]


def test_logprobs_match_offline(server: Server, offline: LLM) -> None:
    """Each output token's log-probability and its most likely alternatives, in the shape of each API, whole
    and streamed: the offline engine's (the same weights), spelled token by token."""
    client = server.openai()
    prompt = "The capital of France is"
    ref = offline.generate([prompt], _greedy(8, logprobs=2), use_tqdm=False)[0]
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=2)
    lp = out.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.top_logprobs is not None
    assert "".join(lp.tokens) == out.choices[0].text == ref["text"]
    assert lp.token_logprobs == pytest.approx([x.logprob for x in ref["logprobs"]], abs=1e-4)
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert all(len(top) == 2 and top[token] == max(top.values()) for token, top in zip(lp.tokens, lp.top_logprobs))
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=2, stream=True)
    chunks = [c.choices[0].logprobs for c in stream if c.choices]
    assert all(c is not None for c in chunks)
    assert [t for c in chunks for t in c.tokens or []] == lp.tokens  # type: ignore[union-attr]
    assert [o for c in chunks for o in c.text_offset or []] == lp.text_offset  # type: ignore[union-attr]

    body = {"text": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0}, "return_logprob": True,
            "top_logprobs_num": 2, "return_text_in_logprobs": True}  # fmt: skip
    meta = server.post(GENERATE, json=body).json()["meta_info"]
    assert [token for _, token, _ in meta["output_token_logprobs"]] == ref["token_ids"]
    assert "".join(text for _, _, text in meta["output_token_logprobs"]) == ref["text"]
    assert [[token for _, token, _ in top] for top in meta["output_top_logprobs"]] == [
        [i for i, _ in x.top] for x in ref["logprobs"]
    ]

    messages = _chat("What is the capital of France?")
    ref = offline.chat([messages], _greedy(8, logprobs=3), use_tqdm=False)[0]
    chat = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    assert chat.choices[0].logprobs is not None and chat.choices[0].logprobs.content is not None
    content = chat.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx([x.logprob for x in ref["logprobs"]], abs=1e-4)
    assert chat.choices[0].message.content == ref["text"]
    # Its last token may be the end of turn: listed, though the text skips it.
    assert b"".join(bytes(c.bytes or []) for c in content).decode() == offline.tokenizer.decode(ref["token_ids"])
    assert all(len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token for c in content)
    streamed = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3, stream=True
    )
    pieces = [choice.logprobs.content or [] for chunk in streamed for choice in chunk.choices if choice.logprobs]
    assert [c.token for piece in pieces for c in piece] == [c.token for c in content]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0)
    assert plain.choices[0].logprobs is None  # not asked for


def test_echo_lists_the_prompt_first(server: Server, offline: LLM) -> None:
    """``echo`` starts each choice with its prompt; with ``logprobs`` the prompt's tokens come first there
    too, the first with null (nothing predicts it): how evaluation harnesses score a text."""
    client = server.openai()
    prompt = "The capital of France is"
    ids = offline.encode(prompt)
    ref = offline.generate([prompt], _greedy(3, logprobs=1, prompt_logprobs=1), use_tqdm=False)[0]
    expected = [x.logprob for x in [*ref["prompt_logprobs"][1:], *ref["logprobs"]]]
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0, echo=True)
    assert out.choices[0].text == prompt + ref["text"] and out.choices[0].logprobs is None
    for sent in (prompt, ids):  # text, or token ids (decoded)
        out = client.completions.create(model=MODEL, prompt=sent, max_tokens=3, temperature=0, echo=True, logprobs=1)
        lp = out.choices[0].logprobs
        assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
        assert "".join(lp.tokens) == out.choices[0].text == prompt + ref["text"]
        assert lp.token_logprobs[0] is None and lp.top_logprobs is not None and lp.top_logprobs[0] is None
        assert lp.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
        assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
        assert out.usage is not None and out.usage.prompt_tokens_details is not None
        assert out.usage.prompt_tokens_details.cached_tokens == 0  # every prompt token's logits were computed
    stream = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=3, temperature=0, echo=True, logprobs=1, stream=True, n=2
    )
    chunks = [choice for c in stream for choice in c.choices]
    for index in (0, 1):
        mine = [c for c in chunks if c.index == index]
        assert mine[0].text == prompt and "".join(c.text for c in mine) == prompt + ref["text"]
        assert [t for c in mine for t in c.logprobs.tokens or []] == lp.tokens  # type: ignore[union-attr]
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "temperature": 0}, "return_logprob": True,
            "logprob_start_len": 0}  # fmt: skip
    meta = server.post(GENERATE, json=body).json()["meta_info"]  # SGLang's shape: [logprob, id, text]
    assert [token for _, token, _ in meta["input_token_logprobs"]] == ids
    assert meta["input_token_logprobs"][0][0] is None and meta["input_top_logprobs"][0] is None
    values = [value for value, _, _ in meta["input_token_logprobs"][1:] + meta["output_token_logprobs"]]
    assert values == pytest.approx(expected, abs=1e-4)
    server.assert_idle_balanced()


def test_tokenize_gives_the_ids_the_completions_count(server: Server) -> None:
    client = server.openai()
    messages = _chat("What is the capital of France?")
    tool = {"type": "function", "function": {"name": "capital", "parameters": {"type": "object"}}}
    for tools in ([], [tool]):
        counted = server.post(TOKENIZE, json={"model": MODEL, "messages": messages, "tools": tools}).json()
        out = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=1, temperature=0, **({"tools": tools} if tools else {})
        )  # fmt: skip
        assert out.usage is not None
        assert counted["count"] == len(counted["tokens"]) == out.usage.prompt_tokens
        assert counted["max_model_len"] == 8192
    assert len(counted["tokens"]) > len(server.post(TOKENIZE, json={"messages": messages}).json()["tokens"])
    text = "The capital of France is"
    ids = server.post(TOKENIZE, json={"prompt": text}).json()["tokens"]
    out = client.completions.create(model=MODEL, prompt=text, max_tokens=1, temperature=0)
    assert out.usage is not None and len(ids) == out.usage.prompt_tokens
    assert server.post(DETOKENIZE, json={"tokens": ids}).json() == {"prompt": text}
    chat_ids = server.post(TOKENIZE, json={"messages": messages}).json()["tokens"]
    rendered = server.post(DETOKENIZE, json={"model": MODEL, "tokens": chat_ids}).json()["prompt"]
    assert rendered.startswith("<|im_start|>") and messages[-1]["content"] in rendered


def test_flush_cache(server: Server) -> None:
    server.wait_idle()
    assert server.post("/flush_cache").status_code == 200
    kv = server.debug_kv()
    assert kv["evictable"] == 0 and kv["free"] == kv["capacity"], kv


# -- load and disconnects ----------------------------------------------------------------------
def test_concurrent_streaming_clients(server: Server, offline: LLM) -> None:
    # Each question differs from its first token on, so ~50 tokens per request are uncached: 32 of
    # them need more KV than the pool's 1024 slots and must queue for admission.
    detail = "Answer in one short sentence, without lists, and mention one everyday use of it."
    conversations = [_chat(f"Number {i}: tell me a fact about the number {i}. {detail}") for i in range(32)]
    refs = offline.chat(conversations, _greedy(8), use_tqdm=False)
    client = server.openai()
    start = threading.Barrier(len(conversations))

    def run(messages: list[dict[str, str]]) -> tuple[str, str | None]:
        start.wait()
        stream = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True
        )
        text, finish = "", None
        for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        return text, finish

    with ThreadPoolExecutor(len(conversations)) as pool:
        results = list(pool.map(run, conversations))
    assert [t for t, _ in results] == [r["text"] for r in refs]
    assert [f for _, f in results] == [r["meta"]["finish_reason"] for r in refs]
    server.assert_idle_balanced()


def test_disconnected_clients_free_their_pages(server: Server) -> None:
    def aborted() -> float:
        families = text_string_to_metric_families(server.get("/metrics").text)
        return sum(s.value for f in families if f.name == "minisgl_requests" for s in f.samples
                   if s.name == "minisgl_requests_total" and s.labels["finish_reason"] == "abort")  # fmt: skip

    before = aborted()
    body = {"model": MODEL, "prompt": "Count slowly:", "max_tokens": 800, "ignore_eos": True, "stream": True}

    def drop_after_a_few_chunks(i: int) -> None:
        url = server.url + "/v1/completions"
        with (
            httpx.Client(timeout=REQUEST_TIMEOUT_S) as http,
            http.stream("POST", url, json={**body, "seed": i}, headers=AUTH) as r,
        ):
            assert r.status_code == 200
            for n, _ in enumerate(r.iter_lines()):
                if n >= 6:
                    break  # leaving the block closes the connection mid-stream

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(drop_after_a_few_chunks, range(4)))
    # 4 x 800 tokens would take minutes; draining quickly means the aborts freed the requests.
    server.assert_idle_balanced()
    assert aborted() - before == 4


# -- bad input ---------------------------------------------------------------------------------
CHAT, COMPLETIONS, GENERATE = "/v1/chat/completions", "/v1/completions", "/generate"
TOKENIZE, DETOKENIZE = "/tokenize", "/detokenize"
HI = [{"role": "user", "content": "hi"}]
BAD_REQUESTS: list[tuple[str, str, Any, int, str]] = [
    # (case, endpoint, body (bytes are sent raw), status, part of the message)
    ("invalid json", CHAT, b'{"messages": [', 400, "invalid JSON"),
    ("not an object", CHAT, b"[1, 2]", 400, "Expected `object`"),
    ("missing messages", CHAT, {"model": MODEL}, 400, "missing required field `messages`"),
    ("empty messages", CHAT, {"messages": []}, 400, "messages must be a non-empty list"),
    ("messages wrong type", CHAT, {"messages": "hi"}, 400, "Expected `array`, got `str`"),
    ("bad role", CHAT, {"messages": [{"role": "robot", "content": "x"}]}, 400, "role must be one of"),
    ("user without content", CHAT, {"messages": [{"role": "user"}]}, 400, "messages[0].content is required in a user"),
    ("assistant without content", CHAT, {"messages": [*HI, {"role": "assistant"}, *HI]}, 400, "without tool_calls"),
    ("tool content null", CHAT, {"messages": [*HI, {"role": "tool", "content": None}]}, 400, "messages[1].content is"),
    ("max_tokens wrong type", CHAT, {"messages": HI, "max_tokens": "ten"}, 400, "Expected `int | null`, got `str`"),
    ("max_tokens zero", CHAT, {"messages": HI, "max_tokens": 0}, 400, "max_tokens must be a positive integer"),
    (
        "max_tokens negative",
        COMPLETIONS,
        {"prompt": "hi", "max_tokens": -3},
        400,
        "max_tokens must be a positive integer",
    ),
    (
        "max_tokens beyond context",
        CHAT,
        {"messages": HI, "max_tokens": 100_000},
        400,
        "exceeds the context of 8192 tokens",
    ),
    ("max_tokens beyond pool", CHAT, {"messages": HI, "max_tokens": 2000}, 400, "but the pool holds 1024"),
    ("prompt beyond context", COMPLETIONS, {"prompt": "hello " * 9000}, 400, "but the context holds 8192"),
    ("temperature negative", CHAT, {"messages": HI, "temperature": -1}, 400, "temperature must be in [0, 100]"),
    ("top_p zero", CHAT, {"messages": HI, "top_p": 0}, 400, "top_p must be in (0, 1]"),
    ("top_p above one", COMPLETIONS, {"prompt": "hi", "top_p": 1.5}, 400, "top_p must be in (0, 1]"),
    ("empty stop string", COMPLETIONS, {"prompt": "hi", "stop": [""]}, 400, "stop must be non-empty strings"),
    ("n too large", CHAT, {"messages": HI, "n": 5}, 400, "n must be in [1, 4]"),
    ("top_logprobs alone", CHAT, {"messages": HI, "top_logprobs": 2}, 400, "top_logprobs needs logprobs: true"),
    ("top_logprobs too many", CHAT, {"messages": HI, "logprobs": True, "top_logprobs": 21}, 400, "in [0, 20], got 21"),
    ("chat logprobs a number", CHAT, {"messages": HI, "logprobs": 2}, 400, "Expected `bool | null`, got `int`"),
    ("logprobs too many", COMPLETIONS, {"prompt": "hi", "logprobs": 21}, 400, "logprobs must be an integer in [0, 20]"),
    ("native top_logprobs_num", GENERATE, {"text": "a", "top_logprobs_num": -1}, 400, "top_logprobs_num must be in"),
    (
        "logprob_start_len past the prompt",
        GENERATE,
        {"input_ids": [5, 6], "logprob_start_len": 2},
        400,
        "logprob_start_len must be -1 or a prompt position in [0, 2), got 2",
    ),
    ("penalty too large", CHAT, {"messages": HI, "presence_penalty": 2.5}, 400, "presence_penalty must be in [-2, 2]"),
    ("logit_bias key not an id", COMPLETIONS, {"prompt": "hi", "logit_bias": {"a": 1}}, 400, "logit_bias keys must be"),
    ("logit_bias key signed twice", CHAT, {"messages": HI, "logit_bias": {"--5": 1}}, 400, "logit_bias keys must be"),
    ("logit_bias id out of range", CHAT, {"messages": HI, "logit_bias": {"99999999": 1}}, 400, "token ids in [0,"),
    ("logit_bias too large", COMPLETIONS, {"prompt": "hi", "logit_bias": {"5": 101}}, 400, "in [-100, 100]"),
    ("unknown model", CHAT, {"model": "gpt-4", "messages": HI}, 404, "The model `gpt-4` does not exist"),
    ("missing prompt", COMPLETIONS, {"model": MODEL}, 400, "missing required field `prompt`"),
    ("empty prompt", COMPLETIONS, {"prompt": ""}, 400, "prompt is empty"),
    ("mixed prompt batch", COMPLETIONS, {"prompt": ["a", [1, 2]]}, 400, "prompt must be a non-empty string"),
    ("token id out of range", COMPLETIONS, {"prompt": [1, 10**9]}, 400, "prompt token ids must be integers"),
    ("bad request streamed", CHAT, {"messages": HI, "max_tokens": 0, "stream": True}, 400, "max_tokens must be"),
    ("text and input_ids", GENERATE, {"text": "a", "input_ids": [1]}, 400, "exactly one of text or input_ids"),
    ("native bad temperature", GENERATE, {"text": "a", "sampling_params": {"temperature": -2}}, 400, "temperature"),
    ("tokenize prompt and messages", TOKENIZE, {"prompt": "a", "messages": HI}, 400, "exactly one of prompt"),
    ("tokenize nothing", TOKENIZE, {"model": MODEL}, 400, "exactly one of prompt or messages"),
    ("tokenize bad tool", TOKENIZE, {"messages": HI, "tools": [{"type": "x"}]}, 400, 'must be {"type": "function"'),
    ("tokenize unknown model", TOKENIZE, {"model": "gpt-4", "prompt": "a"}, 404, "The model `gpt-4` does not exist"),
    ("detokenize missing tokens", DETOKENIZE, {"model": MODEL}, 400, "missing required field `tokens`"),
    ("detokenize id out of range", DETOKENIZE, {"tokens": [1, 10**9]}, 400, "tokens must be token ids in [0,"),
    (
        "oversized body",
        CHAT,
        {"messages": [{"role": "user", "content": "x" * (1 << 20)}]},
        413,
        "limit of 1048576 bytes",
    ),
]


@pytest.mark.parametrize("case,path,body,status,message", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_request(server: Server, case: str, path: str, body: Any, status: int, message: str) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = server.post(path, content=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert message in error["message"], error


# Every code a rejection can carry, from the front end's checks and from the scheduler's: the client
# reads the status, ``code`` and ``param`` fields, never the message's wording.
REJECTIONS: list[tuple[str, str, Any, RejectionCode, str | None]] = [
    # (case, endpoint, body, code, param)
    ("temperature negative", CHAT, {"messages": HI, "temperature": -1}, RejectionCode.INVALID_VALUE, "temperature"),
    ("seed overflow with n", COMPLETIONS, {"prompt": "hi", "seed": 2**63 - 1, "n": 2, "temperature": 1},
     RejectionCode.INVALID_VALUE, "seed"),
    ("native top_p", GENERATE, {"text": "a", "sampling_params": {"top_p": 0}}, RejectionCode.INVALID_VALUE, "top_p"),
    ("frequency penalty", COMPLETIONS, {"prompt": "hi", "frequency_penalty": -3}, RejectionCode.INVALID_VALUE,
     "frequency_penalty"),
    ("native logit_bias", GENERATE, {"text": "a", "sampling_params": {"logit_bias": {"-1": 2}}},
     RejectionCode.INVALID_VALUE, "logit_bias"),
    ("token id out of range", COMPLETIONS, {"prompt": [1, 10**9]}, RejectionCode.INVALID_PROMPT, None),
    ("bad regex", GENERATE, {"text": "a", "sampling_params": {"regex": "(ab"}}, RejectionCode.INVALID_GRAMMAR, "regex"),
    ("two grammars", GENERATE, {"text": "a", "sampling_params": {"regex": "a", "ebnf": 'root ::= "a"'}},
     RejectionCode.INVALID_GRAMMAR, None),
    ("bad schema", CHAT, {"messages": HI, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "array", "uniqueItems": True}}}}, RejectionCode.INVALID_GRAMMAR, "response_format"),
    ("max_tokens beyond context", CHAT, {"messages": HI, "max_tokens": 100_000},
     RejectionCode.CONTEXT_LENGTH_EXCEEDED, None),
    ("prompt beyond context", COMPLETIONS, {"prompt": "hello " * 9000}, RejectionCode.CONTEXT_LENGTH_EXCEEDED, None),
    ("streamed, beyond context", CHAT, {"messages": HI, "max_tokens": 100_000, "stream": True},
     RejectionCode.CONTEXT_LENGTH_EXCEEDED, None),
    ("max_tokens beyond pool", CHAT, {"messages": HI, "max_tokens": 2000}, RejectionCode.KV_CAPACITY_EXCEEDED, None),
]  # fmt: skip


def test_rejections_cover_every_code() -> None:
    assert {code for *_, code, _ in REJECTIONS} == set(RejectionCode)


@pytest.mark.parametrize("case,path,body,code,param", REJECTIONS, ids=[c[0] for c in REJECTIONS])
def test_rejection_fields(
    server: Server, case: str, path: str, body: Any, code: RejectionCode, param: str | None
) -> None:
    r = server.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code.value, param), error


def test_server_healthy_after_bad_requests(server: Server) -> None:
    r = server.post(CHAT, json={"model": MODEL, "messages": HI, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    server.assert_idle_balanced()


def test_api_key(server: Server) -> None:
    assert httpx.get(server.url + "/health").status_code == 200  # open for probes
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.post(server.url + CHAT, json={"messages": HI}, headers=headers)
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
        assert httpx.get(server.url + "/v1/models", headers=headers).status_code == 401
        assert httpx.post(server.url + TOKENIZE, json={"prompt": "hi"}, headers=headers).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0).models.list()


def test_metrics(server: Server) -> None:
    families = {f.name: f for f in text_string_to_metric_families(server.get("/metrics").text)}
    for name in ("minisgl_requests", "minisgl_prompt_tokens", "minisgl_cached_tokens", "minisgl_generated_tokens",
                 "minisgl_cache_hit_rate", "minisgl_running_requests", "minisgl_waiting_requests",
                 "minisgl_kv_tokens", "minisgl_time_to_first_token_seconds", "minisgl_inter_token_latency_seconds"):  # fmt: skip
        assert name in families, name
    kv = {s.labels["state"]: s.value for s in families["minisgl_kv_tokens"].samples}
    assert set(kv) == {"capacity", "free", "evictable", "protected", "in_use"} and kv["capacity"] == 1024
    memory = {s.labels["part"]: s.value for s in families["minisgl_memory_bytes"].samples}
    assert set(memory) == {"weights", "kv_pool", "dequant_buffer"} and memory["weights"] > 0
    assert memory["kv_pool"] == 1024 * 2 * 30 * 3 * 64 * 4  # K and V of 30 layers x 3 heads x 64, fp32 (none)
    generated = families["minisgl_generated_tokens"].samples[0].value
    assert generated > 0
    for name in ("minisgl_decode_steps", "minisgl_prefill_seconds", "minisgl_decode_seconds"):
        assert families[name].samples[0].value > 0, name
    ttft_count = next(
        s.value for s in families["minisgl_time_to_first_token_seconds"].samples if s.name.endswith("_count")
    )
    assert ttft_count > 0


# -- process faults (servers of their own) -----------------------------------------------------
def test_scheduler_death_gives_503_and_exit(tmp_path: Path) -> None:
    srv = start_server(tmp_path)
    try:
        scheduler_pid = srv.debug_kv()["scheduler_pid"]
        result: dict[str, httpx.Response] = {}
        body = {"text": "Count:", "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
        waiter = threading.Thread(target=lambda: result.setdefault("r", srv.post(GENERATE, json=body)))
        waiter.start()
        while srv.debug_kv()["running"] == 0:
            time.sleep(0.05)
        os.kill(scheduler_pid, signal.SIGKILL)
        waiter.join(REQUEST_TIMEOUT_S)
        assert result["r"].status_code == 503 and "engine" in result["r"].json()["error"]["message"]
        assert srv.proc.wait(60) == 1
    finally:
        stop_server(srv)


def test_scheduler_exits_when_front_end_dies(tmp_path: Path) -> None:
    srv = start_server(tmp_path)
    try:
        scheduler_pid = srv.debug_kv()["scheduler_pid"]
        srv.proc.kill()  # SIGKILL: no chance to clean up
        srv.proc.wait(30)
        _wait_dead(scheduler_pid)
    finally:
        stop_server(srv)


def test_stream_pacer_holds_decode_tokens_for_the_interval_only() -> None:
    """Answers, a request's first token and its last go at once; other tokens wait until the interval
    has passed since the last message, and then everything held goes together, in order."""
    from minisgl.server.protocol import StepOutput, Token
    from minisgl.server.scheduler_process import StreamPacer

    now = [0.0]
    pacer = StreamPacer(0.02, clock=lambda: now[0])

    def step(*tokens: tuple[int, int, str | None]) -> StepOutput:
        return StepOutput(tokens=[Token(rid, token, finish, 0) for rid, token, finish in tokens])

    def sent() -> list[tuple[int, int]]:
        out = pacer.take()
        assert out is not None
        return [(t.rid, t.token_id) for t in out.tokens]

    assert pacer.take() is None  # nothing held
    assert pacer.add(StepOutput(accepted=[1, 2]))
    assert pacer.take() == StepOutput(accepted=[1, 2])
    assert pacer.add(step((1, 10, None)))  # request 1's first token
    assert sent() == [(1, 10)]
    now[0] = 0.005
    assert not pacer.add(step((1, 11, None)))
    now[0] = 0.010
    assert pacer.add(step((1, 12, None), (2, 20, None)))  # request 2's first token takes 1's held ones along
    assert sent() == [(1, 11), (1, 12), (2, 20)]
    now[0] = 0.025
    assert not pacer.add(step((1, 13, None), (2, 21, None)))  # 15 ms since the last message
    now[0] = 0.031
    assert pacer.add(step((1, 14, None), (2, 22, None)))
    assert sent() == [(1, 13), (2, 21), (1, 14), (2, 22)]
    now[0] = 0.032
    assert pacer.add(step((1, 15, "length"), (2, 23, None)))  # a last token
    assert sent() == [(1, 15), (2, 23)]
    now[0] = 0.040
    assert pacer.add(step((1, 30, None)))  # a new request under a finished one's id starts at once again
    assert sent() == [(1, 30)]
    pacer.forget([1])  # aborted: its state goes without a last token
    assert pacer.add(step((1, 40, None))) and sent() == [(1, 40)]
    every = StreamPacer(0.0, clock=lambda: now[0])
    assert every.add(step((3, 1, None))) and every.take() is not None
    assert every.add(step((3, 2, None)))  # no interval: every step is due


class _Routes:
    """The part of ``EngineClient`` a ``Generation`` talks to: each sample's queue, fed by the test."""

    def __init__(self) -> None:
        self.routes: dict[int, tuple[asyncio.Queue[Any], int]] = {}

    def new_rid(self) -> int:
        return len(self.routes)

    def submit(self, rid: int, ids: list[int], params: Any, namespace: Any, queue: Any, index: int) -> None:
        self.routes[rid] = (queue, index)
        queue.put_nowait((index, Accepted(rid)))

    def abort(self, rids: list[int]) -> None:
        """Nothing to free: no scheduler runs behind this client."""

    def put(self, rid: int, token: Token) -> None:
        queue, index = self.routes[rid]
        queue.put_nowait((index, token))


def test_tokens_that_arrive_together_stream_as_one_event_per_sample() -> None:
    """The tokens of one sample that arrive together become one delta (one SSE event), except a
    sample's first token, which goes alone; deltas keep each sample's order and text. A failure comes
    after the deltas of the tokens before it."""
    from transformers import AutoTokenizer

    from minisgl.models.source import resolve_model_path
    from minisgl.server.generation import Generation, SampleFailed
    from minisgl.server.metrics import ServerMetrics
    from minisgl.server.protocol import StatsSnapshot
    from minisgl.text.detokenizer import IncrementalDetokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(None)))
    a, b = tokenizer.encode(" one two three four five"), tokenizer.encode(" six seven eight nine")
    reference = [IncrementalDetokenizer(tokenizer, []), IncrementalDetokenizer(tokenizer, [])]

    def text(index: int, *tokens: int, last: bool = False) -> str:
        pieces = reference[index].push(tokens)
        return pieces + (reference[index].finish() if last else "")

    async def run() -> list[tuple[int, str, str | None]]:
        client = _Routes()
        metrics = ServerMetrics(StatsSnapshot)
        gen = Generation(client, tokenizer, metrics, [[1], [2]], SamplingParams(max_tokens=5))  # type: ignore[arg-type]
        await gen.start()
        deltas = gen.deltas()
        got: list[tuple[int, str, str | None]] = []

        async def pull(n: int) -> None:
            for _ in range(n):
                d = await anext(deltas)
                got.append((d.sample.index, d.text, d.finish_reason))

        for rid, token in [(0, a[0]), (0, a[1]), (1, b[0]), (0, a[2]), (1, b[1])]:
            client.put(rid, Token(rid, token, None, 0))
        await pull(4)
        client.put(0, Token(0, a[3], None, 0))
        client.put(0, Token(0, a[4], "length", 0))
        client.put(1, Token(1, b[2], None, 0))
        await pull(2)
        client.put(1, Token(1, b[3], None, 0))
        client.put(1, Token(1, -1, "error", 0, "the sample's own failure"))
        await pull(1)
        with pytest.raises(SampleFailed, match="own failure"):
            await anext(deltas)
        return got

    assert asyncio.run(run()) == [
        (0, text(0, a[0]), None),
        (0, text(0, a[1], a[2]), None),
        (1, text(1, b[0]), None),
        (1, text(1, b[1]), None),
        (0, text(0, a[3], a[4], last=True), "length"),
        (1, text(1, b[2]), None),
        (1, text(1, b[3]), None),
    ]


def test_a_stop_while_the_scheduler_process_starts_exits_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM becomes a KeyboardInterrupt; one that lands inside ``EngineClient.spawn`` (as
    multiprocessing starts its helper and then the scheduler) is a requested stop like any other."""
    from minisgl.cli import main
    from minisgl.server.engine_client import EngineClient

    def interrupted(client: EngineClient) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(EngineClient, "spawn", interrupted)
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exited:
            main(["serve", "--port", str(_free_port())])
    except KeyboardInterrupt:
        pytest.fail("a stop during the scheduler's start escaped serve()")
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert exited.value.code == 0


def test_a_stop_while_the_http_stack_starts_waits_for_it_then_exits_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM while the front end imports and builds its HTTP stack lands once that is done: raised
    inside an import, the KeyboardInterrupt left half-imported modules that broke the exit (-2, a hang)."""
    from minisgl.cli import main
    from minisgl.server import app, launch
    from minisgl.server.engine_client import EngineClient

    steps: list[str] = []

    def load_tokenizer(model: str | None, chat_template: str | None) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        steps.append("tokenizer")

    monkeypatch.setattr(EngineClient, "spawn", lambda client: None)
    monkeypatch.setattr(launch, "load_tokenizer", load_tokenizer)
    monkeypatch.setattr(app, "create_app", lambda ctx, url: steps.append("app"))
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exited:
            main(["serve", "--port", str(_free_port())])
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert exited.value.code == 0
    assert steps == ["tokenizer", "app"]  # the rest of the start-up ran before the stop was raised


def test_sigterm_while_starting_stops_the_scheduler_and_exits_0(tmp_path: Path) -> None:
    """The scheduler process starts before the front end's own start-up: a stop requested meanwhile
    stops it too, before the model has loaded."""
    import psutil

    proc = subprocess.Popen(
        [sys.executable, "-m", "minisgl", "serve", "--port", str(_free_port())],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        children: list[psutil.Process] = []
        while not children and proc.poll() is None:
            assert time.monotonic() < deadline, "no scheduler process was started"
            children = psutil.Process(proc.pid).children(recursive=True)
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        for child in children:
            _wait_dead(child.pid)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_model_that_fails_to_load_exits_1_with_the_reason(tmp_path: Path) -> None:
    from tiny_models import build_tiny_model

    folder = build_tiny_model("llama", tmp_path)
    for weights in folder.glob("*.safetensors"):
        weights.write_bytes(b"not safetensors")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run(
        [sys.executable, "-m", "minisgl", "serve", "--model", str(folder), "--port", str(port)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "scheduler process exited" in proc.stderr
