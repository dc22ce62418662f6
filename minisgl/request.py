"""A request as the scheduler sees it, with the lengths that say where its KV lives."""

from __future__ import annotations

from dataclasses import dataclass, field

from minisgl.constrained.compiler import PendingGrammar
from minisgl.constrained.matcher import Grammar
from minisgl.kvcache.base import CacheHandle
from minisgl.sampling import RequestRejected, SamplingParams, TokenLogprob
from minisgl.text.detokenizer import IncrementalDetokenizer


@dataclass(eq=False)
class Req:
    """Positions of ``token_ids`` split into regions (all lengths count tokens from position 0):

    ``[0, cached_len)``       held by the prefix cache, locked through ``handle``
    ``[cached_len, device_len)`` computed KV in slots this request owns
    ``[device_len, seq_len)`` not computed yet: ``extend_len`` tokens for the next forward pass
    ``[0, allocated_len)``    has KV slots in the request's page-table row (whole pages)
    ``[cached_len, window_released_len)`` its own tokens whose sliding-window layers' KV is dropped
                              (out of every later query's window; models with a window pool only)
    """

    rid: int
    token_ids: list[int]  # the prompt, then each generated token
    params: SamplingParams
    namespace: str | None = None  # cache_salt: requests only share cache entries within one namespace
    prompt_len: int = field(init=False)
    grammar: Grammar | None = None  # what the output must match, advanced token by token
    pending_grammar: PendingGrammar | None = None  # compiling off the loop: not admitted until it is done
    row: int = -1  # page-table row while admitted
    handle: CacheHandle | None = None
    cached_len: int = 0
    device_len: int = 0
    allocated_len: int = 0
    window_released_len: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens reused from the cache (reported to the user)
    output_logprobs: list[TokenLogprob] = field(default_factory=list)  # per output token, where asked for
    # Per prompt token, where asked for (``scores_prompt``): None for the first, which nothing predicts
    prompt_token_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    finish_reason: str | None = None
    stop_text: IncrementalDetokenizer | None = None  # the output's text, to find stop strings (if any)
    error: str | None = None  # why it failed, when finish_reason is "error" (or "rejected")
    rejection: RequestRejected | None = None  # finish_reason "rejected": its grammar did not compile

    def __post_init__(self) -> None:
        self.prompt_len = len(self.token_ids)
        if self.scores_prompt:
            self.prompt_token_logprobs.append(None)

    @property
    def seq_len(self) -> int:
        return len(self.token_ids)

    @property
    def extend_len(self) -> int:
        return self.seq_len - self.device_len

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    @property
    def max_kv_len(self) -> int:
        """KV slots the request can ever need: the last sampled token is never fed back."""
        return self.prompt_len + self.params.max_tokens - 1

    @property
    def scores_prompt(self) -> bool:
        """Whether it asks for its prompt tokens' log-probabilities (``SamplingParams.prompt_logprobs``)."""
        return self.params.prompt_logprobs is not None

    @property
    def is_prefilling(self) -> bool:
        return self.device_len < self.prompt_len
