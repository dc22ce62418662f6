"""``python -m minisgl chat``: an interactive conversation with the in-process engine.

The whole history is re-sent every turn; the radix cache makes that cheap, and each answer ends
with how much of the prompt came from the cache. A thinking model's reasoning (``text/reasoning.py``)
is shown dimmed before its answer, and the history keeps the answer alone, as a chat client sends it.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from minisgl.llm import LLM
from minisgl.sampling import SamplingParams
from minisgl.text.detokenizer import IncrementalDetokenizer
from minisgl.text.reasoning import ReasoningParser, think_tags

DIM, PLAIN = "\x1b[2m", "\x1b[0m"  # a thinking model's reasoning, dimmed
HELP = "Commands: /reset forgets the conversation, /exit (or Ctrl-D) quits. Ctrl-C stops an answer."


@dataclass
class TurnStats:
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    seconds: float

    def __str__(self) -> str:
        rate = self.completion_tokens / self.seconds if self.seconds > 0 else 0.0
        return (
            f"[prompt {self.prompt_tokens} tokens, {self.cached_tokens} cached; "
            f"{self.completion_tokens} generated, {rate:.1f} tok/s]"
        )


@dataclass
class Piece:
    """New text of an answer: its reasoning's and its content's."""

    reasoning: str
    content: str


class ChatSession:
    def __init__(self, llm: LLM, params: SamplingParams, system: str | None = None) -> None:
        self.llm, self.params, self.system = llm, params, system
        self.history: list[dict[str, str]] = []
        self.last: TurnStats | None = None
        self.think_tags = think_tags(llm.tokenizer)
        self._rids = itertools.count()
        self.reset()

    def reset(self) -> None:
        self.history = [{"role": "system", "content": self.system}] if self.system else []

    def ask(self, text: str) -> Iterator[Piece]:
        """Stream the answer to ``text``; afterwards ``last`` holds the turn's stats.

        Raises ``ValueError`` (history too long for the context, ...) before anything is queued. If
        the caller stops early (Ctrl-C), the request is aborted and the turn is not kept.
        """
        conversation = [*self.history, {"role": "user", "content": text}]
        scheduler = self.llm.scheduler
        prompt = self.llm.apply_chat_template(conversation)
        req = scheduler.make_request(next(self._rids), prompt, self.params)
        scheduler.add(req)
        detok = IncrementalDetokenizer(self.llm.tokenizer, self.params.stop)
        parser = None if self.think_tags is None else ReasoningParser(self.think_tags.opened_by(prompt))
        answer = ""
        start, finished = time.monotonic(), False
        try:
            while not finished:
                for out in scheduler.step():
                    if out.rid != req.rid:
                        continue
                    finished = out.finish_reason is not None
                    new = detok.push((out.token_id,)) + (detok.finish() if finished else "")
                    piece = Piece("", new) if parser is None else Piece(*parser.push(new))
                    if finished and parser is not None:
                        rest = Piece(*parser.finish())
                        piece = Piece(piece.reasoning + rest.reasoning, piece.content + rest.content)
                    answer += piece.content
                    if piece.reasoning or piece.content:
                        yield piece
        finally:
            if not finished:
                scheduler.abort(req.rid)
        self.history = [*conversation, {"role": "assistant", "content": answer}]
        self.last = TurnStats(req.prompt_len, req.cached_prompt_tokens, len(req.output_ids), time.monotonic() - start)


def _line_reader() -> Callable[[], str]:
    """prompt_toolkit (history, line editing) on a terminal; plain input() when piped."""
    if sys.stdin.isatty() and sys.stdout.isatty():
        from prompt_toolkit import PromptSession

        session: PromptSession[str] = PromptSession()
        return lambda: session.prompt("you> ")
    return lambda: input("you> ")


def run_chat(llm: LLM, params: SamplingParams, system: str | None) -> None:
    session = ChatSession(llm, params, system)
    dim, plain = (DIM, PLAIN) if sys.stdout.isatty() else ("", "")
    read_line = _line_reader()
    print(HELP, flush=True)
    while True:
        try:
            line = read_line().strip()
        except EOFError:
            break
        except KeyboardInterrupt:
            continue
        if not line:
            continue
        if line == "/exit":
            break
        if line == "/reset":
            session.reset()
            print("[conversation reset]", flush=True)
            continue
        thinking = False  # inside the reasoning's dimmed run
        try:
            sys.stdout.write("bot> ")
            for piece in session.ask(line):
                if piece.reasoning:
                    sys.stdout.write(("" if thinking else dim) + piece.reasoning)
                    thinking = True
                if piece.content:
                    sys.stdout.write((plain + "\n" if thinking else "") + piece.content)
                    thinking = False
                sys.stdout.flush()
        except ValueError as e:
            print(f"[error: {e}; /reset starts over]", flush=True)
            continue
        except KeyboardInterrupt:
            print(f"{plain if thinking else ''}\n[interrupted]", flush=True)
            continue
        print(f"{plain if thinking else ''}\n{session.last}", flush=True)
