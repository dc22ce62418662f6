"""Grammars against plain references, without a model: random logits masked by a grammar must walk to
text that Python's ``re`` / ``jsonschema`` / ``json`` accept; the batched mask must equal the per-row
mask; bad grammars are ``ValueError``s naming the problem. Tool-call parsing and prompt rendering."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import jsonschema
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from minisgl.constrained.compiler import GrammarCompiler
from minisgl.constrained.matcher import GrammarMatcher, mask_logits
from minisgl.constrained.spec import JSON_OBJECT_SCHEMA, GrammarSpec
from minisgl.constrained.tool_calls import (
    CALL_END,
    CALL_START,
    ToolCallParser,
    forced_call_grammar,
    parse_tool_calls,
    parse_tools,
    prepare_conversation,
    tool_choice_name,
)
from minisgl.models.source import resolve_model_path
from minisgl.sampling import SamplingParams

EOS = 2  # SmolLM2's <|im_end|>


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(resolve_model_path(None)))


@pytest.fixture(scope="module")
def compiler(tokenizer: PreTrainedTokenizerBase) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, len(tokenizer), [EOS])


def walk(matcher: GrammarMatcher, tokenizer: PreTrainedTokenizerBase, seed: int, max_tokens: int = 200) -> str:
    """Sample from random logits under the grammar until it terminates; the text produced."""
    generator = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    for _ in range(max_tokens):
        logits = torch.randn(1, len(tokenizer), generator=generator)
        # A bias towards the stop token keeps random walks short once the grammar may end.
        logits[0, EOS] += 4.0
        mask_logits(logits, [matcher])
        token = int(torch.multinomial(torch.softmax(logits[0], -1), 1, generator=generator))
        assert matcher.accept(token), "a token the mask allowed was rejected"
        if matcher.is_terminated:
            return tokenizer.decode(ids)
        ids.append(token)
    pytest.fail(f"grammar did not terminate in {max_tokens} tokens: {tokenizer.decode(ids)!r}")


# Bounded repetitions only: a random walk through ``[a-z]+`` would rarely pick the one token that ends it.
REGEXES = [r"[0-9]{3}-[0-9]{4}", r"(yes|no|maybe)", r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)", r"-?[1-9][0-9]{0,3}(\.[0-9]{1,2})?"]


@settings(max_examples=12, deadline=None, derandomize=True)
@given(pattern=st.sampled_from(REGEXES), seed=st.integers(0, 2**31))
def test_regex_walks_match_python_re(compiler: GrammarCompiler, tokenizer: PreTrainedTokenizerBase, pattern: str, seed: int) -> None:
    text = walk(compiler.matcher(GrammarSpec("regex", pattern)), tokenizer, seed)
    assert re.fullmatch(pattern, text), text


SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": -5, "maximum": 5}}, "required": ["a"]},
    {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["x", "y", "z"]}, "minItems": 1, "maxItems": 3},
            "ok": {"type": "boolean"},
        },
        "required": ["tags", "ok"],
    },
    {"anyOf": [{"type": "string", "pattern": "^[A-Z]{2}$"}, {"type": "number", "minimum": 0, "maximum": 1}]},
    {
        "type": "object",
        "properties": {"inner": {"type": "object", "properties": {"n": {"type": "null"}}, "required": ["n"]}},
        "required": ["inner"],
    },
]


@settings(max_examples=12, deadline=None, derandomize=True)
@given(index=st.integers(0, len(SCHEMAS) - 1), seed=st.integers(0, 2**31))
def test_json_schema_walks_validate(compiler: GrammarCompiler, tokenizer: PreTrainedTokenizerBase, index: int, seed: int) -> None:
    schema = SCHEMAS[index]
    text = walk(compiler.matcher(GrammarSpec("json_schema", json.dumps(schema))), tokenizer, seed)
    jsonschema.validate(json.loads(text), schema)


def test_json_object_allows_any_object(compiler: GrammarCompiler, tokenizer: PreTrainedTokenizerBase) -> None:
    matcher = compiler.matcher(GrammarSpec("json_schema", JSON_OBJECT_SCHEMA))
    for token in tokenizer.encode('{"free": [1, {"x": null}]}'):
        assert matcher.accept(token)
    assert matcher.accept(EOS) and matcher.is_terminated
    array = compiler.matcher(GrammarSpec("json_schema", JSON_OBJECT_SCHEMA))
    assert not array.accept(tokenizer.encode("[")[0])  # an object, not any JSON value


def test_batched_mask_equals_row_masks(compiler: GrammarCompiler, tokenizer: PreTrainedTokenizerBase) -> None:
    """Rows with grammars get exactly their own mask, also a row moved off its start state (whose
    mask is filled anew); rows without one are untouched; logits past the tokenizer's vocabulary are
    never allowed."""
    vocab = len(tokenizer)
    specs = [GrammarSpec("regex", r) for r in REGEXES] + [GrammarSpec("json_schema", json.dumps(s)) for s in SCHEMAS]
    matchers: list[GrammarMatcher | None] = [compiler.matcher(s) for s in specs]
    for token in tokenizer.encode("12"):  # move one matcher off its start state
        assert matchers[3].accept(token)  # type: ignore[union-attr]
    matchers.insert(2, None)
    logits = torch.randn(len(matchers), vocab + 64)  # an LM head padded past the vocabulary
    original = logits.clone()
    mask_logits(logits, matchers)
    assert torch.equal(logits[2], original[2])
    for i, m in enumerate(matchers):
        if m is None:
            continue
        row = original[i : i + 1, :vocab].clone()
        mask_logits(row, [m])
        assert torch.equal(logits[i, :vocab], row[0]), i
        assert torch.isinf(logits[i, vocab:]).all()
        allowed = torch.isfinite(logits[i]).nonzero().flatten().tolist()
        assert 0 < len(allowed) < vocab


def test_jump_forward_appends_forced_text(compiler: GrammarCompiler, tokenizer: PreTrainedTokenizerBase) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    matcher = compiler.matcher(GrammarSpec("json_schema", json.dumps(schema)))
    forced = matcher.jump_forward(tokenizer, limit=100)
    assert tokenizer.decode(forced) == '{"city": "'
    assert matcher.jump_forward(tokenizer, limit=100) == []  # inside the string nothing is forced
    limited = compiler.matcher(GrammarSpec("json_schema", json.dumps(schema)))
    assert len(limited.jump_forward(tokenizer, limit=1)) == 1


def test_advance_takes_a_token_its_forced_text_and_fills_the_next_mask(
    compiler: GrammarCompiler, tokenizer: PreTrainedTokenizerBase
) -> None:
    """``advance`` (what runs off the scheduler loop) leaves the matcher where accepting the token and
    the forced text by hand does, with the same next mask already filled; a token the grammar
    rejects raises and changes nothing."""
    spec = GrammarSpec("json_schema", json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}))
    advanced, by_hand = compiler.matcher(spec), compiler.matcher(spec)
    brace = tokenizer.encode("{")[0]
    with pytest.raises(RuntimeError, match="outside the request's grammar"):
        advanced.advance(tokenizer.encode("[")[0], tokenizer, jump_limit=100)
    forced = advanced.advance(brace, tokenizer, jump_limit=100)
    assert tokenizer.decode([brace, *forced]) == '{"city": "'
    for token in [brace, *forced]:
        assert by_hand.accept(token)
    assert torch.equal(advanced.next_token_mask(), by_hand.next_token_mask())
    assert advanced.advance(tokenizer.encode("Paris")[0], tokenizer, jump_limit=0) == []  # nothing forced in a string


def test_compiled_grammars_are_cached_by_source(tokenizer: PreTrainedTokenizerBase) -> None:
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [EOS])
    spec = GrammarSpec("regex", "[ab]+")
    assert compiler.compile(spec) is compiler.compile(GrammarSpec("regex", "[ab]+"))
    assert (compiler.hits, compiler.misses) == (1, 1)
    compiler.compile(GrammarSpec("regex", "[abc]+"))
    assert compiler.misses == 2


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (GrammarSpec("json_schema", '{"type": "foo"}'), 'invalid json_schema: Unsupported type "foo"'),
        (GrammarSpec("json_schema", "{not json"), "invalid json_schema: not valid JSON"),
        (GrammarSpec("json_schema", "[1]"), "a schema is a JSON object"),
        (GrammarSpec("json_schema", '{"properties": {"a": {"not": {}}}}'), "unsupported json_schema feature: $.properties.a.not"),
        (GrammarSpec("json_schema", '{"$ref": "http://example.com/s"}'), "only local references"),
        (GrammarSpec("json_schema", '{"type": "array", "uniqueItems": true}'), "feature: $.uniqueItems"),
        (GrammarSpec("regex", "(ab"), "invalid regex: Regex parsing error at position 4"),
        (GrammarSpec("ebnf", "root ::= foo"), 'invalid ebnf: EBNF parser error at line 1, column 10: Rule "foo" is not defined'),
    ],
)
def test_bad_grammars_raise_value_errors(compiler: GrammarCompiler, spec: GrammarSpec, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        compiler.compile(spec)


def test_one_grammar_per_request() -> None:
    assert GrammarSpec.from_fields(None, "[ab]", None) == GrammarSpec("regex", "[ab]")
    assert GrammarSpec.from_fields(None, None, None) is None
    with pytest.raises(ValueError, match=r"at most one of json_schema, regex and ebnf"):
        GrammarSpec.from_fields(None, "a", 'root ::= "a"')
    with pytest.raises(ValueError, match="regex must be a non-empty string"):
        GrammarSpec.from_fields(None, " ", None)


def test_sampling_params_carry_one_grammar() -> None:
    params = SamplingParams(json_schema={"type": "object", "properties": {"b": {}, "a": {}}})
    assert params.grammar == GrammarSpec("json_schema", '{"type": "object", "properties": {"b": {}, "a": {}}}')
    assert SamplingParams().grammar is None
    with pytest.raises(ValueError, match=r"at most one of json_schema, regex and ebnf"):
        SamplingParams(regex="a", ebnf='root ::= "a"').validate(100)


# -- tool calling --------------------------------------------------------------------------------
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ([{"type": "function"}], 'tools[0] must be {"type": "function"'),
        ([{"type": "function", "function": {"name": "bad name"}}], "tools[0].function.name must be"),
        ([WEATHER, WEATHER], "tools[1].function.name 'get_weather' is used by an earlier tool"),
        ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], "tools[0].function.parameters"),
    ],
)
def test_malformed_tools_are_named(tools: list[Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_tools(tools)


def test_tool_choice_modes() -> None:
    tools = parse_tools([WEATHER, TIME])
    assert tool_choice_name(None, tools) == "auto" and tool_choice_name(None, []) == "none"
    assert tool_choice_name("required", tools) == "required"
    assert tool_choice_name({"type": "function", "function": {"name": "get_time"}}, tools) == "get_time"
    with pytest.raises(ValueError, match="not among the tools"):
        tool_choice_name({"type": "function", "function": {"name": "nope"}}, tools)
    with pytest.raises(ValueError, match="tool_choice must be"):
        tool_choice_name("sometimes", tools)
    assert forced_call_grammar(tools, "auto") is None and forced_call_grammar(tools, "none") is None


@pytest.mark.parametrize("choice", ["required", "get_weather"])
def test_forced_call_grammar_walks_parse_as_calls(
    tokenizer: PreTrainedTokenizerBase, compiler: GrammarCompiler, choice: str
) -> None:
    tools = parse_tools([WEATHER, TIME])
    ebnf = forced_call_grammar(tools, choice)
    assert ebnf is not None
    for seed in range(3):
        text = walk(compiler.matcher(GrammarSpec("ebnf", ebnf)), tokenizer, seed, max_tokens=400)
        content, calls = parse_tool_calls(text, {"get_weather", "get_time"})
        assert content is None and len(calls) == 1, text
        assert choice == "required" or calls[0].name == choice
        params = next(t.parameters for t in tools if t.name == calls[0].name)
        jsonschema.validate(json.loads(calls[0].arguments), params)


def test_parse_tool_calls_splits_content_and_calls() -> None:
    names = {"get_weather"}
    text = f'Let me check.\n{CALL_START}\n{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}\n{CALL_END}'
    content, calls = parse_tool_calls(text, names)
    assert content == "Let me check." and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    # Unknown function or broken JSON: the block stays content; no calls: the text is untouched.
    for bad in ['{"name": "other", "arguments": {}}', '{"name": "get_weather", "arguments": {']:
        text = f" a {CALL_START}{bad}{CALL_END}"
        assert parse_tool_calls(text, names) == (text, [])
    # An unterminated block at the end still counts when its JSON is a whole call.
    assert len(parse_tool_calls(f'{CALL_START}{{"name": "get_weather", "arguments": {{}}}}', names)[1]) == 1


@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.integers(0, 200), max_size=8))
def test_streamed_parse_equals_whole_parse(cuts: list[int]) -> None:
    """However the text is split into deltas, the content and calls add up to the whole-text parse."""
    call = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    text = f"Hi <tool <{CALL_START}\n{call}\n{CALL_END} and {CALL_START}{call}{CALL_END}<tool_c"
    parser = ToolCallParser({"get_weather"})
    content, calls = "", []
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    for a, b in itertools.pairwise(points):
        piece, new = parser.push(text[a:b])
        content, calls = content + piece, calls + new
    rest, last = parser.finish()
    content, calls = content + rest, calls + last
    whole_content, whole_calls = parse_tool_calls(text, {"get_weather"})
    assert calls == whole_calls and len(calls) == 2
    assert content.strip() == whole_content


def test_tools_rendered_for_a_template_without_tools() -> None:
    tools = parse_tools([WEATHER])
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]  # fmt: skip
    messages, extra = prepare_conversation(history, tools, template_tools=False)
    assert extra == {}
    assert messages[0]["role"] == "system" and '"name": "get_weather"' in messages[0]["content"]
    assert messages[2]["content"] == f'{CALL_START}\n{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}\n{CALL_END}'
    assert messages[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}
    # A template that renders tools gets them as an argument, and the arguments as an object.
    messages, extra = prepare_conversation(history, tools, template_tools=True)
    assert extra == {"tools": [WEATHER]}
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert messages[2] == history[2]
