"""``/v1/chat/completions`` and ``/v1/completions`` with OpenAI's semantics (temperature defaults to 1, or to the
model's own default: ``SamplingDefaults``)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from transformers import PreTrainedTokenizerBase

from minisgl.constrained.spec import JSON_OBJECT_SCHEMA
from minisgl.constrained.tool_calls import (
    Tool,
    forced_call_grammar,
    parse_tools,
    tool_choice_name,
)
from minisgl.sampling import MAX_TOP_LOGPROBS, SamplingParams, TokenLogprob
from minisgl.server.chat_output import ChatOutput
from minisgl.server.context import ServerContext, wait_for_disconnect
from minisgl.server.engine_client import EngineDead
from minisgl.server.errors import ApiError
from minisgl.server.generation import Generation, Sample, SampleFailed, failure_error
from minisgl.server.logprobs import ChatLogprobs, CompletionLogprobs, LogprobsFormat
from minisgl.server.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    OpenAISampling,
    ResponseFormat,
    decode_body,
    logit_bias_of,
    stop_list,
)
from minisgl.server.streaming import SSE_DONE, GenerationStream, sse
from minisgl.text.chat import TemplateVariableError, render_chat

DEFAULT_MAX_TOKENS = 256  # when the client sets none: up to this many, never past the context
MAX_N = 4
MAX_BATCH_PROMPTS = 32
_ROLES = {"system", "developer", "user", "assistant", "tool"}
# SamplingParams fields these routes fill from a request field of another name. The engine's errors
# name the former; the client sent the latter (OpenAI's own errors say "response_format" for a bad schema).
_REQUEST_FIELDS = {"json_schema": "response_format", "ebnf": "tools"}


def openai_router(ctx: ServerContext) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = decode_body(await ctx.body(request), ChatCompletionRequest)
        _check_common(ctx, body)
        tools, choice = _tools(body)
        offered = tools if choice != "none" else []
        prompts = [chat_prompt_ids(ctx.tokenizer, body.messages, offered, body.chat_template_kwargs)]
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        top_logprobs = _chat_top_logprobs(body)
        params = _params(ctx, body, prompts, max_tokens, top_logprobs, _forced_call(tools, choice))
        # A grammar (response_format, a forced call) holds after the reasoning, as vLLM's and SGLang's do.
        params = replace(params, think_tags=ctx.think_tags)
        meta = _Meta("chatcmpl", "chat.completion", ctx.model_name)
        logprobs = ChatLogprobs(ctx.token_bytes) if top_logprobs is not None else None
        output = ChatOutput(offered, None if ctx.think_tags is None else ctx.think_tags.opened_by(prompts[0]))
        with _request_fields():
            gen = ctx.generation(prompts, params, body.n or 1, body.cache_salt)
            return await _respond(request, gen, body, meta, output.choice, output.chunk, logprobs, None)

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = decode_body(await ctx.body(request), CompletionRequest)
        _check_common(ctx, body)
        prompts = completion_prompt_ids(ctx.tokenizer, body.prompt)
        params = _params(ctx, body, prompts, body.max_tokens, body.logprobs)
        echo = _prompt_texts(ctx.tokenizer, body.prompt, prompts) if body.echo else None
        if echo is not None and body.logprobs is not None:  # the echoed prompt's tokens are listed too
            params = replace(params, prompt_logprobs=body.logprobs)
        meta = _Meta("cmpl", "text_completion", ctx.model_name)
        logprobs = CompletionLogprobs(ctx.token_bytes) if body.logprobs is not None else None
        with _request_fields():
            gen = ctx.generation(prompts, params, body.n or 1, body.cache_salt)
            return await _respond(request, gen, body, meta, _completion_choice, _completion_chunk, logprobs, echo)

    return router


# -- prompts -----------------------------------------------------------------------------------
def chat_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[ChatMessage],
    tools: list[Tool] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """The messages checked, then rendered by ``render_chat`` like every other front end (with
    ``tools``, and calls and results in the history, as ``prepare_conversation`` explains, and the
    request's ``chat_template_kwargs``)."""
    if not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    conversation = []
    for i, m in enumerate(messages):
        if m.role not in _ROLES:
            raise ApiError(
                400, f"messages[{i}].role must be one of {sorted(_ROLES)}, got {m.role!r}", param=f"messages[{i}].role"
            )
        if m.content is None and not (m.role == "assistant" and m.tool_calls):  # a turn of tool calls alone
            what = "an assistant message without tool_calls" if m.role == "assistant" else f"a {m.role} message"
            raise ApiError(400, f"messages[{i}].content is required in {what}", param=f"messages[{i}].content")
        if isinstance(m.content, list):
            if any(part.type != "text" or part.text is None for part in m.content):
                raise ApiError(400, "only text content parts are supported", param=f"messages[{i}].content")
            content = "".join(part.text or "" for part in m.content)
        else:
            content = m.content or ""
        message: dict[str, Any] = {"role": m.role, "content": content}
        if m.tool_calls:
            if m.role != "assistant":
                raise ApiError(400, "only assistant messages carry tool_calls", param=f"messages[{i}].tool_calls")
            message["tool_calls"] = _checked_calls(m.tool_calls, f"messages[{i}].tool_calls")
        if m.reasoning_content is not None:
            if m.role != "assistant":
                where = f"messages[{i}].reasoning_content"
                raise ApiError(400, "only assistant messages carry reasoning_content", param=where)
            message["reasoning_content"] = m.reasoning_content
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        conversation.append(message)
    try:
        return render_chat(tokenizer, conversation, tools or [], template_kwargs)
    except TemplateVariableError as e:
        raise ApiError(400, str(e), param="chat_template_kwargs") from None
    except ValueError as e:  # e.g. a template that rejects this order of roles, or bad call arguments
        raise ApiError(400, str(e), param="messages") from None


def _checked_calls(calls: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    for j, call in enumerate(calls):
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(
                400, f'{where}[{j}] must be {{"type": "function", "function": {{"name", "arguments"}}}}', param=where
            )
        if not isinstance(function.get("arguments", "{}"), str):
            raise ApiError(400, f"{where}[{j}].function.arguments must be JSON text", param=where)
    return calls


def completion_prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: str | list[Any]) -> list[list[int]]:
    """A string, a list of token ids, or a batch of strings / token-id lists."""
    if isinstance(prompt, str):
        prompt = [prompt]
    elif prompt and all(isinstance(t, int) for t in prompt):
        return [list(prompt)]
    if not prompt or not (all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt)):
        message = "prompt must be a non-empty string, a list of token ids, or a list of either"
        raise ApiError(400, message, param="prompt")
    if len(prompt) > MAX_BATCH_PROMPTS:
        raise ApiError(400, f"at most {MAX_BATCH_PROMPTS} prompts per request, got {len(prompt)}", param="prompt")
    if any(p == "" for p in prompt):
        raise ApiError(400, "prompt is empty", param="prompt")
    return [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt]


