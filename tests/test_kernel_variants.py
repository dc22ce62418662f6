"""The C kernels' builds (AMX, AVX-512 VNNI, AVX2 + AVX-VNNI, AVX2 + FMA): which one a CPU gets, each body
against the plain C reference its library exports and against torch on the dequantized weight, and
the boundary refusing what the C code cannot read. Every variant this CPU can execute runs (an AVX2
build runs on an AVX-512 machine); the others are built, the tests of their own bodies run them on the
emulated CPU (cpu_emulator.py), and their other tests skip, saying so."""

from __future__ import annotations

import logging
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from cpu_emulator import Unavailable, emulated_kernels

from minisgl.config import EngineConfig
from minisgl.kernels import build, native
from minisgl.kernels.native import CpuKernels, LayerWeights, RoundedRows, resolve_kernels
from minisgl.kernels.variants import VARIANTS, Variant, cpu_flags, host_variants, variants_for
from minisgl.kvcache.pool import KVPool
from minisgl.layers.quant import Int4Weight, Int8Weight
from minisgl.layers.rotary import RotaryEmbedding, apply_rotary
from tests.conftest import c_kernels_or_skip

AVX2 = frozenset({"avx2", "fma", "f16c"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
AMX = frozenset({"avx512_bf16", "avx512vbmi", "amx_tile", "amx_bf16", "amx_int8"})
# The SIMD bodies sum the same integers as the references in another order: fp32 rounding only.
REFERENCE_TOLERANCE = 1e-5


EMULATED = "_emulated"  # the id's suffix of a build run on the emulated CPU (cpu_emulator.py)
# Which builds' bodies a test checks on the emulated CPU where this one cannot run them (tens of times
# slower than running them: the tests of those bodies only, their heaviest shapes left to the CPUs that
# run the build). avxvnni differs from avx2 only in quant_gemm.c's int8 dot products; the emulated CPU reports no AMX.
ON_EMULATED_AVX512 = pytest.mark.emulated("avx512")
ON_EMULATED_AVX512_AND_AVXVNNI = pytest.mark.emulated("avx512", "avxvnni")
NOT_EMULATED = pytest.mark.not_emulated  # a heavy shape, left to the CPUs that run the build


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``kernels``: every build (those this CPU cannot run skip, saying so), and on the emulated CPU
    the builds this one cannot run that the test's ``emulated`` mark names."""
    if "kernels" not in metafunc.fixturenames:
        return
    mark = metafunc.definition.get_closest_marker("emulated")
    names = [v.name for v in VARIANTS]
    runnable = host_variants(cpu_flags())
    emulated = [v.name + EMULATED for v in VARIANTS if mark and v.name in mark.args and v not in runnable]
    metafunc.parametrize("kernels", names + emulated, indirect=True)


@pytest.fixture
def kernels(request: pytest.FixtureRequest) -> CpuKernels:
    """The build ``request.param`` names, on this CPU or on the emulated one."""
    name = request.param
    if not name.endswith(EMULATED):
        return c_kernels_or_skip(f"c:{name}")
    if request.node.get_closest_marker("not_emulated"):
        pytest.skip("a heavy shape for the emulated CPU: the test's other shapes run there")
    try:
        return emulated_kernels(name.removesuffix(EMULATED))
    except Unavailable as e:
        pytest.skip(str(e))


@pytest.mark.parametrize(
    "flags, expected",
    [
        (AVX512 | AMX | {"avx_vnni"}, ["amx", "avx512", "avxvnni", "avx2"]),  # Sapphire Rapids
        (AVX512 | {"avx_vnni", "avx512_bf16"}, ["avx512", "avxvnni", "avx2"]),  # the same, AMX not exposed
        (AVX512, ["avx512", "avx2"]),  # Zen 4, Ice Lake: no AVX-VNNI
        (AVX2 | {"avx_vnni"}, ["avxvnni", "avx2"]),  # Alder Lake
        (AVX2, ["avx2"]),  # Haswell .. Zen 3
        (frozenset({"avx", "sse4_2", "f16c"}), []),  # Sandy / Ivy Bridge: torch's kernels
        (AVX2 - {"fma"}, []),
    ],
)
def test_host_variants_follow_the_cpu_flags(flags: frozenset[str], expected: list[str]) -> None:
    assert [v.name for v in host_variants(flags)] == expected


def test_a_choice_takes_the_variants_it_names() -> None:
    assert [v.name for v in variants_for("auto", AVX512)] == ["avx512", "avx2"]
    assert [v.name for v in variants_for("c:avx2", AVX512)] == ["avx2"]
    assert variants_for("c:avx512", AVX2) == [] and variants_for("torch", AVX512) == []


def test_a_cpu_without_any_variant_runs_torch_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    old = frozenset({"avx", "sse4_2"})
    with caplog.at_level(logging.WARNING, logger="minisgl.kernels"):
        assert resolve_kernels("auto", old) is None
    assert "torch's kernels run instead" in caplog.text and "AVX2" in caplog.text
    with pytest.raises(RuntimeError, match="cannot run here"):
        resolve_kernels("c", old)
    with pytest.raises(RuntimeError, match="cannot run the avx512 variant"):
        resolve_kernels("c:avx512", AVX2)
    assert resolve_kernels("torch") is None


def test_a_failing_compiler_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # exits 1 for every source
    with pytest.raises(OSError, match="false failed for avx2"):
        native.load_sources("avx2", build.SOURCE_DIR)
    assert not list((tmp_path / "kernels").glob("*.so"))  # nothing half-built is left to load


def tiny_sources(folder: Path) -> Path:
    """Two C files that compile in a blink, in place of the kernels' sources."""
    folder.mkdir()
    for name in ("one", "two"):
        (folder / f"{name}.c").write_text(f"int {name}(void) {{ return 1; }}\n")
    return folder


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_builds_asked_for_at_once_compile_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's front end starts the first build while its scheduler process starts and asks for the
    same library: the second waits for the first one's instead of compiling every source again."""
    calls = tmp_path / "calls"
    compiler = tmp_path / "cc"  # logs each run, and runs slowly enough that the two builds overlap
    compiler.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nsleep 0.5\nexec cc "$@"\n')
    compiler.chmod(0o755)
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(compiler))
    sources = tiny_sources(tmp_path / "src")
    avx2 = next(v for v in VARIANTS if v.name == "avx2")
    with ThreadPoolExecutor(2) as pool:
        built = list(pool.map(build.build, [avx2, avx2], [sources, sources]))
    assert built[0] == built[1] and built[0].is_file()
    assert len(calls.read_text().splitlines()) == 3  # each source, then the link: once
    assert [p.name for p in built[0].parent.iterdir() if p.name.startswith(".tmp-")] == []


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_early_build_is_the_library_the_engine_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "SOURCE_DIR", tiny_sources(tmp_path / "src"))
    assert build.start_build("torch") is None
    thread = build.start_build("auto")
    if thread is None:
        pytest.skip(f"this CPU runs none of the variants ({', '.join(v.name for v in VARIANTS)})")
    thread.join()
    built = {p.name for p in (tmp_path / "cache" / "kernels").glob("*.so")}
    first = variants_for("auto", cpu_flags())[0]
    assert built == {build.build(first, build.SOURCE_DIR).name}  # one build: auto's first choice
    assert build.start_build("auto") is None  # built: nothing to start


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_other_sources_are_bound_through_their_own_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another commit's kernels (a benchmark timing two in one process) are called as their kernels.h
    declares them, not as this package's does."""
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    other = tmp_path / "other"
    shutil.copytree(build.SOURCE_DIR, other)
    (other / "kernels.h").write_text((other / "kernels.h").read_text() + "int answer(int x);\n")
    (other / "answer.c").write_text('#include "kernels.h"\nint answer(int x) { return 2 * x; }\n')
    kernels = native.load_sources("avx2", other)
    assert kernels.lib.answer(21) == 42
    assert not hasattr(native.load_variant("avx2").lib, "answer")


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_a_library_without_every_declared_kernel_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "partial.c"
    source.write_text('const char *kernels_variant(void) { return "avx2"; }\n')
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "partial.so"), str(source)], check=True)
    with pytest.raises(OSError, match=r"partial.so lacks \w+(, \w+)*, which kernels.h declares"):
        CpuKernels(tmp_path / "partial.so", VARIANTS[-1])


