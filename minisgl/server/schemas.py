"""Request bodies of the HTTP API, decoded and type-checked by msgspec in one pass.

Unknown fields are ignored (clients send many optional OpenAI fields); fields that would change
the output in a way this engine cannot honour are accepted only at their no-op values.

Every integer must fit a signed 64-bit integer (what the msgpack messages to the scheduler and
torch can hold); floats are finite because JSON has no NaN or infinity and msgspec refuses numbers
beyond float64. Ranges that depend on the model (token ids, context) are checked later.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

import msgspec
import numpy as np
from starlette.requests import Request

from minisgl.server.errors import ApiError

T = TypeVar("T")

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
# Far deeper than any real request; msgspec recurses once per level, even in unknown fields it skips.
MAX_JSON_DEPTH = 64
MAX_MESSAGES = 1024  # each message is rendered by the chat template on the event loop


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers
    name: str | None = None
    reasoning_content: str | None = None  # an assistant turn's reasoning, for templates that render it


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    name: str | None = None
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None  # the output always matches the schema, whatever this says


class ResponseFormat(msgspec.Struct, kw_only=True):
    """OpenAI's ``response_format``: "text", "json_object", or "json_schema" with ``json_schema``."""

    type: str
    json_schema: JsonSchemaFormat | None = None


Messages = Annotated[list[ChatMessage], msgspec.Meta(max_length=MAX_MESSAGES)]


class OpenAISampling(msgspec.Struct, kw_only=True):
    """Fields shared by /v1/chat/completions and /v1/completions. ``None`` means "default"."""

    model: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: Int64 | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int64 | None = None
    min_p: float | None = None
    seed: Int64 | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Int64] | None = None
    ignore_eos: bool | None = None
    n: Int64 | None = None
    cache_salt: str | None = None  # prefix-cache namespace: only requests with the same salt share
    response_format: ResponseFormat | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token ids as strings, as OpenAI's API sends them

    def unsupported(self) -> str | None:
        """Name of a field set to something this engine does not implement."""
        return None


class ChatCompletionRequest(OpenAISampling, kw_only=True):
    messages: Messages
    max_completion_tokens: Int64 | None = None  # the newer name of max_tokens; wins when both are set
    logprobs: bool | None = None  # each output token's log-probability ...
    top_logprobs: Int64 | None = None  # ... with this many most likely tokens at its position
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # a forced call is one call; in "auto" the model may make several
    chat_template_kwargs: dict[str, Any] | None = None  # more variables for the chat template (enable_thinking)


class CompletionRequest(OpenAISampling, kw_only=True):
    # A string, a list of token ids, or a batch of either; shapes are checked in the handler
    # (msgspec unions allow a single array type).
    prompt: str | list[str | Int64 | list[Int64]]
    logprobs: Int64 | None = None  # each output token's log-probability, with this many most likely tokens
    echo: bool | None = None
    suffix: str | None = None
    best_of: Int64 | None = None

    def unsupported(self) -> str | None:
        if self.suffix:
            return "suffix"
        if self.best_of not in (None, 1):
            return "best_of"
        return super().unsupported()


class NativeSamplingParams(msgspec.Struct, kw_only=True):
    """``sampling_params`` of ``/generate`` (SGLang's names)."""

    max_new_tokens: Int64 | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: Int64 = -1
    min_p: float = 0.0
    seed: Int64 | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Int64] | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None


class GenerateRequest(msgspec.Struct, kw_only=True):
    text: str | None = None
    input_ids: list[Int64] | None = None
    sampling_params: NativeSamplingParams = msgspec.field(default_factory=NativeSamplingParams)
    stream: bool = False
    cache_salt: str | None = None
    return_logprob: bool = False  # each output token's log-probability ...
    top_logprobs_num: Int64 = 0  # ... with this many most likely tokens at its position
    return_text_in_logprobs: bool = False  # with each token's text
    logprob_start_len: Int64 = -1  # >= 0: the prompt's tokens' too, from this position on (-1: none)


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """``/tokenize`` (vLLM's shape): ``prompt`` text, or chat ``messages`` (with the ``tools`` offered and the
    ``chat_template_kwargs``)."""

    model: str | None = None
    prompt: str | None = None
    messages: Messages | None = None
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[Int64]


def stop_list(stop: str | list[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


def logit_bias_of(bias: dict[str, float] | None) -> dict[int, float]:
    """``logit_bias`` keyed by token id: JSON's keys are strings of decimal ids (a 400 for any other key);
    the ids' and values' ranges are ``SamplingParams.validate``'s."""
    parsed: dict[int, float] = {}
    for key, value in (bias or {}).items():
        if _TOKEN_ID.fullmatch(key) is None:
            raise ApiError(400, f"logit_bias keys must be token ids, got {key!r}", param="logit_bias")
        parsed[int(key)] = value
    return parsed


_TOKEN_ID = re.compile(r"-?[0-9]{1,19}")  # a sign and the digits of a 64-bit integer at most


_PATH = re.compile(r"at `\$\.?([^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]*)`")


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refusing (413) anything over ``limit`` bytes without buffering all of it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body of over {size} bytes exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')  # once escapes are gone, a string cannot contain a quote
_OPEN, _CLOSE = np.frombuffer(b"[{", np.uint8), np.frombuffer(b"]}", np.uint8)


def json_depth(body: bytes) -> int:
    """How deeply arrays and objects nest in ``body`` (brackets inside strings do not count).

    Linear time (regular expressions without backtracking, then numpy), so it can look at a body
    before the parser does. Malformed JSON gets some number: the parser rejects it anyway."""
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return 0  # too few brackets to nest too deeply: the common case costs two counts
    structure = np.frombuffer(_STRING.sub(b"", _ESCAPE.sub(b"", body)), np.uint8)
    steps = np.isin(structure, _OPEN).astype(np.int64) - np.isin(structure, _CLOSE)
    return int(np.cumsum(steps).max(initial=0))


def decode_body(body: bytes, schema: type[T]) -> T:
    """Decode JSON into ``schema``; a malformed, mistyped or too deeply nested body is a 400."""
    depth = json_depth(body)
    if depth > MAX_JSON_DEPTH:
        raise ApiError(400, f"JSON nested {depth} levels deep; the limit is {MAX_JSON_DEPTH}")
    try:
        return msgspec.json.decode(body, type=schema)
    except msgspec.ValidationError as e:
        message = str(e)
        where = _PATH.search(message) or _MISSING.search(message)
        raise ApiError(400, f"invalid request: {message}", param=where.group(1) if where else None) from None
    except msgspec.DecodeError as e:
        raise ApiError(400, f"invalid JSON body: {e}") from None
