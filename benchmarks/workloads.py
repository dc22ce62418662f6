"""Seeded workload generators, in token ids of the model's tokenizer so every system sees the same input.

A workload is a list of rounds; each round is a list of turns. A turn extends its conversation's
history (earlier prompt + the model's answer) with new tokens, so one shape covers single-shot
prompts (every turn its own conversation, one round) and multi-turn chat (round r+1 resends round
r's history). Rounds run one after another; within a round the order is the issue order.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from benchmarks.corpus import CHAT_MESSAGES, GUIDELINES, PERSONAS, QUESTIONS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

WORKLOADS = ("shared-prefix", "multi-turn", "random", "single-stream", "long-prompt", "copy")
COPY_CUE_LEN = 8  # tokens of the context a copy prompt ends with: where the answer picks up


@dataclass(frozen=True)
class Turn:
    conversation: int
    new_ids: list[int]


@dataclass(frozen=True)
class Workload:
    name: str
    rounds: list[list[Turn]]
    output_len: int
    max_concurrency: int | None = None  # online: requests in flight at most, whatever the run's option

    @property
    def num_requests(self) -> int:
        return sum(len(r) for r in self.rounds)

    def max_seq_len(self) -> int:
        """Longest prompt + output any conversation can reach (outputs have a fixed length)."""
        totals: dict[int, int] = {}
        for turn in (t for r in self.rounds for t in r):
            totals[turn.conversation] = totals.get(turn.conversation, 0) + len(turn.new_ids) + self.output_len
        return max(totals.values())


class Conversations:
    """The histories of a workload's conversations while its rounds are played."""

    def __init__(self) -> None:
        self._history: dict[int, list[int]] = {}

    def prompt(self, turn: Turn) -> list[int]:
        return self._history.get(turn.conversation, []) + turn.new_ids

    def record(self, turn: Turn, prompt: list[int], output_ids: Sequence[int]) -> None:
        self._history[turn.conversation] = prompt + list(output_ids)


@dataclass(frozen=True)
class Sizes:
    """Defaults fit a 2-core CPU in minutes; raise them for a GPU."""

    groups: int = 4
    prompts_per_group: int = 8
    system_len: int = 512
    question_len: int = 32
    conversations: int = 4
    rounds: int = 4
    chat_system_len: int = 128
    turn_len: int = 32
    random_prompts: int = 16
    random_len: int = 256
    output_len: int = 32
    single_prompts: int = 4
    single_len: int = 64
    single_output_len: int = 128
    long_prompts: int = 2
    long_len: int = 2000
    long_output_len: int = 8
    copy_prompts: int = 4
    copy_context_len: int = 512
    copy_output_len: int = 128


class TokenSource(Protocol):
    def take(self, texts: Sequence[str], n: int) -> list[int]:
        """Exactly ``n`` token ids, made from ``texts`` when the source uses text."""
        ...


class TextTokens:
    """Tokenizes the texts one after another (cycling) and cuts at exactly ``n`` tokens."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def take(self, texts: Sequence[str], n: int) -> list[int]:
        ids: list[int] = []
        for i in range(n):  # every non-empty text gives at least one token, so n texts suffice
            if len(ids) >= n:
                break
            text = texts[i % len(texts)]
            ids += self.tokenizer.encode(" " + text if ids else text, add_special_tokens=False)
        return ids[:n]


class RandomTokens:
    """Uniform ids over the tokenizer's ordinary (non-special) tokens; ignores the texts."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, rng: random.Random) -> None:
        special = set(tokenizer.all_special_ids)
        self.ids = [i for i in range(len(tokenizer)) if i not in special]
        self.rng = rng

    def take(self, texts: Sequence[str], n: int) -> list[int]:
        return self.rng.choices(self.ids, k=n)


def shared_prefix(src: TokenSource, rng: random.Random, s: Sizes) -> Workload:
    """``groups`` system prompts of ``system_len`` tokens, each followed by ``prompts_per_group``
    questions of ``question_len`` tokens; the groups are interleaved (shuffled) as live traffic is."""
    turns: list[Turn] = []
    for g in range(s.groups):
        persona = PERSONAS[g % len(PERSONAS)]
        if g >= len(PERSONAS):  # keep groups distinct once the personas repeat
            persona = f"Team {g}. {persona}"
        system = src.take([persona, *rng.sample(GUIDELINES, len(GUIDELINES))], s.system_len)
        for _ in range(s.prompts_per_group):
            questions = rng.sample(QUESTIONS, len(QUESTIONS))
            questions[0] = "\n\n" + questions[0]  # set off from the system prompt
            question = src.take(questions, s.question_len)
            turns.append(Turn(len(turns), system + question))
    rng.shuffle(turns)
    return Workload("shared-prefix", [turns], s.output_len)