@pytest.mark.parametrize(
    "variant", [v for v in VARIANTS if v not in host_variants(cpu_flags())], ids=lambda v: f"{v.name}_build"
)  # the ids conftest's summary counts as built, not as run
def test_a_variant_this_cpu_cannot_run_still_builds_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: Variant
) -> None:
    """The bodies of the builds this CPU cannot execute are compiled all the same, so that a change to
    one is checked on any machine: every source compiles and the library defines every entry point
    kernels.h declares (looked up, none called). The builds it runs are tested whole in this file."""
    compiler = build.c_compiler()
    if compiler is None:
        pytest.skip("no C compiler")
    (tmp_path / "empty.c").write_text("int empty;\n")
    probe = [compiler, *variant.compile_flags, "-c", "-o", str(tmp_path / "empty.o"), str(tmp_path / "empty.c")]
    if subprocess.run(probe, capture_output=True, check=False).returncode != 0:
        pytest.skip(f"{compiler} lacks the {variant.name} build's flags ({' '.join(variant.compile_flags)})")
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    library = build.build(variant, build.SOURCE_DIR)  # raises, quoting the compiler, where a source fails
    assert native.undefined_declarations(native.open_library(library)) == []


def test_an_unknown_kernel_choice_is_rejected() -> None:
    with pytest.raises(ValueError, match="kernels must be one of .*c:avx2"):
        EngineConfig(kernels="c:sse2")


@ON_EMULATED_AVX512_AND_AVXVNNI
def test_the_library_is_the_variant_asked_for(kernels: CpuKernels) -> None:
    assert kernels.ffi.string(kernels.lib.kernels_variant()).decode() == kernels.variant.name
    if kernels.variant in host_variants(cpu_flags()):
        assert resolve_kernels(f"c:{kernels.variant.name}") is kernels  # built once, then shared


TILE_PROGRAM = r"""
#define _GNU_SOURCE
#include <sys/syscall.h>
#include <unistd.h>
#include "simd.h"
__attribute__((noinline)) void configure(void) { tiles_configure(); }  // a function of its own
int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) return 2;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    configure();
    float sums[16 * 16] = {1.0f};
    _tile_zero(0);  // an unconfigured tile register: SIGILL
    _tile_stored(0, sums, 64);
    _tile_release();
    return sums[0] == 0.0f ? 0 : 3;
}
"""


@pytest.mark.parametrize("level", ["-O2", "-O3"])
def test_the_tile_configuration_survives_the_compiler(tmp_path: Path, level: str) -> None:
    """gcc 12's _tile_loadconfig tells the compiler that ldtilecfg reads 8 bytes of the configuration, and
    gcc then drops the stores of the rows and columns in a function of its own: simd.h's configuration
    has to reach the tile unit whole."""
    amx = next(v for v in VARIANTS if v.name == "amx")
    c_kernels_or_skip("c:amx")  # this CPU runs the amx build, and there is a compiler
    compiler = build.c_compiler()
    assert compiler is not None
    (tmp_path / "tiles.c").write_text(TILE_PROGRAM)
    built = subprocess.run(
        [compiler, level, *amx.compile_flags, f"-I{build.SOURCE_DIR}", "-o", str(tmp_path / "tiles"),
         str(tmp_path / "tiles.c")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert subprocess.run([str(tmp_path / "tiles")], check=False).returncode == 0  # -4: SIGILL


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-30)).item()


def rounded_per_group(x: torch.Tensor, digits: int) -> torch.Tensor:
    """x as int4_gemm rounds it: per group of 32, v = x * 127 / max |x| as ``digits`` int8 digits (ties
    to even), the second one 256 times finer."""
    groups = x.view(len(x), -1, 32)
    amax = groups.abs().amax(-1, keepdim=True)
    v = groups * torch.where(amax > 0, torch.full_like(amax, 127) / amax, 0.0)  # (127 / amax is 127 * (1 / amax))
    high = v.round().clamp(-127, 127)
    low = ((v - high) * 256).round().clamp(-127, 127) if digits == 2 else torch.zeros_like(high)
    return ((high * 256 + low) * (amax / 127 / 256)).view_as(x)


# One tile part-filled (1, 37, 100, 21 rows); past 1,024 columns (32 groups) with plain AVX2 and 2,048 (64)
# with vpdpbusd many rows of x are summed in spans of groups, and past 256 (8) a few rows' two vectors of a
# tile take turns (256-bit builds); 96 columns: an odd number of groups; 270 rows: 17 tiles, with two threads
# in blocks of 4 and 5 tiles.
@ON_EMULATED_AVX512_AND_AVXVNNI
@pytest.mark.parametrize("digits", [1, 2])
@pytest.mark.parametrize("n, k", [(1, 64), (37, 96), (100, 576), (21, 2048 + 64), (270, 64)])
def test_int4_product_is_its_reference_bit_for_bit(kernels: CpuKernels, n: int, k: int, digits: int) -> None:
    g = torch.Generator().manual_seed(n + k)
    weight = Int4Weight.quantize(torch.randn(n, k, generator=g))
    buffers = (weight.codes, weight.scale, weight.minimum, n, digits)
    simd, reference = kernels.int4(*buffers), kernels.int4(*buffers, reference=True)
    other_digits = kernels.int4(*buffers[:4], 3 - digits)
    # Register tiles of 8 rows of x and remainders; from 9 rows on, the avx2 build's whole tiles with one digit,
    # 4 rows of x at a time (9, 11, 17, 70: 1, 3, 1 and 2 left over), and the amx build's tile products, 16 rows
    # of x at a time (17, 70: full blocks and a part-filled one).
    for rows in (1, 2, 5, 8, 9, 11, 17, 70):
        x = torch.randn(rows, k, generator=g) * 3
        y = simd(x)
        assert y.shape == (rows, n)
        assert torch.equal(y, reference(x)), rows  # the same integers, the same chain of fmas per output
        exact = rounded_per_group(x, digits).double() @ weight.dequantize().double().T
        assert relative_error(y, exact) < REFERENCE_TOLERANCE, rows
        assert torch.equal(simd(x[-1:]), y[-1:]), rows  # a row is the same alone as in a batch
        assert not torch.equal(other_digits(x), y), rows
    x = torch.zeros(3, k)  # an all-zero group: step 0, no division by it
    assert torch.equal(simd(x), torch.zeros(3, n))


# 40 columns: padded to 64 (two groups); 2,080: past a span (32 or 64 groups) and many turns of 8.
@ON_EMULATED_AVX512_AND_AVXVNNI
@pytest.mark.parametrize("digits", [1, 2])
@pytest.mark.parametrize("n, k", [(1, 32), (65, 96), (17, 40), (7, 2048 + 32)])
def test_int8_product_is_its_reference_bit_for_bit(kernels: CpuKernels, n: int, k: int, digits: int) -> None:
    g = torch.Generator().manual_seed(n + k)
    weight = Int8Weight.quantize(torch.randn(n, k, generator=g))
    weight.kernels, weight.digits = kernels, digits
    reference = kernels.int8(weight.codes, weight.scale, n, digits, reference=True)
    for rows in (1, 2, 5, 8, 9, 17, 70):
        x = torch.randn(rows, k, generator=g) * 3
        padded = torch.nn.functional.pad(x, (0, weight.padded_in - k))
        y = weight(x)
        assert torch.equal(y, reference(padded)), rows
        exact = rounded_per_group(padded, digits)[:, :k].double() @ weight.dequantize().double().T
        assert relative_error(y, exact) < REFERENCE_TOLERANCE, rows
        assert torch.equal(weight(x[-1:]), y[-1:]), rows  # a row alone is the row in a batch


