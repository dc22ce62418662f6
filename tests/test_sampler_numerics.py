"""The sampler is total: for every parameter value the API accepts and any finite logits (with or
without -inf masks) it gives a valid token from a finite distribution, never NaN or an exception."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minisgl.batch import SamplingRows
from minisgl.sampler import Sampler, adjust_logits, probabilities
from minisgl.sampling import GREEDY_TEMPERATURE, MAX_LOGIT_BIAS, MAX_PENALTY, MAX_TEMPERATURE, SamplingParams
from tests.conftest import c_kernels_or_skip

VOCAB = 32
FLOAT32_MAX = float(torch.finfo(torch.float32).max)

finite_logit = st.floats(-FLOAT32_MAX, FLOAT32_MAX, width=32)
# Mostly finite; now and then a masked token. At least one logit stays finite.
logit_rows = st.lists(st.one_of(finite_logit, finite_logit, finite_logit, st.just(-math.inf)), min_size=VOCAB,
                      max_size=VOCAB).filter(lambda row: any(math.isfinite(x) for x in row))  # fmt: skip
accepted_params = st.builds(
    SamplingParams,
    max_tokens=st.just(1),
    # Every float the API accepts, subnormals and the values just around the greedy threshold included.
    temperature=st.one_of(
        st.floats(0.0, MAX_TEMPERATURE),
        st.floats(0.0, 1e-30),
        st.floats(GREEDY_TEMPERATURE / 2, GREEDY_TEMPERATURE * 2),
    ),
    top_k=st.one_of(st.just(-1), st.integers(1, VOCAB)),
    top_p=st.floats(0.0, 1.0, exclude_min=True),
    min_p=st.floats(0.0, 1.0),
    seed=st.integers(-(2**63), 2**63 - 1),
    presence_penalty=st.one_of(st.just(0.0), st.floats(-MAX_PENALTY, MAX_PENALTY)),
    frequency_penalty=st.one_of(st.just(0.0), st.floats(-MAX_PENALTY, MAX_PENALTY)),
    logit_bias=st.dictionaries(st.integers(0, VOCAB - 1), st.floats(-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS), max_size=4),
)
outputs = st.lists(st.integers(0, VOCAB - 1), max_size=12)  # the request's tokens before the sampled one


@settings(max_examples=400, deadline=None)
@given(row=logit_rows, params=accepted_params, output=outputs)
@example(row=[FLOAT32_MAX, -FLOAT32_MAX] * (VOCAB // 2), params=SamplingParams(temperature=1e-38), output=[])
@example(row=[0.0] * VOCAB, params=SamplingParams(temperature=GREEDY_TEMPERATURE, top_p=1e-300, min_p=1.0), output=[])
def test_sampler_is_finite_for_every_accepted_value(
    row: list[float], params: SamplingParams, output: list[int]
) -> None:
    params.validate(VOCAB)  # the strategy draws only values the API accepts
    logits = torch.tensor(row, dtype=torch.float32)
    rows = SamplingRows([params], [Sampler.generator_for(params, 0)], [None], [output])
    sampled = Sampler().sample(logits[None].clone(), rows)
    adjust_logits(logits, params, output)  # the row the sampler saw
    row = logits.tolist()
    assert sampled.errors == {}  # no row failed: the sampler has no error of its own to report
    token = int(sampled.next_ids[0])
    assert 0 <= token < VOCAB
    assert math.isfinite(row[token]), "a masked (-inf) token was sampled"
    if params.greedy:
        assert row[token] == max(row)
        return
    probs = probabilities(logits, params)
    assert bool(torch.isfinite(probs).all()) and bool((probs >= 0).all())
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-4)
    assert float(probs[token]) > 0.0
    if params.top_k > 0:  # the token is among the k largest logits (ties with the k-th count)
        assert row[token] >= sorted(row, reverse=True)[params.top_k - 1]


@settings(max_examples=200, deadline=None)
@given(params=accepted_params, output=outputs, seed=st.integers(0, 2**31 - 1))
def test_penalties_and_bias_against_a_plain_reference(params: SamplingParams, output: list[int], seed: int) -> None:
    """Every token the output holds loses the presence penalty once and the frequency penalty per occurrence
    (the prompt's tokens are not passed: they never count); the biased tokens gain their bias."""
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 10
    adjusted = logits.clone()
    adjust_logits(adjusted, params, output)
    for token in range(VOCAB):
        count = output.count(token)
        penalty = (params.frequency_penalty * count + params.presence_penalty) if count and params.penalized else 0.0
        expected = float(logits[token]) - penalty + params.logit_bias.get(token, 0.0)
        assert float(adjusted[token]) == pytest.approx(expected, rel=1e-6, abs=1e-4), token


def test_a_biased_token_wins_greedy_and_a_penalized_one_loses_it() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0, 2.0]] * 3)
    params = [
        SamplingParams(),
        SamplingParams(logit_bias={2: 10.0}),
        SamplingParams(frequency_penalty=2.0, presence_penalty=2.0),  # token 1 came out twice: 5 - 2 x 2 - 2 < 2
    ]
    rows = SamplingRows(params, [None] * 3, [None] * 3, [None, None, [1, 1, 0]])
    assert Sampler().sample(logits, rows).next_ids.tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="presence_penalty must be in"):
        SamplingParams(presence_penalty=2.5).validate(4)
    with pytest.raises(ValueError, match="logit_bias keys must be token ids in"):
        SamplingParams(logit_bias={4: 1.0}).validate(4)
    with pytest.raises(ValueError, match="logit_bias values must be in"):
        SamplingParams(logit_bias={0: float("nan")}).validate(4)


def test_temperature_below_the_threshold_is_greedy() -> None:
    assert SamplingParams(temperature=GREEDY_TEMPERATURE / 10).greedy
    assert SamplingParams(temperature=1e-38).greedy
    assert not SamplingParams(temperature=GREEDY_TEMPERATURE).greedy


@pytest.mark.parametrize("kernels", ["torch", "c"])
@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 40),
    vocab=st.integers(1, 300),
    levels=st.integers(1, 4),  # few distinct values: most rows tie at their maximum
    special=st.sampled_from([None, float("-inf"), float("nan"), -0.0]),  # sprinkled over some logits
    seed=st.integers(0, 2**31 - 1),
)
def test_greedy_rows_take_argmax_s_token_ties_included(
    kernels: str, rows: int, vocab: int, levels: int, special: float | None, seed: int
) -> None:
    """The greedy token is the first of a row's largest logits (or of its NaNs), as torch.argmax gives
    it, at any batch and vocabulary size, masked (-inf) logits and signed zeros among them: through
    torch's max (a faster kernel than argmax's) and through the C kernels' argmax (the engine's sampler
    on the CPU; every build: tests/test_kernel_variants.py)."""
    sampler = Sampler(kernels=c_kernels_or_skip() if kernels == "c" else None)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, levels, (rows, vocab), generator=g).float()
    if special is not None:
        logits[torch.rand(rows, vocab, generator=g) < 0.05] = special
    greedy = [SamplingParams(temperature=0.0)] * rows
    sampled = sampler.sample(logits.clone(), SamplingRows(greedy, [None] * rows))
    assert torch.equal(sampled.next_ids, torch.argmax(logits, dim=-1))
