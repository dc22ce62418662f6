"""The layers' fast paths against the plain torch ops they replace."""

from __future__ import annotations

import logging
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minisgl.kernels.native import resolve_kernels
from minisgl.layers import linear as linear_module
from minisgl.layers.linear import Linear, linear, pack_weights, packable_dtypes
from minisgl.layers.mlp import GatedMLP
from minisgl.layers.norm import RMSNorm
from minisgl.layers.quant import Int4Weight
from minisgl.layers.rotary import RotaryEmbedding, apply_rotary
from minisgl.tuning import MLP_BAND_BYTES, MLP_BAND_ROWS, mlp_band_rows


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
    # bf16 stays plain where oneDNN has no bf16 instructions (AVX2 alone): torch refuses to pack it there.
    assert layer.weight.is_mkldnn == (dtype in packable_dtypes()) and not plain.is_mkldnn
    y = layer(x)
    assert y.shape == (rows, 160) and y.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y, expected, rtol=tol, atol=tol * 10)
    torch.testing.assert_close(linear(x, plain, layer.bias), expected)  # an unpacked weight takes F.linear


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_bf16_weights_left_unpacked_are_named_in_a_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where oneDNN cannot pack bf16 (AVX2 alone) the load says that bf16 runs slow here; forced on any host."""
    for forced in (False, True):
        if forced:
            monkeypatch.setattr(linear_module, "packable_dtypes", lambda: (torch.float32,))
        model = nn.Sequential(Linear(32, 16)).to(torch.bfloat16)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="minisgl.layers"):
            pack_weights(model)
        warned = any("bfloat16 weights" in r.getMessage() for r in caplog.records)
        unpackable = forced or torch.bfloat16 not in packable_dtypes()
        assert warned == unpackable and model[0].weight.is_mkldnn != unpackable


@pytest.mark.parametrize("intermediate", [96, 1536, 8192, 14336])
def test_an_mlp_band_is_whole_blocks_of_rows_within_the_bytes_of_its_activations(intermediate: int) -> None:
    rows = GatedMLP(64, intermediate, None, (0, intermediate)).band_rows
    assert rows == mlp_band_rows(intermediate) and rows % 32 == 0 and rows >= MLP_BAND_ROWS
    assert rows == MLP_BAND_ROWS or 2 * 4 * intermediate * rows <= MLP_BAND_BYTES < 2 * 4 * intermediate * (rows + 32)


@pytest.mark.parametrize("bands", [1 / 256, 1, 1 + 1 / 256, 3 - 5 / 256])
def test_mlp_in_bands_of_rows_is_the_whole_product(bands: float) -> None:
    """A long pass's MLP runs a band of rows at a time: the rows come out as from one call."""
    mlp = GatedMLP(64, 96, None, (0, 96))
    rows = round(bands * mlp.band_rows)
    g = torch.Generator().manual_seed(rows)
    for p in mlp.parameters():
        p.data.normal_(generator=g)
    x = torch.randn(rows, 64, generator=g)
    gate, up = F.linear(x, mlp.gate_up_proj.weight).chunk(2, dim=-1)
    expected = F.linear(F.silu(gate) * up, mlp.down_proj.weight)
    # fp32 rounding only: a band of one row takes MKL's matrix-vector path, which sums in another order.
    torch.testing.assert_close(mlp(x), expected, rtol=1e-4, atol=1e-4)


def test_a_product_written_into_out_is_the_product() -> None:
    """``Linear``'s ``out``: dense, quantized on torch's kernels and on the C kernels, into a contiguous
    tensor (in place with the C kernels) and into a strided one (copied there)."""
    g = torch.Generator().manual_seed(3)
    layer, x = Linear(64, 48), torch.randn(5, 64, generator=g)
    layer.weight.data.normal_(generator=g)
    kernels = resolve_kernels("auto")
    for step in ("dense", "torch", "c"):
        if step == "torch":
            assert layer.weight is not None
            layer.quantize(Int4Weight.quantize(layer.weight.detach()))
        if step == "c":
            if kernels is None:
                break
            assert layer.quantized is not None
            layer.quantized.kernels = kernels
        expected = layer(x, 2)
        out, wide = torch.full((5, 48), float("nan")), torch.full((5, 64), float("nan"))
        assert layer(x, 2, out) is out and torch.equal(out, expected), step
        assert torch.equal(layer(x, 2, wide[:, :48]), expected) and wide[:, 48:].isnan().all(), step


@pytest.mark.parametrize("rows, prefill_rows", [(5, 0), (5, 3), (5, 5), (-40, -40), (-40, 7)])
def test_quantized_mlp_bands_are_their_written_out_activations_products(rows: int, prefill_rows: int) -> None:
    """With the C kernels a band's down projection takes gate_up itself (the prefill rows' SwiGLU computed on
    their way into the tile unit, where the build has one) and writes into the pass's output: the bits of
    the activation written out and the product, band by band."""
    kernels = resolve_kernels("auto")
    if kernels is None:
        pytest.skip("no C kernels on this host")
    g = torch.Generator().manual_seed(rows + prefill_rows)
    mlp = GatedMLP(64, 96, None, (0, 96))
    rows, prefill_rows = (mlp.band_rows - n if n < 0 else n for n in (rows, prefill_rows))  # -40: a band and 40
    for proj in (mlp.gate_up_proj, mlp.down_proj):
        assert proj.weight is not None
        proj.quantize(Int4Weight.quantize(torch.randn(proj.weight.shape, generator=g)))
        assert proj.quantized is not None
        proj.quantized.kernels = kernels
    x = torch.randn(rows, 64, generator=g)
    bands = []
    for start in range(0, rows, mlp.band_rows):
        band, prefill = x[start : start + mlp.band_rows], min(max(prefill_rows - start, 0), mlp.band_rows)
        bands.append(mlp.down_proj(kernels.silu_and_mul(mlp.gate_up_proj(band, prefill)), prefill))
    assert torch.equal(mlp(x, prefill_rows), torch.cat(bands))