@ON_EMULATED_AVX512_AND_AVXVNNI
def test_largest_int8_values_stay_inside_the_int32_sums(kernels: CpuKernels) -> None:
    """Every code at +-127 and x at its largest digits: each group's int32 lane sums at their bound."""
    k = 4096
    dense = torch.full((3, k), 1.0)
    dense[1] = -1.0
    dense[2, ::2] = -1.0
    weight = Int8Weight.quantize(dense)
    weight.kernels, weight.digits = kernels, 2
    x = torch.cat([torch.ones(1, k), -torch.ones(1, k), torch.full((1, k), 0.7)]).repeat(4, 1)  # 12: tiles too
    expected = rounded_per_group(x, 2) @ dense.T
    torch.testing.assert_close(weight(x), expected, rtol=1e-5, atol=1e-5)  # an overflow: far off


@ON_EMULATED_AVX512_AND_AVXVNNI
@pytest.mark.parametrize("digits", [1, 2])
def test_largest_int4_values_stay_inside_the_int16_sums(kernels: CpuKernels, digits: int) -> None:
    """Every code at 15 and x at its largest digits: AVX2's int16 sums of a group at their bound."""
    k, n = 4096, 3
    codes = torch.full((n, k), 15, dtype=torch.uint8)
    weight = Int4Weight.from_codes(codes, torch.ones(n, k // 32), torch.zeros(n, k // 32))
    x = torch.cat([torch.ones(1, k), -torch.ones(1, k), torch.full((1, k), 0.7)]).repeat(4, 1)  # 12: tiles too
    y = kernels.int4(weight.codes, weight.scale, weight.minimum, n, digits=digits)(x)
    torch.testing.assert_close(y, rounded_per_group(x, digits) @ weight.dequantize().T, rtol=1e-5, atol=1e-5)


# Prefill rows in bf16 on the tile unit (bf16_gemm.c): spans of K and blocks of 32 rows and 32 outputs, with
# the edges of each (1 output, 17 and 40 rows: part-filled blocks; 300 rows: past a chunk of 256).
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n, k", [(1, 64), (37, 96), (100, 576), (21, 8192 + 64)])
def test_prefill_rows_of_the_amx_build_are_its_bf16_reference(bits: int, n: int, k: int) -> None:
    kernels = c_kernels_or_skip("c:amx")
    assert kernels.bf16_prefill
    g = torch.Generator().manual_seed(n + k + bits)
    weight = (Int4Weight if bits == 4 else Int8Weight).quantize(torch.randn(n, k, generator=g))
    buffers = (weight.codes, weight.scale, weight.minimum) if bits == 4 else (weight.codes, weight.scale)
    bind = kernels.int4 if bits == 4 else kernels.int8
    simd, reference = bind(*buffers, n), bind(*buffers, n, reference=True)
    dequantized = weight.dequantize().bfloat16().double()
    for rows in (1, 17, 40, 300):
        x = torch.randn(rows, k, generator=g) * 3
        y = simd(x, rows)
        exact = x.bfloat16().double() @ dequantized.T  # x and the weight rounded to bf16, exact sums
        assert relative_error(y, reference(x, rows)) < REFERENCE_TOLERANCE, rows
        assert relative_error(y, exact) < REFERENCE_TOLERANCE, rows
        assert torch.equal(simd(x[-1:], 1), y[-1:]), rows  # a row is the same alone as in a batch
    x = torch.randn(9, k, generator=g)
    split = simd(x, 4)  # the decode rows after the prefill ones: their own products, as without any
    assert torch.equal(split[:4], simd(x[:4], 4)) and torch.equal(split[4:], simd(x[4:]))
    assert not torch.equal(split[:4], simd(x[:4]))


def quantized(bits: int, w: torch.Tensor) -> Int4Weight | Int8Weight:
    return (Int4Weight if bits == 4 else Int8Weight).quantize(w)


# An MLP's prefill rows in one call (mlp_bf16): hidden 2048 takes chunks of 256 rows (one span of gate_up's K each).
@pytest.mark.parametrize("gate_up_bits, down_bits", [(4, 4), (8, 8), (4, 8), (8, 4)])
@pytest.mark.parametrize("hidden, intermediate", [(64, 96), (2048, 64)])
def test_an_mlp_s_prefill_rows_are_its_two_products_and_activation(
    gate_up_bits: int, down_bits: int, hidden: int, intermediate: int
) -> None:
    """``prefill_mlp``: every row the same bits as gate_up's prefill product, ``silu_and_mul`` written out and
    the down projection's prefill product, in a new tensor or in ``out``; near its reference, whose activation
    takes libm's exp (an activation rounded to the other bf16 neighbour moves its terms by 2^-8)."""
    kernels = c_kernels_or_skip("c:amx")
    g = torch.Generator().manual_seed(gate_up_bits + 2 * down_bits + hidden)
    gate_up = quantized(gate_up_bits, torch.randn(2 * intermediate, hidden, generator=g))
    down = quantized(down_bits, torch.randn(hidden, intermediate, generator=g))
    gate_up_product, down_product = gate_up.bind(kernels, 1), down.bind(kernels, 1)
    buffers = (gate_up.kernel_buffers(), down.kernel_buffers())
    assert buffers[0] is not None and buffers[1] is not None
    mlp = kernels.prefill_mlp(*buffers, hidden, intermediate)
    reference = kernels.prefill_mlp(*buffers, hidden, intermediate, reference=True)
    for rows in (1, 17, 40, 300):
        x = torch.randn(rows, hidden, generator=g) * 3
        expected = down_product(kernels.silu_and_mul(gate_up_product(x, rows)), rows)
        assert torch.equal(mlp(x), expected), rows
        out = torch.full((rows, hidden), float("nan"))
        assert mlp(x, out) is out and torch.equal(out, expected), rows
        assert relative_error(expected, reference(x)) < 1e-3, rows
    with pytest.raises(ValueError, match=rf"x must have shape \[\*, {hidden}\]"):
        mlp(torch.randn(3, hidden + 32))
    with pytest.raises(ValueError, match="gate_up codes must have shape"):
        kernels.prefill_mlp(buffers[1], buffers[0], hidden, intermediate)  # the weights swapped


@ON_EMULATED_AVX512_AND_AVXVNNI
def test_prefill_rows_take_the_decode_products_without_a_tile_unit(kernels: CpuKernels) -> None:
    weight = Int4Weight.quantize(torch.randn(40, 64, generator=torch.Generator().manual_seed(1)))
    product = kernels.int4(weight.codes, weight.scale, weight.minimum, 40)
    x = torch.randn(20, 64)
    assert kernels.bf16_prefill == (kernels.variant.name == "amx")
    if not kernels.bf16_prefill:
        assert torch.equal(product(x, 12), product(x))
        gate_up, down = Int4Weight.quantize(torch.randn(64, 64)), Int4Weight.quantize(torch.randn(64, 32))
        mlp = kernels.prefill_mlp(gate_up.kernel_buffers(), down.kernel_buffers(), 64, 32)
        with pytest.raises(ValueError, match="mlp_bf16: this CPU lacks the instructions"):
            mlp(torch.randn(3, 64))
    for wrong in (-1, 21):
        with pytest.raises(ValueError, match="prefill_rows must be within 0..20"):
            product(x, wrong)


def softmax_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """q [heads, d] over keys/values [n, kv_heads, d] → [heads * d], in fp64."""
    group = q.shape[0] // keys.shape[1]
    keys, values = keys.double().repeat_interleave(group, 1), values.double().repeat_interleave(group, 1)
    scores = torch.einsum("hd,nhd->hn", q.double(), keys) / q.shape[1] ** 0.5
    return torch.einsum("hn,nhd->hd", scores.softmax(-1), values).flatten()


@ON_EMULATED_AVX512
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "heads, kv_heads, d",
    [(4, 4, 16), (6, 2, 32), (16, 1, 64), (9, 3, 64), (10, 2, 80), (18, 3, 48), (32, 4, 128), (32, 32, 64),
     (16, 8, 128)],
)  # fmt: skip
def test_paged_attention_against_the_reference_and_torch(
    kernels: CpuKernels, pool_dtype: torch.dtype, heads: int, kv_heads: int, d: int
) -> None:
    g = torch.Generator().manual_seed(heads * d)
    slots, lens = 800, [1, 37, 250]
    batch = len(lens)
    pool = [torch.randn(slots, kv_heads, d, generator=g).to(pool_dtype) for _ in range(2)]
    # Distinct slots for all requests: two requests' new tokens at one slot would overwrite each other.
    kv_slots = torch.randperm(slots, generator=g)[: batch * 256].view(batch, 256)
    kv_lens = torch.tensor(lens)
    out_slots = kv_slots[torch.arange(batch), kv_lens - 1]  # each new token is its request's last key
    q = torch.randn(batch, heads, d, generator=g)
    k, v = (torch.randn(batch, kv_heads, d, generator=g) for _ in range(2))
    outputs, pools = [], []
    for reference in (False, True):
        k_pool, v_pool = (p.clone() for p in pool)
        args = (q, k, v, out_slots, k_pool, v_pool, kv_slots, kv_lens)
        outputs.append(kernels.paged_decode_attention(*args, reference=reference))
        pools.append((k_pool, v_pool))
    (simd, reference), ((k_pool, v_pool), (k_ref, v_ref)) = outputs, pools
    assert torch.equal(k_pool, k_ref) and torch.equal(v_pool, v_ref)  # the same stored (rounded) K/V
    assert torch.equal(k_pool[out_slots], k.to(pool_dtype))
    if pool_dtype == torch.bfloat16 and kernels.decode_attention_bf16:
        # bf16 products: the queries and weights rounded to bf16. The body's e^x (within a couple of fp32 ulps
        # of expf's) can round a weight to the other bf16 neighbour: a few 1e-3 from the reference, and as
        # close to exact attention of the rounded queries.
        assert relative_error(simd, reference) < 2e-3
        for b, n in enumerate(lens):
            keys, values = k_pool[kv_slots[b, :n]], v_pool[kv_slots[b, :n]]
            for out in (simd, reference):
                assert relative_error(out[b], softmax_attention(q[b].bfloat16(), keys, values)) < 1e-2
    else:
        assert relative_error(simd, reference) < REFERENCE_TOLERANCE
        for b, n in enumerate(lens):
            keys, values = k_pool[kv_slots[b, :n]], v_pool[kv_slots[b, :n]]
            assert relative_error(simd[b], softmax_attention(q[b], keys, values)) < REFERENCE_TOLERANCE


@ON_EMULATED_AVX512
@pytest.mark.parametrize(
    "heads, kv_heads, d",
    [
        pytest.param(32, 32, 64, marks=NOT_EMULATED),
        pytest.param(16, 8, 128, marks=NOT_EMULATED),
        (9, 3, 64),
        (4, 4, 64),
    ],
)
def test_paged_attention_of_a_request_is_the_same_alone_as_in_a_batch(
    kernels: CpuKernels, heads: int, kv_heads: int, d: int
) -> None:
    """Bit for bit, however the batch's tasks (chunks of a request's keys, merged after) fall to the
    threads: the greedy tokens of a request must not depend on who else is decoding. The lengths give
    requests of one chunk and of several at every shape. A request of one chunk alone has its KV heads
    split over tasks, and in the batch it does not. Both thread counts are compared."""
    g = torch.Generator().manual_seed(d)
    slots, lens = 4096, [2000, 3, 129, 700]
    k_pool, v_pool = (torch.randn(slots, kv_heads, d, generator=g).bfloat16() for _ in range(2))
    kv_slots = torch.stack([torch.randperm(slots - 8, generator=g)[:2000] for _ in lens])
    out_slots = torch.arange(slots - len(lens), slots)
    kv_slots[torch.arange(len(lens)), torch.tensor(lens) - 1] = out_slots
    q = torch.randn(len(lens), heads, d, generator=g)
    k, v = (torch.randn(len(lens), kv_heads, d, generator=g) for _ in range(2))
    each_alone_and_batched(kernels, q, k, v, out_slots, (k_pool, v_pool), kv_slots, lens)


def each_alone_and_batched(
    kernels: CpuKernels,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out_slots: torch.Tensor,
    pools: tuple[torch.Tensor, torch.Tensor],
    kv_slots: torch.Tensor,
    lens: list[int],
) -> list[torch.Tensor]:
    """The batch's decode attention with 1 and with 2 threads (fresh copies of the pools each), each
    request's asserted the same bits as its call alone; the batch's output at each thread count."""
    threads, outputs = torch.get_num_threads(), []
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            k_pool, v_pool = (p.clone() for p in pools)
            batch = kernels.paged_decode_attention(q, k, v, out_slots, k_pool, v_pool, kv_slots, torch.tensor(lens))
            for b, n in enumerate(lens):
                rows = slice(b, b + 1)
                args = (q[rows], k[rows], v[rows], out_slots[rows], k_pool, v_pool, kv_slots[rows], torch.tensor([n]))
                assert torch.equal(kernels.paged_decode_attention(*args), batch[rows]), (t, b)
            outputs.append(batch)
    finally:
        torch.set_num_threads(threads)
    return outputs


# (9, 3, 64) and (24, 8, 128): a group's shared chunks have at least 8 query rows per KV head (3 members x 3),
# which take their keys and values staged in fp32 (paged_attention.c's attend_staged: from 8 rows with 512-bit
# registers, from 6 with 256-bit ones), and a member alone does not.
# An fp32 pool takes fp32 products on every build (Intel's CPUs take them for bf16 pools too).
@ON_EMULATED_AVX512
@pytest.mark.parametrize("pool_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "heads, kv_heads, d",
    [
        pytest.param(32, 32, 64, marks=NOT_EMULATED),
        pytest.param(16, 8, 128, marks=NOT_EMULATED),
        (9, 3, 64),
        pytest.param(24, 8, 128, marks=NOT_EMULATED),
        (4, 4, 64),
    ],
)
def test_paged_attention_of_requests_sharing_a_prefix_is_each_one_s_alone(
    kernels: CpuKernels, pool_dtype: torch.dtype, heads: int, kv_heads: int, d: int
) -> None:
    """Requests whose keys begin with the same slots (a cached system prompt) have the whole chunks of
    that run attended once for all of them: each request's output must still be the same bits as
    alone, and match the reference. Two groups (three requests after 1,024 shared slots, two after
    600) and a request of its own; at every shape these lengths give every group's members chunks
    of one size, several of them whole inside the shared run."""
    g = torch.Generator().manual_seed(d + heads)
    slots = 8192
    k_pool, v_pool = (torch.randn(slots, kv_heads, d, generator=g).to(pool_dtype) for _ in range(2))
    free = torch.randperm(slots - 8, generator=g)
    system, chat, rest = free[:1024], free[1024:1624], free[1624:]
    lens = [1100, 700, 1500, 300, 2000, 650]
    prefixes = [system, chat, system, None, system, chat]
    rows, used = [], 0
    for n, prefix in zip(lens, prefixes):
        own = n - (0 if prefix is None else len(prefix))
        row = rest[used : used + own] if prefix is None else torch.cat([prefix, rest[used : used + own]])
        rows.append(F.pad(row, (0, 2000 - n)))
        used += own
    kv_slots = torch.stack(rows)
    out_slots = torch.arange(slots - len(lens), slots)
    kv_slots[torch.arange(len(lens)), torch.tensor(lens) - 1] = out_slots
    q = torch.randn(len(lens), heads, d, generator=g)
    k, v = (torch.randn(len(lens), kv_heads, d, generator=g) for _ in range(2))
    stored = k_pool.clone(), v_pool.clone()  # the pools as the kernel leaves them: the new K/V at their slots
    stored[0][out_slots], stored[1][out_slots] = k.to(pool_dtype), v.to(pool_dtype)
    for batch in each_alone_and_batched(kernels, q, k, v, out_slots, (k_pool, v_pool), kv_slots, lens):
        for b, n in enumerate(lens):
            keys, values = stored[0][kv_slots[b, :n]], stored[1][kv_slots[b, :n]]
            if pool_dtype == torch.bfloat16 and kernels.decode_attention_bf16:  # queries and weights rounded to bf16
                assert relative_error(batch[b], softmax_attention(q[b].bfloat16(), keys, values)) < 1e-2, b
            else:
                assert relative_error(batch[b], softmax_attention(q[b], keys, values)) < REFERENCE_TOLERANCE, b
    # The same bits with q, k and v read where a fused QKV output holds them: each request's heads contiguous,
    # its rows further apart (the fused decode step's), the body's groups gathering their queries from there.
    qkv = torch.cat([q, k, v], dim=1)
    fused = qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
    for reference in (False, True):
        outputs = [
            kernels.paged_decode_attention(
                *rows, out_slots, k_pool.clone(), v_pool.clone(), kv_slots, torch.tensor(lens), reference=reference
            )
            for rows in ((q, k, v), fused)
        ]
        assert torch.equal(*outputs), reference


def test_paged_attention_of_an_empty_batch_is_empty(kernels: CpuKernels) -> None:
    """No requests, no tasks: an empty output, and the pool untouched."""
    k_pool, v_pool = torch.randn(8, 2, 16), torch.randn(8, 2, 16)
    before = k_pool.clone(), v_pool.clone()
    none = torch.zeros(0, dtype=torch.int64)
    out = kernels.paged_decode_attention(
        torch.zeros(0, 4, 16), torch.zeros(0, 2, 16), torch.zeros(0, 2, 16), none, k_pool, v_pool,
        torch.zeros(0, 4, dtype=torch.int64), none,
    )  # fmt: skip
    assert out.shape == (0, 64)
    assert torch.equal(k_pool, before[0]) and torch.equal(v_pool, before[1])


def causal_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, prefix: int) -> torch.Tensor:
    """A request's queries [n, heads, d] over its keys/values [prefix + n, kv_heads, d], token t seeing
    the first prefix + t + 1 → [n, heads * d], in fp64."""
    n, heads, d = q.shape
    group = heads // keys.shape[1]
    keys, values = (t.double().repeat_interleave(group, 1).transpose(0, 1) for t in (keys, values))
    scores = torch.einsum("nhd,hjd->hnj", q.double(), keys) / d**0.5
    seen = torch.arange(keys.shape[1]).unsqueeze(0) <= prefix + torch.arange(n).unsqueeze(1)
    weights = scores.masked_fill(~seen, float("-inf")).softmax(-1)
    return torch.einsum("hnj,hjd->nhd", weights, values).flatten(1)


