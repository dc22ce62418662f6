"""The sampler is total: for every parameter value the API accepts and any finite logits (with or
without -inf masks) it gives a valid token from a finite distribution, never NaN or an exception."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minisgl.batch import SamplingRows
from minisgl.sampler import Sampler, probabilities
from minisgl.sampling import GREEDY_TEMPERATURE, MAX_TEMPERATURE, SamplingParams
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
)


@settings(max_examples=400, deadline=None)
@given(row=logit_rows, params=accepted_params)
@example(row=[FLOAT32_MAX, -FLOAT32_MAX] * (VOCAB // 2), params=SamplingParams(temperature=1e-38))  # the issue
@example(row=[0.0] * VOCAB, params=SamplingParams(temperature=GREEDY_TEMPERATURE, top_p=1e-300, min_p=1.0))
def test_sampler_is_finite_for_every_accepted_value(row: list[float], params: SamplingParams) -> None:
    params.validate(VOCAB)  # the strategy draws only values the API accepts
    logits = torch.tensor(row, dtype=torch.float32)
    sampled = Sampler().sample(logits[None], SamplingRows([params], [Sampler.generator_for(params, 0)]))
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
