"""The streaming detokenizer: pieces join to the offline text, split characters and stop strings held back."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from minisgl.models.loader import resolve_model_path
from minisgl.sampling import cut_at_stop
from minisgl.server.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(resolve_model_path(None)))


def stream(tokenizer: PreTrainedTokenizerBase, ids: list[int], stop: list[str]) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, stop)
    pieces = [detok.push(t) for t in ids]
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
        seen += detok.push(t)
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