@pytest.mark.parametrize(
    "heads, kv_heads, d",
    [(4, 4, 16), (6, 2, 32), (16, 1, 64), (9, 3, 64), (10, 2, 80), (32, 4, 128), (32, 32, 64), (16, 8, 128)],
)
def test_prefill_attention_against_the_reference_and_torch(
    kernels: CpuKernels, heads: int, kv_heads: int, d: int
) -> None:
    """Fresh prompts, extensions of a cached prefix and single tokens riding along, in one call: the
    SIMD body (where it runs on this CPU) against the reference, and the reference against fp64
    softmax attention of its bf16-rounded queries (its weights are rounded to bf16 too)."""
    g = torch.Generator().manual_seed(heads * d)
    slots, shapes = 1500, [(0, 37), (100, 9), (250, 1), (0, 1), (3, 70)]  # (prefix, new tokens)
    k_pool, v_pool = (torch.randn(slots, kv_heads, d, generator=g).bfloat16() for _ in range(2))
    kv_slots = torch.randperm(slots, generator=g)[: len(shapes) * 256].view(len(shapes), 256)
    new_lens, prefix_lens = torch.tensor([n for _, n in shapes]), torch.tensor([p for p, _ in shapes])
    q = torch.randn(int(new_lens.sum()), heads, d, generator=g)
    q_starts = torch.cumsum(new_lens, 0) - new_lens
    args = (q, k_pool, v_pool, kv_slots, q_starts, new_lens, prefix_lens)
    reference = kernels.prefill_attention(*args, reference=True)
    body = None
    if kernels.runs_prefill_attention:
        # Its 2^x is a polynomial within 3e-6 of expf's, which can round a weight to the other bf16
        # neighbour: a few 1e-3 from the reference, and as close to exact attention (below).
        body = kernels.prefill_attention(*args)
        assert relative_error(body, reference) < 2e-3
    else:
        with pytest.raises(ValueError, match="lacks the instructions"):
            kernels.prefill_attention(*args)
    for b, (prefix, n) in enumerate(shapes):
        rows = slice(int(q_starts[b]), int(q_starts[b]) + n)
        keys, values = k_pool[kv_slots[b, : prefix + n]], v_pool[kv_slots[b, : prefix + n]]
        expected = causal_attention(q[rows].bfloat16(), keys, values, prefix)
        for out in (reference, body) if body is not None else (reference,):
            assert relative_error(out[rows], expected) < 1e-2  # the weights' bf16 rounding


