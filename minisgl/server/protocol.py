"""Messages between the HTTP front end and the scheduler process (msgpack over ZeroMQ).

Every message is a tagged ``msgspec.Struct`` so each side decodes exactly the union it expects;
nothing on the sockets is pickled. Token ids travel, text never does: the front end tokenizes
and detokenizes so the scheduler loop only runs forward passes.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

import msgspec

from minisgl.kvcache.snapshot import TreeSnapshot
from minisgl.sampling import RejectionCode, SamplingParams, TokenLogprob
from minisgl.scheduler.stats import StatsSnapshot

# -- front end -> scheduler -------------------------------------------------------------------


class Submit(msgspec.Struct, tag=True):
    rid: int
    input_ids: list[int]
    params: SamplingParams
    namespace: str | None = None  # cache_salt: prefixes are shared only within one namespace


class Abort(msgspec.Struct, tag=True):
    rids: list[int]


class ControlOp(Enum):
    FLUSH_CACHE = "flush_cache"  # empty the prefix cache (refused while requests run)
    DEBUG_KV = "debug_kv"  # check the KV accounting and report the pool's usage


class Control(msgspec.Struct, tag=True):
    """A call answered by one ``ControlReply`` with the same ``call_id``."""

    call_id: int
    op: ControlOp


class CacheQuery(msgspec.Struct, tag=True):
    """Asks for the debug page's picture of the cache and the queues; answered by one ``CacheReport``."""

    call_id: int
    max_nodes: int
    head_tokens: int  # token ids sent per node (the start of its text)
    cache_salt: str | None = None  # the caller's own namespace, whose tokens are shown too


ToScheduler = Submit | Abort | Control | CacheQuery

# -- scheduler -> front end -------------------------------------------------------------------


class Ready(msgspec.Struct, tag=True):
    """Sent once the model is loaded; the front end validates nothing until it has this."""

    pid: int
    max_seq_len: int
    vocab_size: int
    kv_capacity: int
    page_size: int


class Token(msgspec.Struct, array_like=True):
    rid: int
    token_id: int
    finish_reason: str | None
    cached_tokens: int  # prompt tokens reused from the prefix cache (known once admitted)
    error: str | None = None  # finish_reason "error": what failed in this request (token_id is -1)
    logprob: TokenLogprob | None = None  # where the request asks for log-probabilities (``SamplingParams.logprobs``)
    # With its first token, where the request asks for them: its prompt tokens' (None for the first)
    prompt_logprobs: list[TokenLogprob | None] | None = None


class Rejection(msgspec.Struct, array_like=True):
    """A ``Submit`` the scheduler refused: the fields of its ``RequestRejected``."""

    rid: int
    message: str
    code: RejectionCode
    param: str | None = None  # the SamplingParams field at fault; None: the request as a whole


class StepOutput(msgspec.Struct, tag=True):
    """Answers to the submissions drained in one loop iteration, or the tokens of one or more steps
    (batched; ``StreamPacer`` holds a fast decode's steps for a few milliseconds to send them together).

    ``accepted``/``rejected`` answer each ``Submit`` (validation happens in the scheduler, which
    knows the pool), so a streaming response can still fail with a 400 before it starts. A request
    whose grammar compiles is answered with the tokens of the step in which its compile ended.
    """

    accepted: list[int] = []
    rejected: list[Rejection] = []
    tokens: list[Token] = []


class ControlReply(msgspec.Struct, tag=True):
    call_id: int
    ok: bool
    message: str = ""
    data: dict[str, int] = {}


RequestState = Literal["waiting", "prefill", "decode"]


class RequestView(msgspec.Struct, array_like=True):
    rid: int
    state: RequestState
    namespace: str  # its namespace's label, never a cache_salt
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    max_tokens: int


class CacheReport(msgspec.Struct, tag=True):
    call_id: int
    tree: TreeSnapshot | None  # None: the cache keeps no tree (``--cache-type naive``)
    requests: list[RequestView]  # running, then waiting
    stats: StatsSnapshot


FromScheduler = Ready | StepOutput | ControlReply | StatsSnapshot | CacheReport
