"""The offline API: ``LLM(...).generate(prompts)`` runs the scheduler in this process."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from minisgl.config import EngineConfig
from minisgl.constrained.tool_calls import parse_tools
from minisgl.request import Req
from minisgl.sampling import SamplingParams
from minisgl.scheduler.scheduler import Scheduler
from minisgl.text.chat import render_chat
from minisgl.text.detokenizer import detokenize

Prompt = str | list[int]
Message = dict[str, Any]


class LLM:
    def __init__(self, model: str | None = None, **options: Any) -> None:
        """``options`` are the fields of ``EngineConfig`` (dtype, device, cache_type, page_size, ...)."""
        self.config = EngineConfig(model=model, **options)
        self.scheduler = Scheduler.from_config(self.config)
        self.tokenizer = self.scheduler.tokenizer
        self._rids = itertools.count()

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, list):
            return list(prompt)
        raise ValueError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        cache_salt: str | None = None,
    ) -> list[dict[str, Any]]:
        """One result per prompt, in order: ``text``, ``token_ids``, ``logprobs`` (a ``TokenLogprob`` per
        token where its ``SamplingParams.logprobs`` asks for them, else None), ``prompt_logprobs`` (the same
        per prompt token, None for the first, where ``SamplingParams.prompt_logprobs`` asks for them, else
        None) and ``meta`` (prompt_tokens, cached_tokens, completion_tokens, finish_reason)."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = sampling_params if isinstance(sampling_params, Sequence) else [sampling_params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        # Validate everything before queueing anything, so a bad prompt leaves nothing behind.
        reqs = [
            self.scheduler.make_request(next(self._rids), self.encode(p), sp, cache_salt)
            for p, sp in zip(prompts, params)
        ]
        for req in reqs:  # their compiles run together; nothing else runs meanwhile
            self.scheduler.wait_for_grammar(req)
        for req in reqs:
            self.scheduler.add(req)
        with tqdm(total=len(reqs), desc="generate", disable=not use_tqdm) as bar:
            pending = len(reqs)
            while pending:
                finished = sum(out.finish_reason is not None for out in self.scheduler.step())
                pending -= finished
                bar.update(finished)
        return [self._result(req) for req in reqs]

    def chat(
        self,
        conversations: Sequence[Sequence[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Like ``generate``, with each conversation rendered by the model's chat template (with
        ``tools``, OpenAI's function definitions, if given; parse calls with ``parse_tool_calls``), and
        ``chat_template_kwargs`` as more variables for it (Qwen3's ``enable_thinking``)."""
        prompts: list[Prompt] = [
            self.apply_chat_template(conv, tools, chat_template_kwargs) for conv in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm)

    def apply_chat_template(
        self,
        conversation: Sequence[Message],
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        return render_chat(self.tokenizer, conversation, parse_tools(tools or []), chat_template_kwargs)

    def _result(self, req: Req) -> dict[str, Any]:
        return {
            "text": detokenize(self.tokenizer, req.output_ids, req.params.stop),
            "token_ids": req.output_ids,
            "logprobs": req.output_logprobs if req.params.logprobs is not None else None,
            "prompt_logprobs": req.prompt_token_logprobs if req.scores_prompt else None,
            "meta": {
                "prompt_tokens": req.prompt_len,
                "cached_tokens": req.cached_prompt_tokens,
                "completion_tokens": len(req.output_ids),
                "finish_reason": req.finish_reason,  # "error": ``error`` says what went wrong
                "error": req.error,
            },
        }

    def flush_cache(self) -> None:
        self.scheduler.flush_cache()

    def stats(self) -> dict[str, Any]:
        """Token counters (prompt, cached, computed, generated), ``hit_rate``, timings, queue
        lengths and the KV pool by state (``kv_free``, ``kv_evictable``, ...)."""
        return self.scheduler.snapshot().as_dict()

    def shutdown(self) -> None:
        """Abort anything still queued and release the engine's memory. Safe to call twice."""
        scheduler = self.__dict__.pop("scheduler", None)
        if scheduler is not None:
            scheduler.shutdown()
