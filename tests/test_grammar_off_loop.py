"""Grammars never stall the other requests (issue #25): a grammar compiles on a thread while the
loop goes on (the request waits for it, unadmitted), its compile is bounded in time and its source
in size (errors naming the limit), an abort while it compiles frees everything, and a grammar that
is slow to take a token holds only its own request, not the step."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from conftest import assert_idle_balanced
from tiny_models import build_tiny_model

from minisgl import LLM, SamplingParams
from minisgl.constrained.spec import MAX_GRAMMAR_BYTES, GrammarSpec
from minisgl.request import Req
from minisgl.sampling import RejectionCode, RequestRejected
from minisgl.scheduler.scheduler import Scheduler
from minisgl.server.protocol import (
    CacheQuery,
    CacheReport,
    Control,
    ControlOp,
    ControlReply,
    FromScheduler,
    StepOutput,
    Submit,
)
from minisgl.server.scheduler_process import SchedulerLoop

PROMPT = [5, 6, 7, 8]
# The tiny model's tokens are the words w3..w511 (no spaces), so a grammar over them can finish.
FAST_REGEX = r"(w5|w6|w7){3,6}"


def slow_regex(variant: int, alternatives: int = 8000) -> str:
    """A regex of ``alternatives`` three-word strings: the default takes about 0.5 s to compile on an
    idle core against the tiny vocabulary (against a real one, longer), and several times that beside
    a decoding stream. ``variant`` makes a new source, so the compiler's cache does not answer it."""
    words = [
        f"w{3 + i % 500}w{3 + (i // 500 + variant) % 500}w{3 + (7 * i + variant) % 500}" for i in range(alternatives)
    ]
    return "(" + "|".join(words) + ")"


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLM]:
    llm = LLM(str(build_tiny_model("llama", tmp_path_factory.mktemp("grammar_off_loop") / "m")), num_page_override=4096)
    yield llm
    llm.shutdown()