def _prompt_texts(tokenizer: PreTrainedTokenizerBase, prompt: str | list[Any], ids: list[list[int]]) -> list[str]:
    """The text of each prompt that ``completion_prompt_ids`` read: as sent, or its ids decoded."""
    sent: list[Any] = [prompt] if isinstance(prompt, str) or all(isinstance(t, int) for t in prompt) else prompt
    return [p if isinstance(p, str) else tokenizer.decode(i, skip_special_tokens=True) for p, i in zip(sent, ids)]


# -- parameters --------------------------------------------------------------------------------
@contextmanager
def _request_fields() -> Iterator[None]:
    """An ``ApiError`` raised inside (by validation or the scheduler's answer) names the request's field."""
    try:
        yield
    except ApiError as e:
        if e.param in _REQUEST_FIELDS:
            e.param = _REQUEST_FIELDS[e.param]
        raise


def _check_common(ctx: ServerContext, body: OpenAISampling) -> None:
    ctx.check_model(body.model)
    unsupported = body.unsupported()
    if unsupported is not None:
        raise ApiError(400, f"{unsupported} is not supported by this server", param=unsupported)
    if body.n is not None and not 1 <= body.n <= MAX_N:
        raise ApiError(400, f"n must be in [1, {MAX_N}], got {body.n}", param="n")


