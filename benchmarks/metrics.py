"""Latency summaries and the agreement of outputs across systems."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Mean and the percentiles serving benchmarks usually quote, over the values that exist (not NaN)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return {k: float("nan") for k in ("mean", "p50", "p90", "p99")}
    a = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def agreement(texts: Sequence[str], reference: Sequence[str]) -> dict[str, float]:
    """``identical``: share of completions equal to the reference's; ``prefix``: mean share of the
    characters matched before the first difference (greedy runs drift apart late when
    kernels round differently, so this separates "slightly different" from "unrelated")."""
    if len(texts) != len(reference) or not texts:
        return {"identical": float("nan"), "prefix": float("nan")}
    same = sum(a == b for a, b in zip(texts, reference))
    prefix = [1.0 if a == b else common_prefix(a, b) / max(len(a), len(b)) for a, b in zip(texts, reference)]
    return {"identical": same / len(texts), "prefix": float(np.mean(prefix))}


def common_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