def test_prefill_attention_reads_queries_inside_wider_rows(kernels: CpuKernels) -> None:
    """Queries as the attention layer hands them over, a view into the fused QKV output (each token's row
    holding its keys and values too): the same bits as from a contiguous copy."""
    g = torch.Generator().manual_seed(3)
    heads, kv_heads, d, n = 9, 3, 64, 70
    k_pool, v_pool = (torch.randn(100, kv_heads, d, generator=g).bfloat16() for _ in range(2))
    kv_slots = torch.randperm(100, generator=g)[:n].view(1, n)
    qkv = torch.randn(n, heads + 2 * kv_heads, d, generator=g)
    lens = [torch.tensor([x]) for x in (0, n, 0)]
    for reference in (True, False) if kernels.runs_prefill_attention else (True,):
        inside = kernels.prefill_attention(qkv[:, :heads], k_pool, v_pool, kv_slots, *lens, reference=reference)
        alone = kernels.prefill_attention(
            qkv[:, :heads].contiguous(), k_pool, v_pool, kv_slots, *lens, reference=reference
        )
        assert torch.equal(inside, alone)


def test_prefill_attention_keeps_a_nan_in_its_own_row(kernels: CpuKernels) -> None:
    """A NaN query gives its own row NaN (its softmax weights stay NaN, not a weight of about 0) and leaves
    the other rows, which see the same keys, as they were."""
    if not kernels.runs_prefill_attention:
        pytest.skip(f"the {kernels.variant.name} build has no prefill attention body for this CPU")
    g = torch.Generator().manual_seed(7)
    k_pool, v_pool = (torch.randn(40, 2, 32, generator=g).bfloat16() for _ in range(2))
    q = torch.randn(20, 4, 32, generator=g)
    lens = (torch.arange(20).view(1, 20), torch.tensor([0]), torch.tensor([20]), torch.tensor([0]))
    clean = kernels.prefill_attention(q, k_pool, v_pool, *lens).view(20, 4, 32)
    q[5, 1, 3] = float("nan")
    out = kernels.prefill_attention(q, k_pool, v_pool, *lens).view(20, 4, 32)
    assert torch.isnan(out[5, 1]).all()
    out[5, 1] = clean[5, 1]
    assert torch.equal(out, clean)


