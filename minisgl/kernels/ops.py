"""Vectorized primitives for the engine's hot paths."""

from __future__ import annotations

import numpy as np
import torch


def fast_compare_key(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> int:
    """Index of the first position where 1-D integer sequences ``a`` and ``b`` differ.

    Only the common length is compared; if no position differs, that common length is returned.
    Tensors are compared through zero-copy numpy views (copied to the host if they live
    elsewhere): a numpy call costs a fraction of a torch op's dispatch overhead, which dominates on
    the short keys of a deep radix tree. Hot loops can pass numpy arrays to skip the conversion.
    """
    if isinstance(a, torch.Tensor):
        a = a.cpu().numpy()
    if isinstance(b, torch.Tensor):
        b = b.cpu().numpy()
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = a[:n] != b[:n]
    first = int(diff.argmax())  # argmax returns the first True; 0 when there is none
    return first if diff[first] else n
