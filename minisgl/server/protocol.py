"""Messages between the HTTP front end and the scheduler process (msgpack over ZeroMQ).

Every message is a tagged ``msgspec.Struct`` so each side decodes exactly the union it expects;
nothing on the sockets is pickled. Token ids travel, text never does: the front end tokenizes
and detokenizes so the scheduler loop only runs forward passes.
"""

from __future__ import annotations

import msgspec

from minisgl.sampling import SamplingParams
from minisgl.scheduler.stats import StatsSnapshot

# -- front end -> scheduler -------------------------------------------------------------------


class Submit(msgspec.Struct, tag=True):
    rid: int
    input_ids: list[int]
    params: SamplingParams
    namespace: str | None = None  # cache_salt: prefixes are shared only within one namespace


class Abort(msgspec.Struct, tag=True):
    rids: list[int]


class Control(msgspec.Struct, tag=True):
    """A call answered by one ``ControlReply`` with the same ``call_id``."""

    call_id: int
    op: str  # "flush_cache" | "debug_kv"


ToScheduler = Submit | Abort | Control

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


class Rejection(msgspec.Struct, array_like=True):
    rid: int
    message: str


class StepOutput(msgspec.Struct, tag=True):
    """Answers to the submissions drained in one loop iteration, or the tokens of one step (batched).

    ``accepted``/``rejected`` answer each ``Submit`` (validation happens in the scheduler, which
    knows the pool), so a streaming response can still fail with a 400 before it starts.
    """

    accepted: list[int] = []
    rejected: list[Rejection] = []
    tokens: list[Token] = []


class ControlReply(msgspec.Struct, tag=True):
    call_id: int
    ok: bool
    message: str = ""
    data: dict[str, int] = {}


FromScheduler = Ready | StepOutput | ControlReply | StatsSnapshot
