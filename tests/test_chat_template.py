"""``--chat-template`` / ``EngineConfig.chat_template``: a template in place of the model's (a file or its
text), the same in the offline API, the chat shell's engine and the server, as vLLM's, SGLang's and
llama-server's flags give it."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_server import start_server, stop_server
from tiny_models import build_tiny_model
from transformers import AutoTokenizer

from minisgl import LLM
from minisgl.config import EngineConfig

# The tiny model's word-level tokenizer knows "w3" .. "w511" and has no template of its own.
TEMPLATE = "{% for m in messages %}{{ m['role'] == 'user' and 'w7' or 'w8' }} {{ m['content'] }} {% endfor %}w9"
ASK = [{"role": "system", "content": "w20"}, {"role": "user", "content": "w21 w22"}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama", tmp_path_factory.mktemp("template") / "model")


def expected_ids(folder: Path) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return tokenizer.encode("w8 w20 w7 w21 w22 w9", add_special_tokens=False)


def test_a_file_or_the_text_and_nothing_else(tmp_path: Path) -> None:
    file = tmp_path / "template.jinja"
    file.write_text(TEMPLATE)
    assert EngineConfig(chat_template=str(file)).chat_template == TEMPLATE
    assert EngineConfig(chat_template=TEMPLATE).chat_template == TEMPLATE
    with pytest.raises(ValueError, match="no file 'missing.jinja'"):
        EngineConfig(chat_template="missing.jinja")


def test_offline_chat_renders_with_it(folder: Path) -> None:
    plain = LLM(str(folder), quantization="none")
    with pytest.raises(ValueError, match="chat template"):
        plain.apply_chat_template(ASK)  # the tiny model has none
    plain.shutdown()
    llm = LLM(str(folder), quantization="none", chat_template=TEMPLATE)
    assert llm.apply_chat_template(ASK) == expected_ids(folder)
    llm.shutdown()


def test_the_server_renders_with_it(folder: Path, tmp_path: Path) -> None:
    file = tmp_path / "template.jinja"
    file.write_text(TEMPLATE)
    srv = start_server(tmp_path, "--model", str(folder), "--chat-template", str(file))
    try:
        assert srv.post("/tokenize", json={"messages": ASK}).json()["tokens"] == expected_ids(folder)
        answer = srv.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 3, "temperature": 0})
        assert answer.status_code == 200 and answer.json()["usage"]["prompt_tokens"] == len(expected_ids(folder))
    finally:
        assert stop_server(srv) == 0, srv.log.read_text()[-3000:]