def checked_tools(tools: list[dict[str, Any]] | None) -> list[Tool]:
    """A request's ``tools``, parsed (a 400 naming ``tools`` where one is malformed)."""
    try:
        return parse_tools(tools or [])
    except ValueError as e:
        raise ApiError(400, str(e), param="tools") from None


def _tools(body: ChatCompletionRequest) -> tuple[list[Tool], str]:
    """The request's tools, checked, and its tool_choice: "auto" | "none" | "required" | a function name."""
    tools = checked_tools(body.tools)
    try:
        return tools, tool_choice_name(body.tool_choice, tools)
    except ValueError as e:
        raise ApiError(400, str(e), param="tool_choice") from None


def _chat_top_logprobs(body: ChatCompletionRequest) -> int | None:
    """The alternatives per token that a chat request asks log-probabilities of; None: no log-probabilities.
    ``top_logprobs`` needs ``logprobs: true`` (OpenAI's rule), but at its no-op value 0."""
    if body.top_logprobs and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    if not body.logprobs:
        return None
    top = body.top_logprobs or 0
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}", param="top_logprobs")
    return top


def _forced_call(tools: list[Tool], choice: str) -> str | None:
    try:
        return forced_call_grammar(tools, choice)
    except ValueError as e:
        raise ApiError(400, str(e), param="tools") from None


def _response_format_schema(response_format: ResponseFormat | None) -> str | None:
    """The JSON schema (as text) that ``response_format`` asks the output to match, if any."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return JSON_OBJECT_SCHEMA
    if response_format.type == "json_schema":
        spec = response_format.json_schema
        if spec is None or spec.schema is None:
            message = 'response_format of type "json_schema" needs json_schema.schema'
            raise ApiError(400, message, param="response_format.json_schema")
        return json.dumps(spec.schema)
    message = f'response_format.type must be "text", "json_object" or "json_schema", got {response_format.type!r}'
    raise ApiError(400, message, param="response_format.type")


def _params(
    ctx: ServerContext,
    body: OpenAISampling,
    prompts: list[list[int]],
    max_tokens: int | None,
    logprobs: int | None,
    forced_call: str | None = None,
) -> SamplingParams:
    schema = _response_format_schema(body.response_format)
    if schema is not None and forced_call is not None:
        message = "response_format cannot be combined with a tool_choice that forces a call"
        raise ApiError(400, message, param="response_format")
    defaults = ctx.sampling_defaults
    return SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else ctx.default_max_tokens(prompts, DEFAULT_MAX_TOKENS),
        temperature=defaults.temperature if body.temperature is None else body.temperature,
        top_k=defaults.top_k if body.top_k is None else body.top_k,
        top_p=defaults.top_p if body.top_p is None else body.top_p,
        min_p=defaults.min_p if body.min_p is None else body.min_p,
        seed=body.seed,
        stop=stop_list(body.stop),
        stop_token_ids=body.stop_token_ids or [],
        ignore_eos=bool(body.ignore_eos),
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        logit_bias=logit_bias_of(body.logit_bias),
        logprobs=logprobs,
        json_schema=schema,
        ebnf=forced_call,
    )


# -- responses ---------------------------------------------------------------------------------
class _Meta:
    """Fields every response object and chunk of one request repeats."""

    def __init__(self, id_prefix: str, obj: str, model: str) -> None:
        self.id, self.object, self.model = f"{id_prefix}-{uuid.uuid4().hex}", obj, model
        self.created = int(time.time())

    def wrap(self, obj: str, **fields: Any) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, **fields}


def _prompt_logprobs(sample: Sample) -> list[TokenLogprob | None]:
    """Its prompt tokens' log-probabilities (None for the first): what an echoed prompt lists."""
    assert sample.prompt_logprobs is not None, "an echo with logprobs asks for the prompt's"
    return sample.prompt_logprobs


