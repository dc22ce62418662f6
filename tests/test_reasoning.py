"""A thinking model's answer split into ``reasoning_content`` and ``content``, as vLLM's, SGLang's and
llama-server's OpenAI-compatible servers split it: the parser against a plain reference, whole and in any
pieces; the tags found in a vocabulary; chat template variables; and servers on a tiny model whose greedy
answer closes its reasoning block, whole and streamed."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gguf_writer import write_gguf
from hypothesis import given
from hypothesis import strategies as st
from test_gguf_archs import tiny_with_bpe
from test_server import AUTH, REQUEST_TIMEOUT_S, Server, start_server, stop_server
from tiny_models import THINK_OPEN_ID, THINK_TEMPLATE, build_thinking_model, build_tiny_model, name_words
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from minisgl.constrained.compiler import GrammarCompiler
from minisgl.constrained.matcher import Grammar, GrammarAfterThought
from minisgl.constrained.spec import GrammarSpec, ThinkTags
from minisgl.constrained.tool_calls import parse_tools
from minisgl.models.source import load_tokenizer
from minisgl.server.chat_output import ChatOutput
from minisgl.text.chat import TemplateVariableError, render_chat
from minisgl.text.reasoning import CLOSE, OPEN, ReasoningParser, split_reasoning, think_tags

ASK = [{"role": "user", "content": "w10 w11 w12 w13"}]
THOUGHT_TOKENS = 3  # the greedy answer's tokens before its </think>
MAX_TOKENS = 12


def reference(text: str, opened: bool) -> tuple[str | None, str | None]:
    """The split, plainly: the block is the first <think> (leading the answer, or the prompt's) up to the
    first </think>; the reasoning is stripped, the content after it too at its start."""
    if not opened:
        start = text.lstrip()
        if not start.startswith(OPEN):
            return None, text
        text = start[len(OPEN) :]
    reasoning, closed, content = text.partition(CLOSE)
    return reasoning.strip() or None, (content.lstrip() or None) if closed else None


@pytest.mark.parametrize(
    ("text", "opened", "split"),
    [
        ("<think>\nplan\n</think>\n\nanswer", False, ("plan", "answer")),
        ("  <think>x</think>y", False, ("x", "y")),
        ("hello <think>x</think>", False, (None, "hello <think>x</think>")),
        ("plan\n</think>\n\nanswer", True, ("plan", "answer")),
        ("still thinking", True, ("still thinking", None)),
        ("<think>still", False, ("still", None)),
        ("<think>\n\n</think>\n\nanswer", False, (None, "answer")),
        ("<thi", False, (None, "<thi")),
        ("", False, (None, "")),
        ("", True, (None, None)),
        ("a</think>b</think>c", True, ("a", "b</think>c")),
        ("a </thi", True, ("a </thi", None)),
    ],
)
def test_split_examples(text: str, opened: bool, split: tuple[str | None, str | None]) -> None:
    assert split_reasoning(text, opened) == reference(text, opened) == split


PIECES = [OPEN, CLOSE, "<", "</", "<th", "</thi", "nk>", "think>", " ", "\n", "\t", "a", "b c"]


@given(
    st.lists(st.sampled_from(PIECES), max_size=12).map("".join),
    st.booleans(),
    st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_streamed_in_any_pieces_splits_as_the_reference(text: str, opened: bool, cuts: list[int]) -> None:
    assert split_reasoning(text, opened) == reference(text, opened)
    parser = ReasoningParser(opened)
    reasoning = content = ""
    bounds = [0, *sorted(min(c, len(text)) for c in cuts), len(text)]
    for start, end in itertools.pairwise(bounds):
        r, c = parser.push(text[start:end])
        reasoning, content = reasoning + r, content + c
    r, c = parser.finish()
    whole_reasoning, whole_content = reference(text, opened)
    assert (reasoning + r, content + c) == (whole_reasoning or "", whole_content or "")


def test_tags_are_found_where_they_are_single_tokens_that_decode(tmp_path: Path) -> None:
    folder = build_tiny_model("llama", tmp_path / "plain")
    assert think_tags(AutoTokenizer.from_pretrained(folder)) is None  # the vocabulary has no tags
    name_words(folder, {THINK_OPEN_ID: OPEN, 7: CLOSE}, THINK_TEMPLATE)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tags = think_tags(tokenizer)
    assert tags == ThinkTags(THINK_OPEN_ID, 7)
    assert tags.opened_by([5, THINK_OPEN_ID, 6]) and tags.opened_by([7, THINK_OPEN_ID])
    assert not tags.opened_by([THINK_OPEN_ID, 7]) and not tags.opened_by([]) and not tags.opened_by([5, 6])
    tokenizer.add_special_tokens({"additional_special_tokens": [OPEN, CLOSE]})
    assert think_tags(tokenizer) is None  # special: the detokenizer would drop them from the text


def test_template_variables_reach_the_template_and_cannot_replace_its_arguments(tmp_path: Path) -> None:
    folder = build_tiny_model("llama", tmp_path / "thinking")
    name_words(folder, {THINK_OPEN_ID: OPEN, 7: CLOSE}, THINK_TEMPLATE)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    thinking = render_chat(tokenizer, ASK)
    assert thinking[-1] == THINK_OPEN_ID
    assert render_chat(tokenizer, ASK, template_kwargs={"enable_thinking": False}) == [*thinking, 7]
    assert render_chat(tokenizer, ASK, template_kwargs={"enable_thinking": True, "unused": [1]}) == thinking
    for reserved in ("tokenize", "chat_template", "messages", "tools", "add_generation_prompt"):
        with pytest.raises(TemplateVariableError, match=reserved):
            render_chat(tokenizer, ASK, template_kwargs={reserved: "x"})


def test_reasoning_then_a_tool_call_whole_and_streamed() -> None:
    tools = parse_tools([{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}])
    call = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
    text = f"<think>\nwhich tool?\n</think>\n\n{call}"
    message = ChatOutput(tools, False).choice(0, text, "stop")
    assert message["finish_reason"] == "tool_calls"
    assert message["message"]["reasoning_content"] == "which tool?" and message["message"]["content"] is None
    (called,) = message["message"]["tool_calls"]
    assert called["function"] == {"name": "get_time", "arguments": '{"tz": "UTC"}'}

    output = ChatOutput(tools, False)
    chunks = [output.chunk(0, ch, None) for ch in text[:-1]] + [output.chunk(0, text[-1], "stop")]
    deltas = [c["delta"] for c in chunks if c is not None]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "which tool?"
    assert not any(d.get("content") for d in deltas)
    assert [c["function"]["name"] for d in deltas for c in d.get("tool_calls", [])] == ["get_time"]
    assert chunks[-1] is not None and chunks[-1]["finish_reason"] == "tool_calls"


# ---- servers on a tiny thinking model ---------------------------------------------------------------
@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """A tiny model whose greedy answer to ASK closes its reasoning after THOUGHT_TOKENS tokens."""
    folder = tmp_path_factory.mktemp("thinking") / "model"
    return folder, build_thinking_model(folder, ASK, THOUGHT_TOKENS, MAX_TOKENS)


@pytest.fixture(scope="module")
def server(thinking_model: tuple[Path, list[int]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("reasoning"), "--model", str(thinking_model[0]))
    yield srv
    srv.assert_idle_balanced()
    assert stop_server(srv) == 0, srv.log.read_text()[-3000:]


def chat(server: Server, **fields: Any) -> httpx.Response:
    body = {"messages": ASK, "max_tokens": MAX_TOKENS, "temperature": 0, **fields}
    return server.post("/v1/chat/completions", json=body)


def raw_answer(server: Server, folder: Path, **template: Any) -> str:
    """The greedy answer's text as the completions endpoint gives it, for the chat prompt's ids."""
    prompt = render_chat(AutoTokenizer.from_pretrained(folder), ASK, template_kwargs=template)
    response = server.post("/v1/completions", json={"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def streamed(server: Server) -> tuple[list[dict[str, Any]], str | None]:
    body = {"messages": ASK, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    deltas, finish = [], None
    url = server.url + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=AUTH, timeout=REQUEST_TIMEOUT_S) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                (choice,) = json.loads(line.removeprefix("data: "))["choices"]
                deltas.append(choice["delta"])
                finish = choice["finish_reason"] or finish
    return deltas, finish


def test_the_answer_is_split_whole_and_streamed(server: Server, thinking_model: tuple[Path, list[int]]) -> None:
    response = chat(server)
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    reasoning, content = split_reasoning(raw_answer(server, thinking_model[0]), opened=True)
    assert reasoning is not None and content is not None  # the greedy answer closes its block
    ids = thinking_model[1]
    words = [CLOSE if i == ids[THOUGHT_TOKENS] else f"w{i}" for i in ids if i > 2]  # 0-2 are special: skipped
    assert reasoning.split() == words[:THOUGHT_TOKENS] and content.split() == words[THOUGHT_TOKENS + 1 :]
    assert (message["reasoning_content"], message["content"]) == (reasoning, content)

    deltas, finish = streamed(server)
    assert finish == "length"
    assert "".join(d.get("reasoning_content", "") for d in deltas) == reasoning
    assert "".join(d.get("content") or "" for d in deltas) == content
    kinds = [k for d in deltas for k in ("reasoning_content", "content") if d.get(k)]
    assert kinds == sorted(kinds, key=lambda k: k == "content")  # all reasoning, then all content


def test_an_answer_cut_while_thinking_is_all_reasoning(server: Server) -> None:
    choice = chat(server, max_tokens=THOUGHT_TOKENS).json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    assert len(choice["message"]["reasoning_content"].split()) == THOUGHT_TOKENS


def test_enable_thinking_false_leaves_no_reasoning(server: Server, thinking_model: tuple[Path, list[int]]) -> None:
    response = chat(server, chat_template_kwargs={"enable_thinking": False})
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert message["reasoning_content"] is None
    assert message["content"] == raw_answer(server, thinking_model[0], enable_thinking=False)
    tokens = server.post("/tokenize", json={"messages": ASK, "chat_template_kwargs": {"enable_thinking": False}})
    tokenizer = AutoTokenizer.from_pretrained(thinking_model[0])
    closed = render_chat(tokenizer, ASK, template_kwargs={"enable_thinking": False})
    assert tokens.json()["tokens"] == closed and closed[-1] == thinking_model[1][THOUGHT_TOKENS]


def thinking_vocabulary() -> PreTrainedTokenizerBase:
    """The default model's byte-level vocabulary (which JSON needs), with the tags added."""
    tokenizer = load_tokenizer(None)
    tokenizer.add_tokens([OPEN, CLOSE])
    return tokenizer


def test_a_grammar_holds_after_the_reasoning_block() -> None:
    tokenizer = thinking_vocabulary()
    tags = think_tags(tokenizer)
    assert tags is not None
    schema = GrammarSpec("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}))
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    (brace,), (word,) = (tokenizer.encode(text, add_special_tokens=False) for text in ("{", "hello"))

    def allowed(grammar: Grammar, token: int) -> bool:
        return bool(grammar.next_token_mask()[0, token // 32] >> (token % 32) & 1)

    try:
        grammar = GrammarAfterThought(compiler.matcher(schema), tags, opened=False)
        assert allowed(grammar, tags.open_id) and allowed(grammar, brace) and not allowed(grammar, word)
        assert grammar.advance(tags.open_id, tokenizer, 0) == []  # the answer reasons first
        assert allowed(grammar, word) and allowed(grammar, tags.close_id) and allowed(grammar, tokenizer.eos_token_id)
        grammar.advance(word, tokenizer, 0)
        grammar.advance(tags.close_id, tokenizer, 0)
        assert allowed(grammar, brace) and not allowed(grammar, word) and not allowed(grammar, tags.open_id)
        for token in tokenizer.encode('{"a": 1}', add_special_tokens=False):
            assert not grammar.is_terminated
            grammar.advance(token, tokenizer, 0)
        grammar.advance(tokenizer.eos_token_id, tokenizer, 0)
        assert grammar.is_terminated

        direct = GrammarAfterThought(compiler.matcher(schema), tags, opened=False)
        direct.advance(brace, tokenizer, 0)  # no <think> first: held to the grammar from the first token
        assert not allowed(direct, tags.open_id) and not allowed(direct, word)
        opened = GrammarAfterThought(compiler.matcher(schema), tags, opened=True)
        assert allowed(opened, word) and not opened.is_terminated  # the prompt opened the block
    finally:
        compiler.shutdown()


def test_a_constrained_answer_reasons_first(tmp_path: Path) -> None:
    """Where the prompt opened the block, a schema's answer thinks as a free one does, then writes its JSON:
    as content once </think> comes (forced here by its bias: the grammar masks it after)."""
    tokenizer = thinking_vocabulary()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}<think>\n"
    folder = build_tiny_model("llama", tmp_path / "model", vocab_size=len(tokenizer))
    tokenizer.save_pretrained(folder)
    srv = start_server(tmp_path, "--model", str(folder))
    try:
        schema = {"type": "object", "properties": {"a": {"type": "integer", "maximum": 9}}, "required": ["a"]}
        fields = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 24}
        free = srv.post("/v1/chat/completions", json=fields).json()["choices"][0]["message"]
        fields["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
        thinking = srv.post("/v1/chat/completions", json=fields).json()["choices"][0]["message"]
        assert thinking["reasoning_content"] == free["reasoning_content"] and free["reasoning_content"]
        assert thinking["content"] is None and free["content"] is None  # the tiny model never closes the block
        fields |= {"logit_bias": {str(tokenizer.convert_tokens_to_ids(CLOSE)): 100}, "max_tokens": 64}
        response = srv.post("/v1/chat/completions", json=fields)
        assert response.status_code == 200, response.text
        message = response.json()["choices"][0]["message"]
        assert message["reasoning_content"] is None and isinstance(json.loads(message["content"])["a"], int)
    finally:
        assert stop_server(srv) == 0, srv.log.read_text()[-3000:]


def test_a_thinking_gguf_keeps_its_tags_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp writes a thinking model's tags as USER_DEFINED tokens: read in place, they stay single
    tokens that decode to themselves, so the server finds them and a prompt's tag is seen."""
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    folder = tiny_with_bpe("qwen3", tmp_path / "model")
    template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}<think>\n"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens([OPEN, CLOSE])
    tokenizer.chat_template = template
    tokenizer.save_pretrained(folder)
    path = write_gguf(folder, tmp_path / "thinking.gguf", "qwen2", chat_template=template)
    converted = load_tokenizer(path)
    tags = think_tags(converted)
    assert tags == ThinkTags(*tokenizer.convert_tokens_to_ids([OPEN, CLOSE]))
    prompt = render_chat(converted, [{"role": "user", "content": "Hello world"}])
    assert tags.opened_by(prompt) and prompt == render_chat(tokenizer, [{"role": "user", "content": "Hello world"}])


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"chat_template": "{{ 'x' }}"}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": "yes"}, None),
        ({"messages": [{"role": "user", "content": "w5", "reasoning_content": "w6"}]}, "messages[0].reasoning_content"),
    ],
)
def test_bad_fields_are_a_400_naming_them(server: Server, fields: dict[str, Any], param: str | None) -> None:
    response = chat(server, **fields)
    assert response.status_code == 400, response.text
    if param is not None:
        assert response.json()["error"]["param"] == param


def test_an_earlier_turns_reasoning_is_accepted(server: Server) -> None:
    answer = {"role": "assistant", "content": "w20", "reasoning_content": "w21"}
    history = [*ASK, answer, {"role": "user", "content": "w22"}]
    assert chat(server, messages=history).status_code == 200


def test_reasoning_parser_none_leaves_the_answer_whole(
    thinking_model: tuple[Path, list[int]], tmp_path: Path
) -> None:
    srv = start_server(tmp_path, "--model", str(thinking_model[0]), "--reasoning-parser", "none")
    try:
        message = chat(srv).json()["choices"][0]["message"]
        assert "reasoning_content" not in message and message["content"] == raw_answer(srv, thinking_model[0])
        assert CLOSE in message["content"]
    finally:
        assert stop_server(srv) == 0, srv.log.read_text()[-3000:]
