"""The layers' fast paths against the plain torch ops they replace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minisgl.layers.linear import SMALL_PRODUCT_ROWS, weight_product


@pytest.mark.parametrize("rows", [1, 2, 7, SMALL_PRODUCT_ROWS, SMALL_PRODUCT_ROWS + 1, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_weight_product_matches_linear(rows: int, with_bias: bool) -> None:
    g = torch.Generator().manual_seed(rows)
    x, w, b = torch.randn(rows, 96, generator=g), torch.randn(160, 96, generator=g), torch.randn(160, generator=g)
    bias = b if with_bias else None
    y = weight_product(x, w, bias)
    assert y.shape == (rows, 160) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, w, bias), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight_product(x, w, bias, max_rows=512), y, rtol=1e-5, atol=1e-5)
