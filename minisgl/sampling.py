"""What a request asks of sampling: ``SamplingParams``, checked before anything is allocated, and the
rejection it gets otherwise. Torch-free, so that the server's front end can check requests without
loading the engine; the batched sampler is ``minisgl/sampler.py``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from minisgl.constrained.spec import GrammarSpec, ThinkTags, schema_text

# Below this temperature a request is greedy (as in vLLM and SGLang): dividing logits by a tinier
# one overflows float32 and gives NaN probabilities.
GREEDY_TEMPERATURE = 1e-5
MAX_TEMPERATURE = 100.0
# Seeds, like every integer the engine keeps, must fit a signed 64-bit integer (torch generators
# and the msgpack messages of the server).
MIN_SEED, MAX_SEED = -(2**63), 2**63 - 1
# Stop conditions are checked on every token, so their number and length bound the cost per token.
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
# OpenAI's ranges: a penalty moves a logit by at most 2 per occurrence, a bias by at most 100 (enough to ban or
# force a token); the biased tokens are bounded like the stop conditions, since each sampled row applies them.
MAX_PENALTY = 2.0
MAX_LOGIT_BIAS = 100.0
MAX_LOGIT_BIAS_TOKENS = 300
# Most likely alternatives reported per sampled token (OpenAI's bound for the chat API's top_logprobs;
# vLLM's default for both APIs): each costs a top-k over the row.
MAX_TOP_LOGPROBS = 20


class RejectionCode(str, Enum):
    """Why the engine will not run a request: the API's ``error.code`` (every rejection is a 400)."""

    INVALID_VALUE = "invalid_value"  # a sampling parameter is out of its range; ``param`` names it
    INVALID_PROMPT = "invalid_prompt"  # empty, or token ids outside the vocabulary
    INVALID_GRAMMAR = "invalid_grammar"  # json_schema / regex / ebnf malformed, unsupported or several
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # the prompt (+ max_tokens) does not fit the context
    KV_CAPACITY_EXCEEDED = "kv_capacity_exceeded"  # the request needs more KV slots than the pool has


class RequestRejected(ValueError):
    """Bad input, refused before anything is allocated. ``param``: the ``SamplingParams`` field at
    fault (None: the request as a whole). Carried as fields to the API's error, never parsed from text."""

    def __init__(self, message: str, code: RejectionCode, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.param = message, code, param


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability under the model (its raw logits' log-softmax: before temperature,
    penalties, biases and grammar masks, as vLLM reports it), and the ``top`` most likely tokens at that
    position with theirs, most likely first: (token id, log-probability) pairs."""

    logprob: float
    top: list[tuple[int, float]]


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 (anything below GREEDY_TEMPERATURE) = greedy
    top_k: int = -1  # -1 = off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None  # per-request seed: the same seed gives the same tokens
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # Subtracted from the logit of every token the output holds already: once for presence, once per
    # occurrence for frequency (OpenAI's and vLLM's definitions; the prompt's tokens are not counted).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    # None: no log-probabilities; k: each sampled token's ``TokenLogprob`` with the k most likely tokens.
    logprobs: int | None = None
    # The same for each prompt token but the first (nothing predicts it); such a request computes its whole
    # prompt, reusing no cached prefix: the logits of every position are needed.
    prompt_logprobs: int | None = None
    # Constrained decoding, at most one (SGLang's names): the output matches this JSON schema (a dict
    # or its text), regular expression or EBNF grammar, and ends when the grammar does.
    json_schema: str | dict[str, Any] | None = None
    regex: str | None = None
    ebnf: str | None = None
    # A thinking model's tags: its grammar, if any, holds only after the reasoning block (``GrammarAfterThought``).
    think_tags: ThinkTags | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        self.logit_bias = dict(self.logit_bias or {})
        if self.json_schema is not None:
            self.json_schema = schema_text(self.json_schema)

    @property
    def grammar(self) -> GrammarSpec | None:
        """The grammar the output must match; ``ValueError`` if several are set."""
        return GrammarSpec.from_fields(**self._grammar_fields)

    @property
    def _grammar_fields(self) -> dict[str, str | None]:
        assert not isinstance(self.json_schema, dict), "normalized to text on construction"
        return {"json_schema": self.json_schema, "regex": self.regex, "ebnf": self.ebnf}

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """Whether the output's own tokens move its next logits (presence or frequency penalty)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def validate(self, vocab_size: int) -> None:
        """Raise ``RequestRejected`` naming the first bad field."""
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise _invalid("max_tokens", f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not _is_real(self.temperature) or not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise _invalid("temperature", f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature!r}")
        if not _is_int(self.top_k) or (self.top_k != -1 and not 1 <= self.top_k <= vocab_size):
            raise _invalid("top_k", f"top_k must be -1 or in [1, {vocab_size}], got {self.top_k!r}")
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise _invalid("top_p", f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_real(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise _invalid("min_p", f"min_p must be in [0, 1], got {self.min_p!r}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise _invalid("stop", f"stop may hold at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise _invalid("stop", f"stop must be non-empty strings, got {self.stop!r}")
        if any(len(s) > MAX_STOP_STRING_CHARS for s in self.stop):
            raise _invalid("stop", f"stop strings may be at most {MAX_STOP_STRING_CHARS} characters long")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            message = f"stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids, got {len(self.stop_token_ids)}"
            raise _invalid("stop_token_ids", message)
        if any(not _is_int(t) or not 0 <= t < vocab_size for t in self.stop_token_ids):
            message = f"stop_token_ids must be token ids in [0, {vocab_size}), got {self.stop_token_ids!r}"
            raise _invalid("stop_token_ids", message)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise _invalid(name, f"{name} must be in [{-MAX_PENALTY:g}, {MAX_PENALTY:g}], got {value!r}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS_TOKENS:
            message = f"logit_bias may hold at most {MAX_LOGIT_BIAS_TOKENS} tokens, got {len(self.logit_bias)}"
            raise _invalid("logit_bias", message)
        for token, bias in self.logit_bias.items():
            if not _is_int(token) or not 0 <= token < vocab_size:
                raise _invalid("logit_bias", f"logit_bias keys must be token ids in [0, {vocab_size}), got {token!r}")
            if not _is_real(bias) or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                message = f"logit_bias values must be in [{-MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got {bias!r}"
                raise _invalid("logit_bias", message)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_TOP_LOGPROBS):
                raise _invalid(name, f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}], got {value!r}")
        tags = self.think_tags
        if tags is not None and not all(_is_int(t) and 0 <= t < vocab_size for t in (tags.open_id, tags.close_id)):
            raise _invalid("think_tags", f"think_tags must be token ids in [0, {vocab_size}), got {tags!r}")
        if self.seed is not None and (not _is_int(self.seed) or not MIN_SEED <= self.seed <= MAX_SEED):
            raise _invalid("seed", f"seed must be an integer in [{MIN_SEED}, {MAX_SEED}], got {self.seed!r}")
        try:
            _ = self.grammar  # the scheduler compiles (and checks) it
        except ValueError as e:
            given = [name for name, source in self._grammar_fields.items() if source is not None]
            param = given[0] if len(given) == 1 else None  # several given: the request as a whole
            raise RequestRejected(str(e), RejectionCode.INVALID_GRAMMAR, param) from None


def _invalid(param: str, message: str) -> RequestRejected:
    return RequestRejected(message, RejectionCode.INVALID_VALUE, param)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    """A finite int or float (NaN fails every range check, but say so plainly)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