def multi_turn(src: TokenSource, tokenizer: PreTrainedTokenizerBase, rng: random.Random, s: Sizes) -> Workload:
    """``conversations`` chats of ``rounds`` user turns after one shared system prompt. Each round
    holds one turn of every conversation (in a shuffled order), so a conversation's cached history
    has to survive the other conversations' traffic until its next turn."""
    # Plain-text framing, the same token ids for every system; the model's chat template would
    # work too but is not needed to measure cache reuse.
    user = tokenizer.encode("\nUser: ", add_special_tokens=False)
    assistant = tokenizer.encode("\nAssistant:", add_special_tokens=False)
    system = src.take(rng.sample(GUIDELINES, len(GUIDELINES)), s.chat_system_len)
    starts = [rng.randrange(len(CHAT_MESSAGES)) for _ in range(s.conversations)]
    rounds = []
    for r in range(s.rounds):
        turns = []
        for c, start in enumerate(starts):
            messages = [CHAT_MESSAGES[(start + r + k) % len(CHAT_MESSAGES)] for k in range(len(CHAT_MESSAGES))]
            body = user + src.take(messages, s.turn_len) + assistant
            turns.append(Turn(c, (system if r == 0 else []) + body))
        rng.shuffle(turns)
        rounds.append(turns)
    return Workload("multi-turn", rounds, s.output_len)


def random_prompts(tokenizer: PreTrainedTokenizerBase, rng: random.Random, s: Sizes) -> Workload:
    """Independent random-id prompts: nothing to share, so any cache can only cost time here."""
    src = RandomTokens(tokenizer, rng)
    return Workload("random", [[Turn(i, src.take([], s.random_len)) for i in range(s.random_prompts)]], s.output_len)


def single_stream(src: TokenSource, rng: random.Random, s: Sizes) -> Workload:
    """One person chatting: ``single_prompts`` unrelated questions, one at a time (one per round, and at
    most one in flight online), each with a long answer of ``single_output_len`` tokens."""
    rounds = [[Turn(i, src.take(rng.sample(QUESTIONS, len(QUESTIONS)), s.single_len))] for i in range(s.single_prompts)]
    return Workload("single-stream", rounds, s.single_output_len, max_concurrency=1)


def long_prompt(src: TokenSource, rng: random.Random, s: Sizes) -> Workload:
    """Prefill speed: ``long_prompts`` unrelated prompts of ``long_len`` tokens, one at a time, a few
    tokens out each (time to first token is the prompt's prefill)."""
    rounds = [[Turn(i, src.take(rng.sample(GUIDELINES, len(GUIDELINES)), s.long_len))] for i in range(s.long_prompts)]
    return Workload("long-prompt", rounds, s.long_output_len, max_concurrency=1)


def copy_heavy(src: TokenSource, tokenizer: PreTrainedTokenizerBase, rng: random.Random, s: Sizes) -> Workload:
    """One user asking for text the prompt already holds (editing a given text, quoting a long context):
    ``copy_prompts`` requests, one at a time, each a context of ``copy_context_len`` tokens, an instruction
    to repeat it word for word from a point on, and the context's first tokens from that point. An answer
    of ``copy_output_len`` tokens can copy the context: where speculative decoding's n-gram drafts help."""
    instruction = tokenizer.encode("\n\nRepeat the text above word for word, from here on:\n", add_special_tokens=False)
    rounds = []
    for i in range(s.copy_prompts):
        context = src.take(rng.sample(GUIDELINES, len(GUIDELINES)), s.copy_context_len)
        start = rng.randrange(max(1, len(context) - s.copy_output_len - COPY_CUE_LEN))
        rounds.append([Turn(i, context + instruction + context[start : start + COPY_CUE_LEN])])
    return Workload("copy", rounds, s.copy_output_len, max_concurrency=1)


def build(
    names: Sequence[str], tokenizer: PreTrainedTokenizerBase, sizes: Sizes, seed: int, token_source: str = "text"
) -> list[Workload]:
    """The named workloads; each has its own seeded RNG so choosing a subset changes none of them."""
    workloads = []
    for name in names:
        rng = random.Random(f"{seed}/{name}")
        src: TokenSource = TextTokens(tokenizer) if token_source == "text" else RandomTokens(tokenizer, rng)
        if name == "shared-prefix":
            workloads.append(shared_prefix(src, rng, sizes))
        elif name == "multi-turn":
            workloads.append(multi_turn(src, tokenizer, rng, sizes))
        elif name == "random":
            workloads.append(random_prompts(tokenizer, rng, sizes))
        elif name == "single-stream":
            workloads.append(single_stream(src, rng, sizes))
        elif name == "long-prompt":
            workloads.append(long_prompt(src, rng, sizes))
        elif name == "copy":
            workloads.append(copy_heavy(src, tokenizer, rng, sizes))
        else:
            raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return workloads