def _usage(gen: Generation) -> dict[str, Any]:
    u = gen.usage()
    return {
        "prompt_tokens": u["prompt_tokens"],
        "completion_tokens": u["completion_tokens"],
        "total_tokens": u["total_tokens"],
        "prompt_tokens_details": {"cached_tokens": u["cached_tokens"]},
    }


def _completion_choice(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": None}


def _completion_chunk(index: int, text: str | None, finish_reason: str | None) -> dict[str, Any] | None:
    if text is None:
        return None  # completions have no opening chunk
    return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": None}


Choice = Callable[[int, str, str | None], dict[str, Any]]
Chunk = Callable[[int, str | None, str | None], dict[str, Any] | None]


async def _respond(
    request: Request,
    gen: Generation,
    body: OpenAISampling,
    meta: _Meta,
    choice: Choice,
    chunk: Chunk,
    logprobs: LogprobsFormat | None,
    echo: list[str] | None,
) -> Response:
    """``logprobs``: the shape of each choice's ``logprobs`` where the request asks for them (else null);
    ``echo``: each prompt's text, where a choice starts with its prompt (then so do its ``logprobs``)."""
    await gen.start()
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return GenerationStream(_stream(gen, meta, chunk, include_usage, logprobs, echo), gen)
    try:
        finished = await gen.run(wait_for_disconnect(request))
    except (EngineDead, SampleFailed) as e:
        raise failure_error(e) from None
    if not finished:
        return Response(status_code=499)  # nobody is listening; the samples were aborted
    choices = []
    for s in gen.samples:
        if echo is None:
            c = choice(s.index, s.text, s.finish_reason)
            if logprobs is not None:
                c["logprobs"] = logprobs(s.index, s.output_ids, s.logprobs)
        else:
            c = choice(s.index, echo[s.prompt_index] + s.text, s.finish_reason)
            if logprobs is not None:
                c["logprobs"] = logprobs(s.index, s.prompt_ids + s.output_ids, [*_prompt_logprobs(s), *s.logprobs])
        choices.append(c)
    return JSONResponse(meta.wrap(meta.object, choices=choices, usage=_usage(gen)))


async def _stream(
    gen: Generation,
    meta: _Meta,
    chunk: Chunk,
    include_usage: bool,
    logprobs: LogprobsFormat | None,
    echo: list[str] | None,
) -> AsyncIterator[bytes]:
    obj = f"{meta.object}.chunk" if meta.object == "chat.completion" else meta.object
    for s in gen.samples:
        opening = chunk(s.index, None, None)
        if opening is not None:
            yield sse(meta.wrap(obj, choices=[opening]))
    # Per choice, the tokens (and their log-probabilities) that no chunk has carried yet: those whose
    # text is still held back go with the chunk that carries it.
    unsent: dict[int, tuple[list[int], list[TokenLogprob]]] = {}
    echoed: set[int] = set()
    try:
        async for d in gen.deltas():
            s = d.sample
            if echo is not None and s.index not in echoed:  # its prompt, once its log-probabilities are in
                echoed.add(s.index)
                prompt = chunk(s.index, echo[s.prompt_index], None)
                if prompt is not None:
                    if logprobs is not None:
                        prompt["logprobs"] = logprobs(s.index, s.prompt_ids, _prompt_logprobs(s))
                    yield sse(meta.wrap(obj, choices=[prompt]))
            ids, lps = unsent.setdefault(s.index, ([], []))
            ids += d.token_ids
            lps += d.logprobs
            if d.text or d.finish_reason:
                choice = chunk(s.index, d.text, d.finish_reason)
                if choice is not None:  # text a tool-call parser holds back
                    if logprobs is not None:
                        choice["logprobs"] = logprobs(s.index, ids, lps)
                    del unsent[s.index]
                    yield sse(meta.wrap(obj, choices=[choice]))
    except (EngineDead, SampleFailed) as e:
        yield sse(failure_error(e).body())
        return
    if include_usage:
        yield sse(meta.wrap(obj, choices=[], usage=_usage(gen)))
    yield SSE_DONE