def test_prefill_attention_is_the_same_chunked(kernels: CpuKernels) -> None:
    """A prompt attended in one call, or in two with the first part's keys cached: the second part's
    rows are the same bit for bit (each row sees the same keys in the same order)."""
    if not kernels.runs_prefill_attention:
        pytest.skip(f"the {kernels.variant.name} build has no prefill attention body for this CPU")
    g = torch.Generator().manual_seed(5)
    heads, kv_heads, d, n, split = 9, 3, 64, 150, 61
    k_pool, v_pool = (torch.randn(400, kv_heads, d, generator=g).bfloat16() for _ in range(2))
    kv_slots = torch.randperm(400, generator=g)[:n].view(1, n)
    q = torch.randn(n, heads, d, generator=g)
    whole = kernels.prefill_attention(q, k_pool, v_pool, kv_slots, *(torch.tensor([x]) for x in (0, n, 0)))
    rest = q[split:].contiguous()
    tail = kernels.prefill_attention(
        rest, k_pool, v_pool, kv_slots, *(torch.tensor([x]) for x in (0, n - split, split))
    )
    assert torch.equal(tail, whole[split:])


@pytest.mark.parametrize("heads, kv_heads, d", [(32, 32, 64), (9, 3, 64)])
def test_prefill_attention_of_requests_sharing_a_prefix_is_each_one_s_alone(
    kernels: CpuKernels, heads: int, kv_heads: int, d: int
) -> None:
    """Requests that extend one cached prefix (the same slots from position 0, as after a radix-cache
    hit) have the keys they share with the request before them packed once per call: each request's
    rows are the same bit for bit as in a call of its own. One shares an odd number of slots, one
    none, one shares its predecessor's slots past that request's own keys."""
    if not kernels.runs_prefill_attention:
        pytest.skip(f"the {kernels.variant.name} build has no prefill attention body for this CPU")
    g = torch.Generator().manual_seed(d)
    slots, shapes = 2000, [(100, 30), (100, 9), (57, 40), (0, 20), (120, 3), (60, 1)]
    k_pool, v_pool = (torch.randn(slots, kv_heads, d, generator=g).bfloat16() for _ in range(2))
    cached = torch.randperm(slots, generator=g)[:300]
    kv_slots = torch.stack([torch.cat([cached[:prefix], torch.randperm(slots, generator=g)[: 300 - prefix]])
                            for prefix, _ in shapes])  # fmt: skip
    kv_slots[5, :130] = kv_slots[4, :130]  # request 5's keys all request 4's
    new_lens, prefix_lens = torch.tensor([n for _, n in shapes]), torch.tensor([p for p, _ in shapes])
    q = torch.randn(int(new_lens.sum()), heads, d, generator=g)
    q_starts = torch.cumsum(new_lens, 0) - new_lens
    together = kernels.prefill_attention(q, k_pool, v_pool, kv_slots, q_starts, new_lens, prefix_lens)
    for b, (prefix, n) in enumerate(shapes):
        rows = slice(int(q_starts[b]), int(q_starts[b]) + n)
        alone = kernels.prefill_attention(
            q[rows].contiguous(), k_pool, v_pool, kv_slots[b : b + 1], *(torch.tensor([x]) for x in (0, n, prefix))
        )
        assert torch.equal(alone, together[rows]), b


@ON_EMULATED_AVX512
@pytest.mark.parametrize("tokens, heads, d", [(1, 12, 64), (37, 4, 16), (300, 3, 128)])
def test_rotary_is_torch_rope_bit_for_bit(kernels: CpuKernels, tokens: int, heads: int, d: int) -> None:
    """On a view into a wider fused QKV row, as the attention layer hands it over, over more
    tokens than one thread takes."""
    table = RotaryEmbedding(d, 512, 10000.0, None)
    rope = table.table(torch.randint(0, 512, (tokens,)), torch.float32)
    qkv = torch.randn(tokens, (heads + 2) * d) * 5
    x = qkv[:, : heads * d].view(tokens, heads, d)
    rotated = kernels.rotary(x, rope[0].view(tokens, d), rope[1].view(tokens, d))
    assert rotated.is_contiguous() and torch.equal(rotated, apply_rotary(x, rope))


@ON_EMULATED_AVX512
@pytest.mark.parametrize("rows, n", [(1, 8), (37, 1536 + 5), (3, 40)])
def test_silu_and_mul_is_torch_swiglu_within_rounding(kernels: CpuKernels, rows: int, n: int) -> None:
    """Over the vector body and its scalar tail, with gates far out on both sides."""
    gate_up = torch.randn(rows, 2 * n) * 4
    gate_up[0, 0], gate_up[-1, n - 1] = -200.0, 200.0
    gate, up = gate_up.chunk(2, dim=-1)
    expected = F.silu(gate) * up
    torch.testing.assert_close(kernels.silu_and_mul(gate_up), expected, rtol=2e-6, atol=1e-6)


@ON_EMULATED_AVX512_AND_AVXVNNI
@pytest.mark.parametrize("rows, n", [(1, 64), (17, 576), (70, 96)])
def test_rounded_rows_of_the_norm_and_swiglu_give_the_products_of_their_fp32_rows(
    kernels: CpuKernels, rows: int, n: int
) -> None:
    """rms_norm_rounded (with the residual added first and without) and silu_mul_rounded hand the int4 and
    int8 products the bits they would round from rms_norm's and silu_mul's fp32 rows, for one row and for rows
    split over the threads (70: a band from row 16 too); the sum with the residual is rms_norm's."""
    g = torch.Generator().manual_seed(rows + n)
    x, delta, weight = torch.randn(rows, n, generator=g) * 3, torch.randn(rows, n, generator=g), torch.rand(n) + 0.5
    gate_up = torch.randn(rows, 2 * n, generator=g) * 4
    int4 = Int4Weight.quantize(torch.randn(40, n, generator=g))
    int8 = Int8Weight.quantize(torch.randn(33, n, generator=g))
    products = (kernels.int4(int4.codes, int4.scale, int4.minimum, 40), kernels.int8(int8.codes, int8.scale, 33))
    normed, total = kernels.rms_norm(x, weight, 1e-5, delta)
    rounded, rounded_total = kernels.rms_norm_rounded(x, weight, 1e-5, delta)
    assert torch.equal(rounded_total, total)
    pairs = [(normed, rounded), (kernels.rms_norm(x, weight, 1e-5)[0], kernels.rms_norm_rounded(x, weight, 1e-5)[0]),
             (kernels.silu_and_mul(gate_up), kernels.silu_and_mul_rounded(gate_up))]  # fmt: skip
    for fp32, rows_rounded in pairs:
        assert len(rows_rounded) == rows
        for product in products:
            assert torch.equal(product(rows_rounded), product(fp32))
            if rows > 32:
                assert torch.equal(product(rows_rounded[16:48]), product(fp32[16:48]))


def test_rounded_rows_refuse_what_the_products_cannot_read(kernels: CpuKernels) -> None:
    rounded = kernels.rms_norm_rounded(torch.randn(40, 64), torch.ones(64), 1e-5)[0]
    with pytest.raises(ValueError, match="multiple of 16"):
        rounded[8:24]
    with pytest.raises(ValueError, match="multiple of 32"):
        kernels.rms_norm_rounded(torch.randn(3, 40), torch.ones(40), 1e-5)
    with pytest.raises(ValueError, match="multiple of 32"):
        kernels.silu_and_mul_rounded(torch.randn(3, 80))
    weight = Int4Weight.quantize(torch.randn(16, 64))
    with pytest.raises(ValueError, match="one-digit"):
        kernels.int4(weight.codes, weight.scale, weight.minimum, 16, digits=2)(rounded)
    with pytest.raises(ValueError, match="x.codes"):
        kernels.int4(weight.codes, weight.scale, weight.minimum, 16)(RoundedRows.empty(4, 96))


