"""What a model's files give the server, and the flags that override them, as vLLM's, SGLang's and
llama-server's do: the chat template (``--chat-template``: a file or its text, the same in the offline
API, the chat shell's engine and the server) and sampling defaults (``generation_config.json``, or OpenAI's
with ``--generation-config none``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gguf_writer import write_gguf
from test_gguf_archs import tiny_with_bpe
from test_server import Server, start_server, stop_server
from tiny_models import build_tiny_model
from transformers import AutoTokenizer

from minisgl import LLM
from minisgl.config import EngineConfig
from minisgl.models.source import generation_defaults

# The tiny model's word-level tokenizer knows "w3" .. "w511" and has no template of its own.
TEMPLATE = "{% for m in messages %}{{ m['role'] == 'user' and 'w7' or 'w8' }} {{ m['content'] }} {% endfor %}w9"
ASK = [{"role": "system", "content": "w20"}, {"role": "user", "content": "w21 w22"}]
# top_k 1: greedy, unless a request says otherwise; top_p out of its range: left out.
GENERATION_CONFIG = {"top_k": 1, "temperature": 0.7, "top_p": 2.0, "do_sample": True}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = build_tiny_model("llama", tmp_path_factory.mktemp("defaults") / "model")
    (folder / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    (folder.parent / "template.jinja").write_text(TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[Server]:
    srv = start_server(folder.parent, "--model", str(folder), "--chat-template", str(folder.parent / "template.jinja"))
    yield srv
    assert stop_server(srv) == 0, srv.log.read_text()[-3000:]


def expected_ids(folder: Path) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return tokenizer.encode("w8 w20 w7 w21 w22 w9", add_special_tokens=False)


def test_a_template_is_a_file_or_its_text_and_nothing_else(tmp_path: Path) -> None:
    file = tmp_path / "template.jinja"
    file.write_text(TEMPLATE)
    assert EngineConfig(chat_template=str(file)).chat_template == TEMPLATE
    assert EngineConfig(chat_template=TEMPLATE).chat_template == TEMPLATE
    with pytest.raises(ValueError, match="no file 'missing.jinja'"):
        EngineConfig(chat_template="missing.jinja")


def test_offline_chat_renders_with_the_template(folder: Path) -> None:
    plain = LLM(str(folder), quantization="none")
    with pytest.raises(ValueError, match="chat template"):
        plain.apply_chat_template(ASK)  # the tiny model has none
    plain.shutdown()
    llm = LLM(str(folder), quantization="none", chat_template=TEMPLATE)
    assert llm.apply_chat_template(ASK) == expected_ids(folder)
    llm.shutdown()


def test_the_server_renders_with_the_template(server: Server, folder: Path) -> None:
    assert server.post("/tokenize", json={"messages": ASK}).json()["tokens"] == expected_ids(folder)
    answer = server.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 3, "temperature": 0})
    assert answer.status_code == 200 and answer.json()["usage"]["prompt_tokens"] == len(expected_ids(folder))


def test_the_generation_config_states_the_defaults(folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert generation_defaults(folder) == {"top_k": 1, "temperature": 0.7}
    assert "top_p = 2.0 is out of its range" in caplog.text
    assert generation_defaults(None) == {}  # the default model's GGUF has none


def test_a_ggufs_sampling_keys_are_its_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    folder = tiny_with_bpe("qwen3", tmp_path / "model")
    path = write_gguf(folder, tmp_path / "m.gguf", "qwen2", sampling={"temp": 0.6, "top_p": 0.95, "top_k": 20})
    assert generation_defaults(path) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert generation_defaults(write_gguf(folder, tmp_path / "plain.gguf", "qwen2")) == {}


def completion(server: Server, **fields: Any) -> str:
    body = {"prompt": "w30 w31 w32", "max_tokens": 8, "seed": 3, **fields}
    response = server.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_unset_fields_take_the_models_defaults(server: Server, folder: Path, tmp_path: Path) -> None:
    logged = "sampling defaults from the model: {'temperature': 0.7, 'top_k': 1}"
    assert logged in server.log.read_text()
    greedy = completion(server, temperature=0)
    assert completion(server) == greedy  # top_k 1 from the model
    sampled = completion(server, top_k=-1)  # the request's own value wins: temperature 0.7 from the model
    assert sampled == completion(server, top_k=-1, temperature=0.7) != greedy

    srv = start_server(tmp_path, "--model", str(folder), "--generation-config", "none")
    try:
        assert completion(srv) == completion(srv, temperature=1.0, top_k=-1) != greedy  # OpenAI's defaults
    finally:
        assert stop_server(srv) == 0, srv.log.read_text()[-3000:]
