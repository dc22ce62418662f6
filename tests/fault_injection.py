"""A fault for the failure-isolation tests: the sampling of a request seeded FAULTY_SEED raises at
its third token, so the request fails mid-generation, holding KV of its own.

Offline tests monkeypatch ``minisgl.sampler.probabilities`` with ``faulty(...)``; a server under
test imports ``install`` from a ``sitecustomize`` module, in its scheduler process too (spawned
interpreters import it at start-up), so the server itself carries no test hook."""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable

import torch

from minisgl import sampler
from minisgl.sampling import SamplingParams

FAULTY_SEED = 666
FAULT = "RuntimeError: injected fault"
FAIL_AT_CALL = 3

Probabilities = Callable[[torch.Tensor, SamplingParams], torch.Tensor]


def faulty(real: Probabilities) -> Probabilities:
    calls: Counter[int] = Counter()  # by request: its params object is the same on every step

    def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        if params.seed == FAULTY_SEED:
            if id(params) not in calls:
                # A later request's params may get the same id once this one is freed: it starts at 0.
                weakref.finalize(params, calls.pop, id(params), None)
            calls[id(params)] += 1
            if calls[id(params)] == FAIL_AT_CALL:
                raise RuntimeError("injected fault")
        return real(logits, params)

    return probabilities


def install() -> None:
    sampler.probabilities = faulty(sampler.probabilities)