@ON_EMULATED_AVX512
@pytest.mark.parametrize("rows, n", [(1, 8), (37, 576 + 5), (3, 2048)])
def test_rms_norm_is_torch_s_within_rounding(kernels: CpuKernels, rows: int, n: int) -> None:
    """Over the vector body and its scalar tail, with the residual added first and without, over more
    rows than one thread takes."""
    x, delta, weight = torch.randn(rows, n) * 3, torch.randn(rows, n), torch.rand(n) + 0.5
    normed, same = kernels.rms_norm(x, weight, 1e-5)
    assert same is x
    torch.testing.assert_close(normed, torch.rms_norm(x, (n,), weight, 1e-5), rtol=1e-6, atol=1e-6)
    normed, total = kernels.rms_norm(x, weight, 1e-5, delta)
    assert torch.equal(total, x + delta)
    torch.testing.assert_close(normed, torch.rms_norm(x + delta, (n,), weight, 1e-5), rtol=1e-6, atol=1e-6)


# -- the boundary ---------------------------------------------------------------------------------
def test_rotary_and_swiglu_refuse_what_the_c_code_cannot_read(kernels: CpuKernels) -> None:
    cos = sin = torch.ones(4, 16)
    with pytest.raises(ValueError, match="x must hold each token's heads contiguous"):
        kernels.rotary(torch.randn(4, 16, 2).transpose(1, 2), cos, sin)
    with pytest.raises(ValueError, match="x must be torch.float32 on the CPU, got torch.bfloat16"):
        kernels.rotary(torch.randn(4, 2, 16, dtype=torch.bfloat16), cos, sin)
    with pytest.raises(ValueError, match=r"x must be a \[tokens, heads, d\] tensor"):
        kernels.rotary(torch.randn(4, 16), cos, sin)
    with pytest.raises(ValueError, match=r"sin must have shape \[4, 16\], got \[3, 16\]"):
        kernels.rotary(torch.randn(4, 2, 16), cos, torch.ones(3, 16))
    with pytest.raises(ValueError, match="gate_up must have an even number of columns, got 7"):
        kernels.silu_and_mul(torch.randn(2, 7))
    with pytest.raises(ValueError, match="gate_up must be contiguous"):
        kernels.silu_and_mul(torch.randn(8, 2).T)


def test_products_refuse_what_the_c_code_cannot_read(kernels: CpuKernels) -> None:
    weight = Int4Weight.quantize(torch.randn(8, 128))
    matmul = kernels.int4(weight.codes, weight.scale, weight.minimum, 8)
    with pytest.raises(ValueError, match=r"x must have shape \[\*, 128\], got \[2, 64\]"):
        matmul(torch.randn(2, 64))
    with pytest.raises(ValueError, match="x must be torch.float32, got torch.float64"):
        matmul(torch.randn(2, 128, dtype=torch.float64))
    with pytest.raises(ValueError, match="x must be contiguous"):
        matmul(torch.randn(128, 2).T)
    with pytest.raises(ValueError, match="x must be on the CPU, got meta"):
        matmul(torch.empty(2, 128, device="meta"))
    with pytest.raises(ValueError, match="digits must be 1 or 2, got 3"):
        kernels.int4(weight.codes, weight.scale, weight.minimum, 8, digits=3)
    with pytest.raises(ValueError, match="int4 weight scale must have shape"):
        kernels.int4(weight.codes, weight.scale[:, :2].contiguous(), weight.minimum, 8)
    with pytest.raises(ValueError, match="int4 weight minimum must be torch.float16"):
        kernels.int4(weight.codes, weight.scale, weight.minimum.float(), 8)
    with pytest.raises(ValueError, match=r"int4 weight codes must have shape \[2, \*\]"):
        kernels.int4(weight.codes, weight.scale, weight.minimum, 17)  # 17 rows take 2 tiles
    with pytest.raises(ValueError, match="int8 weight codes must have a multiple of 512 bytes a tile"):
        kernels.int8(torch.zeros(1, 48 * 16, dtype=torch.int8), torch.ones(16), 4)
    int8 = Int8Weight.quantize(torch.randn(8, 128))
    with pytest.raises(ValueError, match=r"int8 weight scale must have shape \[16\]"):
        kernels.int8(int8.codes, int8.scale[:8].contiguous(), 8)
    with pytest.raises(ValueError, match="delta must have shape"):
        kernels.rms_norm(torch.randn(3, 16), torch.ones(16), 1e-5, torch.randn(2, 16))


def test_paged_attention_refuses_mismatched_arguments(kernels: CpuKernels) -> None:
    pool = torch.zeros(10, 2, 16)
    good = {
        "q": torch.randn(2, 4, 16), "k": torch.randn(2, 2, 16), "v": torch.randn(2, 2, 16),
        "out_slots": torch.tensor([0, 1]), "k_pool": pool, "v_pool": pool.clone(),
        "kv_slots": torch.tensor([[0, 3], [1, 2]]), "kv_lens": torch.tensor([2, 1]),
    }  # fmt: skip
    kernels.paged_decode_attention(**good)
    bad = [
        ("kv_lens", good["kv_lens"].int(), "kv_lens must be torch.int64"),
        ("kv_lens", torch.tensor([3, 1]), "kv_lens holds a length outside"),
        ("kv_lens", torch.tensor([-1, 1]), "kv_lens holds a length outside"),
        ("out_slots", torch.tensor([0, 10]), "out_slots holds a slot outside the pool"),
        ("kv_slots", torch.tensor([[0, 10], [1, 2]]), "kv_slots holds an attended slot outside the pool"),
        ("k", torch.randn(2, 3, 16), r"k must have shape \[2, 2, 16\]"),
        ("v_pool", pool.bfloat16(), "v_pool must be torch.float32"),
        ("q", torch.randn(2, 3, 16), "1-16 query heads per KV head"),
        ("kv_slots", torch.tensor([[0, 3], [1, 2]]).T, "kv_slots must be contiguous"),
    ]
    for name, value, message in bad:
        with pytest.raises(ValueError, match=message):
            kernels.paged_decode_attention(**{**good, name: value})


@ON_EMULATED_AVX512
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_store_kv_writes_what_the_pool_s_own_store_writes(kernels: CpuKernels, dtype: torch.dtype) -> None:
    """An extend pass's keys and values as views into a fused QKV output (rows wider than a token's
    heads), values near bf16's rounding ties among them: the body and the reference store the same bits
    at the same slots as ``KVPool.store`` (torch's cast and index_copy_), and leave every other slot."""
    g = torch.Generator().manual_seed(7)
    tokens, heads, kv_heads, d = 40, 6, 2, 32
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=g)
    ties = qkv[:, ::3].contiguous().view(torch.int32) & ~0xFFFF | 0x8000  # halfway between two bf16 neighbours
    qkv[:, ::3] = ties.view(torch.float32)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(tokens, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d :].view(tokens, kv_heads, d)
    out_slots = torch.randperm(100, generator=g)[:tokens]
    expected = KVPool(1, 100, 1, kv_heads, d, dtype, torch.device("cpu"))
    expected.store(0, out_slots, k, v)
    for reference in (True, False):
        k_pool, v_pool = (torch.full((100, kv_heads, d), 3.0, dtype=dtype) for _ in range(2))
        kernels.store_kv(k, v, out_slots, k_pool, v_pool, reference=reference)
        untouched = torch.ones(100, dtype=torch.bool)
        untouched[out_slots] = False
        for pool, want in ((k_pool, expected.k[0]), (v_pool, expected.v[0])):
            assert torch.equal(pool[out_slots].view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                               want[out_slots].view(torch.int16 if dtype == torch.bfloat16 else torch.int32))  # fmt: skip
            assert bool((pool[untouched] == 3.0).all())