def test_quantized_mlp_takes_the_kernels_swiglu_and_a_dense_one_torchs() -> None:
    """Dense fp32 layers keep torch's SiLU bit for bit (the token-exact mode); quantized ones run the
    fused decode step's, so that a layer-by-layer pass computes what the one-call step does: rounded by
    the activation itself for the down projection's integer products, the same values they would round."""
    kernels = resolve_kernels("auto")
    if kernels is None:
        pytest.skip("no C kernels on this host")
    torch.manual_seed(0)
    mlp, x = GatedMLP(64, 96, None, (0, 96)), torch.randn(5, 64)
    for p in mlp.parameters():
        p.data.normal_()
    gate, up = F.linear(x, mlp.gate_up_proj.weight).chunk(2, dim=-1)
    swiglu = mock.patch.object(kernels, "silu_and_mul", wraps=kernels.silu_and_mul)
    rounded = mock.patch.object(kernels, "silu_and_mul_rounded", wraps=kernels.silu_and_mul_rounded)
    with swiglu as plain, rounded as rounding:
        assert torch.equal(mlp(x), F.linear(F.silu(gate) * up, mlp.down_proj.weight))
        assert plain.call_count == rounding.call_count == 0
        for proj in (mlp.gate_up_proj, mlp.down_proj):
            assert proj.weight is not None
            proj.quantize(Int4Weight.quantize(proj.weight.detach()))
            assert proj.quantized is not None
            proj.quantized.kernels = kernels
        gate_up = mlp.gate_up_proj(x)
        assert torch.equal(mlp(x), mlp.down_proj(kernels.silu_and_mul(gate_up)))
        assert (plain.call_count, rounding.call_count) == (1, 1)  # the MLP's, rounded; the one above


@pytest.mark.parametrize("rows", [1, 5, 40])
def test_rms_norm_and_its_residual_add_match_hugging_face(rows: int) -> None:
    """On either path (the C kernel where it builds, torch's ops otherwise), within fp32 rounding."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    x, delta = torch.randn(rows, 576) * 3, torch.randn(rows, 576)
    reference = LlamaRMSNorm(576, eps=1e-5)
    reference.weight.data = torch.rand(576) + 0.5
    ours = RMSNorm(576, 1e-5)
    ours.weight.data = reference.weight.data.clone()
    for kernels in (resolve_kernels("auto"), None):
        ours.kernels = kernels
        torch.testing.assert_close(ours(x), reference(x), rtol=1e-6, atol=1e-6)
        normed, total = ours.add_forward(delta, x)
        assert torch.equal(total, x + delta)
        torch.testing.assert_close(normed, reference(x + delta), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_rms_norm_matches_hugging_face(dtype: torch.dtype) -> None:
    """The gain 1 + weight in fp32, multiplied before the cast back: bf16 within one rounding (the
    C kernel runs fp32 only), fp32 within its rounding."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    torch.manual_seed(0)
    x, delta = (torch.randn(7, 256) * 3).to(dtype), torch.randn(7, 256).to(dtype)
    reference = Gemma3RMSNorm(256, eps=1e-6).to(dtype)
    reference.weight.data = (torch.randn(256) * 0.5).to(dtype)
    ours = RMSNorm(256, 1e-6, unit_offset=True).to(dtype)
    ours.weight.data = reference.weight.data.clone()
    tol = 1e-6 if dtype == torch.float32 else 8e-3
    for kernels in (resolve_kernels("auto"), None):
        ours.kernels = kernels
        torch.testing.assert_close(ours(x), reference(x), rtol=tol, atol=tol)
        normed, total = ours.add_forward(delta, x)
        torch.testing.assert_close(total, x + delta)
        torch.testing.assert_close(normed, reference(x + delta), rtol=tol, atol=tol)


def test_rotary_as_a_roll_is_hugging_face_rotate_half_bit_for_bit() -> None:
    """Q and K rotated together, on the strided view of the fused QKV output the decoder passes."""
    from transformers.models.llama.modeling_llama import rotate_half

    rotary_embedding = RotaryEmbedding(64, 512, 10000.0, None)
    qkv = torch.randn(5, 15 * 64)
    positions = torch.tensor([0, 3, 100, 200, 511])
    rope = rotary_embedding.table(positions, torch.float32)
    qk = qkv[:, : 12 * 64].view(5, 12, 64)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=torch.int64).float() / 64))
    freqs = torch.outer(positions.float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)
    assert torch.equal(apply_rotary(qk, rope), qk * emb.cos() + rotate_half(qk) * emb.sin())
