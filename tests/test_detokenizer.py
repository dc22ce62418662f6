"""The streaming detokenizer and stop strings: pieces join to the offline text, split characters and
stop strings held back, stop strings matched incrementally over a bounded window."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from minisgl.models.source import resolve_model_path
from minisgl.text.detokenizer import IncrementalDetokenizer, detokenize
from minisgl.text.stop import StopMatcher, cut_at_stop


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(resolve_model_path(None)))


def stream(tokenizer: PreTrainedTokenizerBase, ids: list[int], stop: list[str]) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, stop)
    pieces = [detok.push((t,)) for t in ids]
    pieces.append(detok.finish())
    return pieces


def offline(tokenizer: PreTrainedTokenizerBase, ids: list[int], stop: list[str]) -> str:
    """What ``LLM.generate`` returns for these output ids."""
    return cut_at_stop(tokenizer.decode(ids, skip_special_tokens=True), stop)


def test_multibyte_characters_are_emitted_whole(tokenizer: PreTrainedTokenizerBase) -> None:
    text = "héllo wörld 日本語 🎉 emoji ünïcödé"
    ids = tokenizer.encode(text)
    pieces = stream(tokenizer, ids, [])
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_stop_string_is_held_back_and_never_emitted(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer.encode("The answer is 42. ENDING of story")
    detok = IncrementalDetokenizer(tokenizer, ["ENDING"])
    expected, seen = "The answer is 42. ", ""
    for t in ids:
        seen += detok.push((t,))
        assert expected.startswith(seen), seen  # "E", "END", ... were never let out
    seen += detok.finish()
    assert seen == expected


def test_partial_stop_prefix_is_released_when_it_does_not_match(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer.encode("an ENDLESS END")
    pieces = stream(tokenizer, ids, ["END."])
    assert "".join(pieces) == "an ENDLESS END"


def test_special_tokens_are_skipped(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer.encode("Hi there") + [tokenizer.eos_token_id]
    assert "".join(stream(tokenizer, ids, [])) == "Hi there"


@pytest.mark.parametrize("seed", range(20))
def test_random_tokens_join_to_offline_text(tokenizer: PreTrainedTokenizerBase, seed: int) -> None:
    # Random ids include byte tokens that never form valid UTF-8: the stream must still end equal.
    rng = random.Random(seed)
    ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 60))]
    stop = [tokenizer.decode(ids[5:7])] if seed % 2 and len(ids) > 8 else []
    stop = [s for s in stop if s]
    assert "".join(stream(tokenizer, ids, stop)) == offline(tokenizer, ids, stop)


def test_final_text_is_what_the_stream_emits(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer.encode("one two STOP three")
    assert detokenize(tokenizer, ids, ["STOP"]) == "".join(stream(tokenizer, ids, ["STOP"])) == "one two "
    assert detokenize(tokenizer, ids, []) == tokenizer.decode(ids, skip_special_tokens=True)


def reference_cut(text: str, stop: list[str]) -> str:
    """The text before the earliest stop string, found on the whole text at once."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return text[:cut]


@pytest.mark.parametrize("seed", range(30))
def test_stop_matcher_piece_by_piece_matches_the_whole_text(seed: int) -> None:
    rng = random.Random(seed)
    text = "".join(rng.choice("abc ") for _ in range(rng.randrange(0, 80)))
    stop = ["".join(rng.choice("abc") for _ in range(rng.randrange(1, 4))) for _ in range(rng.randrange(1, 3))]
    # A stop string inside another (not at its start) completes first in a stream but starts later:
    # the stream cuts at it, the whole-text reference at the longer one. Keep such pairs out.
    stop = [s for i, s in enumerate(stop) if all(t not in s[1:] and s not in t[1:] for t in stop[:i])]
    matcher, released, pos = StopMatcher(stop), "", 0
    while pos < len(text):
        n = rng.randrange(1, 6)
        released += matcher.feed(text[pos : pos + n])
        pos += n
        assert reference_cut(text, stop).startswith(released)  # nothing past a stop string ever leaks
    released += matcher.flush()
    assert released == reference_cut(text, stop) == cut_at_stop(text, stop)
    assert matcher.stopped == any(s in text for s in stop)


def test_stop_matcher_holds_back_at_most_the_longest_stop_string() -> None:
    matcher = StopMatcher(["STOP", "END"])
    released = "".join(matcher.feed(c) for c in "x" * 10_000 + "ST")
    # Only "ST" (a possible beginning of "STOP") is held: the window never grows with the text.
    assert released == "x" * 10_000 and len(matcher._held) == 2
    assert matcher.feed("OP and more") == "" and matcher.stopped
    assert matcher.feed("later text") == "" and matcher.flush() == ""


def test_stop_matcher_cuts_at_the_first_stop_string_to_complete() -> None:
    # "b" completes before "abc" could: a stream cannot wait for the longer one.
    matcher = StopMatcher(["abc", "b"])
    assert matcher.feed("a") == "" and matcher.feed("b") == "a" and matcher.stopped
    both = StopMatcher(["abc", "b"])  # completed by the same piece: the earlier start wins
    assert both.feed("a") == "" and both.feed("bc") == "" and both.stopped


@pytest.mark.parametrize("seed", range(20))
def test_tokens_pushed_together_join_to_the_same_text(tokenizer: PreTrainedTokenizerBase, seed: int) -> None:
    # The front end pushes a message's tokens at once: any grouping must end on the offline text,
    # with split characters and stop strings held back as one at a time.
    rng = random.Random(seed)
    text = "héllo wörld 日本語 🎉 STOP ünïcödé " * 3
    ids = tokenizer.encode(text) if seed % 2 else [rng.randrange(len(tokenizer)) for _ in range(60)]
    stop = ["STOP"] if seed % 4 == 1 else []
    detok, pieces, at = IncrementalDetokenizer(tokenizer, stop), [], 0
    while at < len(ids):
        step = rng.randrange(1, 9)
        pieces.append(detok.push(ids[at : at + step]))
        at += step
    pieces.append(detok.finish())
    assert "".join(pieces) == offline(tokenizer, ids, stop)
    if seed % 2:  # real text: no piece shows half a character
        assert not any("\ufffd" in p for p in pieces)