def test_store_kv_refuses_mismatched_arguments(kernels: CpuKernels) -> None:
    pool = torch.zeros(10, 2, 16, dtype=torch.bfloat16)
    good = {"k": torch.randn(3, 2, 16), "v": torch.randn(3, 2, 16), "out_slots": torch.tensor([0, 4, 9]),
            "k_pool": pool, "v_pool": pool.clone()}  # fmt: skip
    kernels.store_kv(**good)
    stored = pool.clone()
    bad = [
        ("out_slots", torch.tensor([0, 4, 10]), "out_slots holds a slot outside the pool"),
        ("out_slots", torch.tensor([0, 4]), r"out_slots must have shape \[3\]"),
        ("v", torch.randn(3, 1, 16), "v must have k's shape"),
        ("v_pool", pool.float(), "v_pool must be torch.bfloat16"),
        ("k_pool", torch.zeros(10, 2, 8, dtype=torch.bfloat16), r"k_pool must have shape \[\*, 2, 16\]"),
        ("k", torch.randn(3, 16, 2).transpose(1, 2), "k must hold each token's heads contiguous"),
    ]
    for name, value, message in bad:
        with pytest.raises(ValueError, match=message):
            kernels.store_kv(**{**good, name: value})
    assert torch.equal(pool, stored)  # a refused call wrote nothing


@ON_EMULATED_AVX512
@pytest.mark.parametrize("rows, n", [(1, 49152), (32, 49152), (9, 37), (3, 7)])
def test_argmax_is_max_s_indices(kernels: CpuKernels, rows: int, n: int) -> None:
    """Every build's argmax and its reference against torch.max's indices: rows whose largest value repeats
    (the first wins, -0.0 and 0.0 alike), masked rows (all -inf), and rows with NaNs (the first NaN's
    index), at widths on both sides of a vector's."""
    g = torch.Generator().manual_seed(rows * n)
    x = torch.randint(-3, 3, (rows, n), generator=g).float()
    x[0, -1] = 3.0  # the largest in the last lane: past every whole vector where n is not a multiple of one
    if rows > 2:
        x[1] = float("-inf")
        x[2, n // 2 :] = float("nan")
    if rows > 3:
        x[3] = 0.0
        x[3, ::2] = -0.0
    for reference in (True, False):
        assert torch.equal(kernels.argmax(x, reference=reference), x.max(dim=-1).indices), reference
    for bad, message in ((torch.zeros(2, 0), "at least one column"), (x.double(), "x must be torch.float32"),
                         (torch.zeros(4, 6)[:, ::2], "x must be contiguous")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            kernels.argmax(bad)


@ON_EMULATED_AVX512
@pytest.mark.parametrize("rows, n", [(1, 49152), (32, 49152), (9, 37), (3, 7)])
def test_logsumexp_is_torch_s(kernels: CpuKernels, rows: int, n: int) -> None:
    """Every build's log-sum-exp and its reference against torch's (in float64): logits as large as a model's,
    a row whose largest value is in its last lane, rows with a NaN (NaN), all -inf (-inf) and an +inf (+inf),
    at widths on both sides of a vector's."""
    g = torch.Generator().manual_seed(rows * n)
    x = torch.randn(rows, n, generator=g) * 8
    x[0, -1] = 60.0
    if rows > 3:
        x[1, n // 2] = float("nan")
        x[2] = float("-inf")
        x[3, 1] = float("inf")
    expected = torch.logsumexp(x.double(), dim=-1).float()
    for reference in (True, False):
        got = kernels.logsumexp(x, reference=reference)
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-6, equal_nan=True, msg=f"reference={reference}")
    for bad, message in ((torch.zeros(2, 0), "at least one column"), (x.double(), "x must be torch.float32"),
                         (torch.zeros(4, 6)[:, ::2], "x must be contiguous")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            kernels.logsumexp(bad)


def test_prefill_attention_refuses_mismatched_arguments(kernels: CpuKernels) -> None:
    pool = torch.zeros(10, 2, 16, dtype=torch.bfloat16)
    good = {
        "q": torch.randn(3, 4, 16), "k_pool": pool, "v_pool": pool.clone(), "kv_slots": torch.tensor([[0, 3], [1, 2]]),
        "q_starts": torch.tensor([0, 2]), "new_lens": torch.tensor([2, 1]), "prefix_lens": torch.tensor([0, 1]),
    }  # fmt: skip
    kernels.prefill_attention(**good, reference=True)
    bad = [
        ("k_pool", pool.float(), "k_pool must be torch.bfloat16"),
        ("prefix_lens", torch.tensor([1, 1]), "kv_lens holds a length outside"),
        ("new_lens", torch.tensor([2, 2]), "refused the shapes"),  # request 1's rows run past q's
        ("q_starts", torch.tensor([-1, 2]), "refused the shapes"),
        ("kv_slots", torch.tensor([[0, 10], [1, 2]]), "kv_slots holds an attended slot outside the pool"),
        ("q", torch.randn(3, 3, 16), "heads a multiple of KV heads"),
        ("q", torch.randn(3, 16, 4).transpose(1, 2), "q must hold each token's heads contiguous"),
        ("new_lens", torch.tensor([2]), r"new_lens must have shape \[2\]"),
    ]
    for name, value, message in bad:
        with pytest.raises(ValueError, match=message):
            kernels.prefill_attention(**{**good, name: value}, reference=True)


def test_the_decode_step_refuses_mismatched_arguments(kernels: CpuKernels) -> None:
    hidden, heads, kv_heads, d, intermediate = 64, 4, 2, 16, 128

    def int4(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        w = Int4Weight.quantize(torch.randn(n, k))
        return w.codes, w.scale, w.minimum

    layer = LayerWeights(
        hidden, heads, kv_heads, d, intermediate, 1e-5, torch.ones(hidden), torch.ones(hidden),
        int4((heads + 2 * kv_heads) * d, hidden), int4(hidden, heads * d), int4(2 * intermediate, hidden),
        int4(hidden, intermediate),
    )  # fmt: skip
    decoder = kernels.fused_decoder([layer])
    pools = (torch.zeros(1, 8, kv_heads, d), torch.zeros(1, 8, kv_heads, d))
    x, rope = torch.randn(1, hidden), (torch.ones(1, d), torch.zeros(1, d))
    slots = (torch.tensor([0]), torch.tensor([[0, 1]]), torch.tensor([1]))
    out, residual = decoder.run(x, *rope, *pools, *slots)
    assert out.shape == residual.shape == (1, hidden) and bool(out.isfinite().all())
    with pytest.raises(ValueError, match=r"x must have shape \[\*, 64\]"):
        decoder.run(torch.randn(1, 32), *rope, *pools, *slots)
    with pytest.raises(ValueError, match="kv_slots holds an attended slot outside the pool"):
        decoder.run(x, *rope, *pools, slots[0], torch.tensor([[8, 0]]), slots[2])
    before = [p.clone() for p in pools]
    with pytest.raises(ValueError, match="out_slots holds a slot outside the pool"):
        decoder.run(x, *rope, *pools, torch.tensor([-1]), *slots[1:])
    assert all(torch.equal(a, b) for a, b in zip(before, pools))  # refused before anything was stored
    with pytest.raises(ValueError, match=r"layer 0 down must be \[64, 128\]"):
        kernels.fused_decoder([LayerWeights(**{**layer.__dict__, "down": int4(hidden, 64)})])
