"""The native API: ``POST /generate``, shaped like SGLang's (``text`` or ``input_ids`` in, ``text``,
``output_ids`` and ``meta_info`` out; streamed chunks carry the text so far), and ``POST /tokenize`` and
``POST /detokenize``, shaped like vLLM's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from minisgl.sampling import MAX_TOP_LOGPROBS, SamplingParams, TokenLogprob
from minisgl.server.context import ServerContext, wait_for_disconnect
from minisgl.server.engine_client import EngineDead
from minisgl.server.errors import ApiError
from minisgl.server.generation import Generation, Sample, SampleFailed, failure_error
from minisgl.server.openai_api import chat_prompt_ids, checked_tools
from minisgl.server.schemas import (
    DetokenizeRequest,
    GenerateRequest,
    TokenizeRequest,
    decode_body,
    logit_bias_of,
    stop_list,
)
from minisgl.server.streaming import SSE_DONE, GenerationStream, sse
from minisgl.text.token_bytes import TokenBytes

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default


def native_router(ctx: ServerContext) -> APIRouter:
    router = APIRouter()

    @router.post("/generate")
    async def generate(request: Request) -> Response:
        body = decode_body(await ctx.body(request), GenerateRequest)
        if (body.text is None) == (body.input_ids is None):
            raise ApiError(400, "give exactly one of text or input_ids", param="text")
        if body.text == "":
            raise ApiError(400, "prompt is empty", param="text")
        prompt = ctx.tokenizer.encode(body.text) if body.text is not None else list(body.input_ids or [])
        if not 0 <= body.top_logprobs_num <= MAX_TOP_LOGPROBS:
            message = f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}], got {body.top_logprobs_num}"
            raise ApiError(400, message, param="top_logprobs_num")
        if not -1 <= body.logprob_start_len < len(prompt):
            start = body.logprob_start_len
            message = f"logprob_start_len must be -1 or a prompt position in [0, {len(prompt)}), got {start}"
            raise ApiError(400, message, param="logprob_start_len")
        scores_prompt = body.return_logprob and body.logprob_start_len >= 0
        sp = body.sampling_params
        params = SamplingParams(
            max_tokens=sp.max_new_tokens
            if sp.max_new_tokens is not None
            else ctx.default_max_tokens([prompt], DEFAULT_MAX_NEW_TOKENS),
            temperature=sp.temperature,
            top_k=sp.top_k,
            top_p=sp.top_p,
            min_p=sp.min_p,
            seed=sp.seed,
            stop=stop_list(sp.stop),
            stop_token_ids=sp.stop_token_ids or [],
            ignore_eos=sp.ignore_eos,
            presence_penalty=sp.presence_penalty,
            frequency_penalty=sp.frequency_penalty,
            logit_bias=logit_bias_of(sp.logit_bias),
            logprobs=body.top_logprobs_num if body.return_logprob else None,
            prompt_logprobs=body.top_logprobs_num if scores_prompt else None,
            json_schema=sp.json_schema,
            regex=sp.regex,
            ebnf=sp.ebnf,
        )
        gen = ctx.generation([prompt], params, 1, body.cache_salt)
        shape = _LogprobShape(ctx.token_bytes if body.return_text_in_logprobs else None, body.logprob_start_len)
        await gen.start()
        if body.stream:
            return GenerationStream(_stream(gen, shape), gen)
        try:
            finished = await gen.run(wait_for_disconnect(request))
        except (EngineDead, SampleFailed) as e:
            raise failure_error(e) from None
        if not finished:
            return Response(status_code=499)
        return JSONResponse(_result(gen.samples[0], shape))

    @router.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        """The ids a prompt is given to the model as: ``prompt`` as ``/v1/completions`` encodes its text,
        ``messages`` (and ``tools``, ``chat_template_kwargs``) as ``/v1/chat/completions`` renders them."""
        body = decode_body(await ctx.body(request), TokenizeRequest)
        ctx.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(400, "give exactly one of prompt or messages", param="prompt")
        if body.messages is None:
            ids = ctx.tokenizer.encode(body.prompt)
        else:
            ids = chat_prompt_ids(ctx.tokenizer, body.messages, checked_tools(body.tools), body.chat_template_kwargs)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": ctx.context_len})

    @router.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        """The text of ``tokens``, special tokens included: what ``/tokenize`` gave, back."""
        body = decode_body(await ctx.body(request), DetokenizeRequest)
        ctx.check_model(body.model)
        vocab = len(ctx.tokenizer)
        if any(not 0 <= t < vocab for t in body.tokens):
            raise ApiError(400, f"tokens must be token ids in [0, {vocab})", param="tokens")
        return JSONResponse({"prompt": ctx.tokenizer.decode(body.tokens)})

    return router


@dataclass(frozen=True)
class _LogprobShape:
    """How a result lists log-probabilities (SGLang's shape): [logprob, token id, text] per token, the text
    only where ``texts`` is given; the prompt's from ``start`` on (-1: none), null for its first token."""

    texts: TokenBytes | None
    start: int

    def entry(self, logprob: float | None, token_id: int) -> list[Any]:
        return [logprob, token_id, self.texts.text_of(token_id) if self.texts is not None else None]

    def tokens(self, token_ids: list[int], logprobs: Sequence[TokenLogprob | None]) -> tuple[list[Any], list[Any]]:
        """An entry per token, and a list of entries per token (None where nothing predicts the token)."""
        entries = [self.entry(None if lp is None else lp.logprob, t) for t, lp in zip(token_ids, logprobs)]
        tops = [None if lp is None else [self.entry(v, i) for i, v in lp.top] for lp in logprobs]
        return entries, tops


def _result(s: Sample, shape: _LogprobShape) -> dict[str, Any]:
    """With log-probabilities: ``output_token_logprobs`` and ``output_top_logprobs``, and where the prompt's
    are asked for ``input_token_logprobs`` and ``input_top_logprobs`` (``_LogprobShape``)."""
    meta: dict[str, Any] = {
        "id": str(s.rid),
        "prompt_tokens": len(s.prompt_ids),
        "completion_tokens": len(s.output_ids),
        "cached_tokens": s.cached_tokens,
        "finish_reason": None if s.finish_reason is None else {"type": s.finish_reason},
    }
    if s.params.logprobs is not None:
        meta["output_token_logprobs"], meta["output_top_logprobs"] = shape.tokens(s.output_ids, s.logprobs)
    if s.prompt_logprobs is not None:
        start = shape.start
        meta["input_token_logprobs"], meta["input_top_logprobs"] = shape.tokens(
            s.prompt_ids[start:], s.prompt_logprobs[start:]
        )
    return {"text": s.text, "output_ids": s.output_ids, "meta_info": meta}


async def _stream(gen: Generation, shape: _LogprobShape) -> AsyncIterator[bytes]:
    try:
        async for d in gen.deltas():
            yield sse(_result(d.sample, shape))
    except (EngineDead, SampleFailed) as e:
        yield sse(failure_error(e).body())
        return
    yield SSE_DONE