def start_stream(sched: Scheduler, rid: int) -> Req:
    stream = sched.make_request(rid, PROMPT, SamplingParams(max_tokens=sched.engine.max_seq_len // 2, ignore_eos=True))
    sched.add(stream)
    return stream


def text_of(llm: LLM, ids: list[int]) -> str:
    return "".join(llm.tokenizer.convert_ids_to_tokens(ids))


def finish(sched: Scheduler, *reqs: Req) -> None:
    while any(r.finish_reason is None for r in reqs):
        sched.step()


def test_a_slow_grammar_compiles_beside_a_running_stream(tiny_llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """The acceptance test of issue #25: while a grammar compiles for a second or more, a running
    stream gets a token on every step, never more than 0.5 s apart; the request waits, unadmitted,
    then runs to a valid output. A second request for the same grammar shares its compile."""
    sched = tiny_llm.scheduler
    # The compile runs beside a busy loop, at a lower priority: on a loaded machine it can take
    # long, and its time limit is not what this test is about.
    monkeypatch.setattr(sched.grammars, "compile_timeout_s", 300.0)
    stream = start_stream(sched, 0)
    sched.step()
    pattern = slow_regex(0, alternatives=12_000)
    params = SamplingParams(max_tokens=8, regex=pattern)
    misses = sched.grammars.misses
    slow = sched.make_request(1, PROMPT, params)
    same = sched.make_request(2, [9, 10], params)
    assert slow.grammar is None and slow.pending_grammar is not None  # make_request did not wait for it
    assert sched.grammars.misses == misses + 1  # one compile for both
    sched.add(slow)
    sched.add(same)
    streams, steps, gaps, last = [stream], 0, [], time.monotonic()
    while slow.pending_grammar is not None:
        outputs = sched.step()
        now = time.monotonic()
        gaps.append(now - last)
        last = now
        steps += 1
        assert any(o.rid == streams[-1].rid for o in outputs), f"step {steps}: the stream got no token"
        for req in (slow, same):  # not admitted before its grammar is compiled
            assert req.pending_grammar is None or req not in sched.running
        if streams[-1].finish_reason is not None:  # a long compile outlasts a stream: keep one running
            streams.append(start_stream(sched, 100 + len(streams)))
    assert steps >= 20, steps  # the loop went on while the grammar compiled
    assert max(gaps) < 0.5, max(gaps)
    assert same.pending_grammar is None and same.grammar is not None
    finish(sched, slow, same)
    for req in (slow, same):
        assert req.finish_reason == "stop" and req.error is None
        assert re.fullmatch(pattern, text_of(tiny_llm, req.output_ids[:-1])), req.output_ids  # the last: EOS
    sched.abort(streams[-1].rid)
    assert not sched.has_work
    assert_idle_balanced(tiny_llm)


def test_a_grammar_over_the_time_limit_is_refused_naming_it(tiny_llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    sched = tiny_llm.scheduler
    monkeypatch.setattr(sched.grammars, "compile_timeout_s", 0.05)
    limit = "the grammar did not compile within the limit of 0.05 s"
    # Each compile waits for the gate first: past the limit whatever the machine's speed.
    gate, compile_now = threading.Event(), sched.grammars._compile

    def gated_compile(kind: str, source: str) -> object:
        assert gate.wait(120), "the test never opened the gate"
        return compile_now(kind, source)

    monkeypatch.setattr(sched.grammars, "_compile", gated_compile)
    # Beside a stream, the request is refused by a step (the server answers its submission with a 400).
    stream = start_stream(sched, 0)
    spec = GrammarSpec("regex", slow_regex(1, alternatives=6000))
    slow = sched.make_request(1, PROMPT, SamplingParams(max_tokens=8, regex=spec.source))
    sched.add(slow)
    rejected = []
    while not rejected:
        outputs = sched.step()
        assert any(o.rid == stream.rid for o in outputs)
        rejected = [o for o in outputs if o.rid == slow.rid]
    assert [(o.token_id, o.finish_reason, o.error) for o in rejected] == [(-1, "rejected", limit)]
    assert slow.rejection is not None and slow.rejection.code is RejectionCode.INVALID_GRAMMAR
    assert slow.rejection.param == "regex" and slow not in sched.running
    # xgrammar cannot stop a compile: it runs on and is kept, so the same grammar sent again once
    # it is done is ready at once.
    running_on = sched.grammars.submit(spec)
    gate.set()
    running_on.future.result(timeout=120)
    running_on.release()
    again = sched.make_request(2, PROMPT, SamplingParams(max_tokens=8, regex=spec.source))
    assert again.grammar is not None and again.pending_grammar is None
    sched.abort(stream.rid)
    # Offline, generate waits for the grammar before it queues anything, and raises.
    params = [SamplingParams(max_tokens=4), SamplingParams(regex=slow_regex(2, alternatives=6000))]
    gate.clear()
    with pytest.raises(ValueError, match=limit):
        tiny_llm.generate([PROMPT, [9, 10]], params, use_tqdm=False)
    gate.set()  # the refused compile runs on in the background (xgrammar cannot stop one)
    assert not sched.has_work
    assert_idle_balanced(tiny_llm)


class Outbox:
    """Stands for the loop's socket to the front end: keeps each message it is sent, decoded."""

    def __init__(self) -> None:
        self.sent: list[FromScheduler] = []

    def send(self, data: bytes) -> None:
        self.sent.append(msgspec.msgpack.decode(data, type=FromScheduler))


def test_a_request_whose_grammar_compiles_counts_as_waiting_everywhere(
    tiny_llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/debug/kv, /debug/radix (its queue and its counters) and /metrics (the same counters) agree:
    a request held while its grammar compiles is waiting, beside one waiting for admission. The
    loop is fed its messages directly, as its socket would."""
    sched = tiny_llm.scheduler
    gate, compile_now = threading.Event(), sched.grammars._compile

    def gated_compile(kind: str, source: str) -> object:
        assert gate.wait(120), "the test never opened the gate"
        return compile_now(kind, source)

    monkeypatch.setattr(sched.grammars, "_compile", gated_compile)
    outbox = Outbox()
    inbox: Any = None  # fed through _handle instead
    loop = SchedulerLoop(sched, inbox=inbox, outbox=outbox, parent_pid=os.getppid(), stream_interval_s=0.0)
    answers = StepOutput()
    loop._handle(Submit(1, PROMPT, SamplingParams(max_tokens=4, regex=r"(w8|w9){1,3}")), answers)
    loop._handle(Submit(2, [9, 10], SamplingParams(max_tokens=4)), answers)
    assert answers.accepted == [2] and sched.compiling  # the first is answered once its grammar is done
    loop._handle(Control(7, ControlOp.DEBUG_KV), answers)
    loop._handle(CacheQuery(8, max_nodes=10, head_tokens=0), answers)
    kv, report = outbox.sent
    assert isinstance(kv, ControlReply) and isinstance(report, CacheReport)
    assert kv.data["waiting"] == report.stats.waiting == 2, (kv.data, report.stats)
    assert sorted(r.rid for r in report.requests if r.state == "waiting") == [1, 2], report.requests
    gate.set()
    accepted = []
    while sched.has_work:
        accepted += loop._step().accepted
    assert accepted == [1]
    assert_idle_balanced(tiny_llm)


def test_a_grammar_over_the_size_limit_is_refused_naming_it(tiny_llm: LLM) -> None:
    source = "(" + "|".join(["w5w6"] * (MAX_GRAMMAR_BYTES // 5 + 1)) + ")"
    with pytest.raises(RequestRejected, match=f"over the limit of {MAX_GRAMMAR_BYTES} bytes") as e:
        tiny_llm.scheduler.make_request(0, PROMPT, SamplingParams(regex=source))
    assert e.value.code is RejectionCode.INVALID_GRAMMAR and e.value.param == "regex"
    with pytest.raises(ValueError, match=f"regex is {len(source)} bytes"):
        tiny_llm.generate([PROMPT], SamplingParams(regex=source), use_tqdm=False)
    assert not tiny_llm.scheduler.has_work


def test_abort_while_compiling_frees_everything(tiny_llm: LLM) -> None:
    """Three requests wait for three grammars (two compiling, one queued behind them); aborted, they
    leave nothing behind: the queued compile never runs, the stream beside them finishes."""
    sched = tiny_llm.scheduler
    stream = sched.make_request(0, PROMPT, SamplingParams(max_tokens=40, ignore_eos=True))
    sched.add(stream)
    waiting = [
        sched.make_request(1 + i, PROMPT, SamplingParams(max_tokens=8, regex=slow_regex(3 + i))) for i in range(3)
    ]
    compiles = []
    for req in waiting:
        assert req.pending_grammar is not None
        compiles.append(req.pending_grammar.future)
        sched.add(req)
    for _ in range(3):
        sched.step()
    assert all(sched.abort(req.rid) for req in waiting)
    assert not sched.compiling and all(req.pending_grammar is None for req in waiting)
    assert compiles[2].cancelled()  # nobody waits for it any more: it never starts
    assert all(req.row == -1 and req.handle is None for req in waiting)  # never admitted
    finish(sched, stream)
    assert stream.finish_reason == "length" and len(stream.output_ids) == 40
    assert not sched.has_work
    assert_idle_balanced(tiny_llm)


def test_a_slow_grammar_step_holds_only_its_own_request(tiny_llm: LLM) -> None:
    """A grammar that takes long to take a token (as a pathological one can: 100 ms and more) keeps
    its request out of the passes until it is done; the stream beside it gets a token on every step
    meanwhile, and the constrained request's output is what it is without the delay."""
    sched = tiny_llm.scheduler
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=3, regex=FAST_REGEX)
    expected = tiny_llm.generate([PROMPT], params, use_tqdm=False)[0]["token_ids"]
    tiny_llm.flush_cache()
    stream = start_stream(sched, 0)
    req = sched.make_request(1, PROMPT, params)
    assert req.grammar is not None  # compiled above: the cached grammar is settled at once
    release, started = threading.Event(), threading.Event()
    advance = req.grammar.advance

    def slow_advance(*args: object) -> list[int]:
        if not started.is_set():
            started.set()
            assert release.wait(30), "the test never released the grammar"
        return advance(*args)  # type: ignore[arg-type]

    req.grammar.advance = slow_advance  # type: ignore[method-assign]
    sched.add(req)
    while not started.is_set():
        sched.step()
    for step in range(5):  # its grammar is stuck on its first token
        outputs = sched.step()
        assert [o.rid for o in outputs] == [stream.rid], f"step {step}: {outputs}"
    release.set()
    finish(sched, req)
    assert req.output_ids == expected and req.error is None
    sched.abort(stream.rid)
    assert_idle_balanced(tiny_llm)
