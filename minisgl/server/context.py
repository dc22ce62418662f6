"""What every HTTP handler needs: the engine client, the tokenizer, metrics and server settings."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from starlette.requests import Request
from transformers import PreTrainedTokenizerBase

from minisgl.constrained.spec import ThinkTags
from minisgl.sampling import RequestRejected, SamplingParams
from minisgl.server.engine_client import EngineClient
from minisgl.server.errors import ApiError
from minisgl.server.generation import Generation, sample_params
from minisgl.server.metrics import ServerMetrics
from minisgl.server.schemas import read_body
from minisgl.text.reasoning import think_tags
from minisgl.text.token_bytes import TokenBytes


@dataclass(frozen=True)
class SamplingDefaults:
    """What a chat or completions request that leaves a sampling field unset gets: OpenAI's defaults, or
    the model's own (``generation_defaults``; ``--generation-config auto``, as vLLM's and SGLang's)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0


@dataclass
class ServerContext:
    client: EngineClient
    tokenizer: PreTrainedTokenizerBase
    metrics: ServerMetrics
    model_name: str
    api_key: str | None
    max_body_bytes: int
    separate_reasoning: bool  # ``--reasoning-parser auto``
    sampling_defaults: SamplingDefaults

    @cached_property
    def token_bytes(self) -> TokenBytes:
        """Each token's bytes and text, for responses with log-probabilities."""
        return TokenBytes(self.tokenizer)

    @cached_property
    def think_tags(self) -> ThinkTags | None:
        """The model's reasoning tags, where chat answers' reasoning is separated (None: it is not)."""
        return think_tags(self.tokenizer) if self.separate_reasoning else None

    @property
    def context_len(self) -> int:
        assert self.client.ready is not None, "handlers run only after the scheduler is ready"
        return self.client.ready.max_seq_len

    async def body(self, request: Request) -> bytes:
        return await read_body(request, self.max_body_bytes)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            message = f"The model `{model}` does not exist; this server serves `{self.model_name}`"
            raise ApiError(404, message, param="model", code="model_not_found")

    def default_max_tokens(self, prompts: list[list[int]], cap: int) -> int:
        """Up to ``cap``, as much as both the context and the KV pool leave room for; a prompt that
        leaves none is rejected by the scheduler with a clear message."""
        assert self.client.ready is not None
        room = min(self.context_len, self.client.ready.kv_capacity) - max(len(p) for p in prompts)
        return max(1, min(cap, room))

    def validate(self, params: SamplingParams, n: int) -> None:
        """Checks that need no scheduler state, answered at once (the scheduler checks lengths).
        Each of the ``n`` samples' parameters is checked: their seeds are derived from ``params``'."""
        assert self.client.ready is not None
        for i, sample in enumerate(sample_params(params, n)):
            try:
                sample.validate(self.client.ready.vocab_size)
            except RequestRejected as e:
                message = f"{e.message} (sample {i} of n={n} uses seed + {i})" if i > 0 else e.message
                raise ApiError(400, message, param=e.param, code=e.code.value) from None

    def generation(self, prompts: list[list[int]], params: SamplingParams, n: int, namespace: str | None) -> Generation:
        self.validate(params, n)
        return Generation(self.client, self.tokenizer, self.metrics, prompts, params, n, namespace)


async def wait_for_disconnect(request: Request) -> None:
    """Returns when the client goes away (the body must have been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
