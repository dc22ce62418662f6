"""The layers' fast paths against the plain torch ops they replace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minisgl.layers.linear import Linear, linear, pack_weights


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
@pytest.mark.parametrize("rows", [1, 2, 7, 32, 33, 300])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_matches_plain(rows: int, with_bias: bool, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(rows)
    layer = Linear(96, 160, bias=with_bias)
    for p in layer.parameters():
        p.data.normal_(generator=g)
    model = nn.Sequential(layer).to(dtype)
    x = torch.randn(rows, 96, generator=g).to(dtype)
    expected = F.linear(x, layer.weight, layer.bias)
    plain = layer.weight
    pack_weights(model)
    assert layer.weight.is_mkldnn and not plain.is_mkldnn
    y = layer(x)
    assert y.shape == (rows, 160) and y.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y, expected, rtol=tol, atol=tol * 10)
    torch.testing.assert_close(linear(x, plain, layer.bias), expected)  # an unpacked weight takes F.linear
