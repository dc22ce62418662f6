"""The engine's C kernels (``cpu/*.c``), built for this machine on first use and called through cffi.

- ``quant_gemm.c``: the int4 and int8 weight-only products at every row count, on the weights' tiles
  of 16 rows (``Int4Weight``, ``Int8Weight``), fp32 in and out: decode streams each tile once,
  prefill runs the same loops as a GEMM. torch's CPU kernels for them take bf16 activations.
- ``bf16_gemm.c``: the amx build's products of prefill rows: x and the dequantized weight in bf16 on
  AMX-BF16's tile products, as vLLM's and llama.cpp's CPU prefill run.
- ``paged_attention.c``: decode attention read in place from the KV pool, no gathered copy (over a bf16
  pool in bf16 products where the CPU issues them as fast as fp32 fmas: ``decode_attention_bf16``).
- ``prefill_attention.c``: an extend pass's causal attention over a bf16 pool, in bf16 products
  (AVX-512 BF16; the AVX2 builds the same in fp32 fmas; an avx512 build without AVX-512 BF16 leaves it to torch's
  SDPA).
- ``rms_norm.c``: RMSNorm (after a residual add) in one call instead of torch's seven ops; also with its
  output rounded as the products round their rows (``RoundedRows``), as ``activation.c``'s SwiGLU too.
- ``rotary.c``: RoPE, with torch's roundings, for ``decode_layer.c``.
- ``logits.c``: the sampler's greedy tokens (argmax) and the log-sum-exp its log-probabilities take.
- ``gguf_tiles.c``: a GGUF file's Q4_0 / Q4_1 / Q8_0 blocks written into those tiles, for the loader.
- ``decode_layer.c``: a whole decode step through int4 Llama layers, the kernels above chained in C
  (``FusedDecoder``): at one request the Python between them was a third of the step.

Variants: the same sources are built into one library per instruction set (``VARIANTS``: AVX-512
VNNI with AMX-BF16 for prefill rows and AMX-INT8 for decode batches, AVX-512 VNNI, AVX2 + AVX-VNNI,
AVX2 + FMA), each with its own ``-m`` flags, into the user's cache, with the system's C compiler (``cc``,
or ``$CC``).
``host_variants`` says which this CPU can run (from ``/proc/cpuinfo``); the engine resolves
``EngineConfig.kernels`` once (``resolve_kernels``) and hands the loaded library, or None for torch's
kernels, to the layers, the attention backend and the model.
A CPU with none of the variants runs torch's kernels, and the log says so.

The boundary is ``cpu/kernels.h``: cffi parses it, so the structs and prototypes are declared once,
and every method here checks its tensors (device, dtype, shape, contiguity) before the call, raising
a ``ValueError`` that names the argument.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any, Protocol

import cffi
import torch

from minisgl.kernels.build import SOURCE_DIR, build
from minisgl.kernels.variants import VARIANTS, Variant, cpu_flags, variants_for

logger = logging.getLogger("minisgl.kernels")

HEADER = SOURCE_DIR / "kernels.h"


ROUNDED_ROW_BLOCK = 16  # the amx build's tile loads read a RoundedRows' codes this many rows at a time


@dataclass(frozen=True)
class RoundedRows:
    """Rows of x rounded as the quantized products round theirs (one int8 digit per group of 32 columns,
    quant_gemm.c) by the layer that computed them (``CpuKernels.rms_norm_rounded``, ``silu_and_mul_rounded``),
    instead of written out in fp32 and read back by the product to round: the product reads a quarter of
    the bytes. ``codes`` [rows, K] int8 in a buffer of a multiple of ``ROUNDED_ROW_BLOCK`` rows; per row and
    group ``step`` and ``sum`` fp32 and ``total`` int32 (kernels.h's int4_gemm_rounded)."""

    codes: torch.Tensor
    step: torch.Tensor
    total: torch.Tensor
    sum: torch.Tensor

    @staticmethod
    def empty(rows: int, k: int) -> RoundedRows:
        padded = -(-rows // ROUNDED_ROW_BLOCK) * ROUNDED_ROW_BLOCK
        groups = k // 32
        codes = torch.empty(padded, k, dtype=torch.int8)[:rows]
        total = torch.empty(rows, groups, dtype=torch.int32)
        return RoundedRows(codes, torch.empty(rows, groups), total, torch.empty(rows, groups))

    def __len__(self) -> int:
        return self.step.shape[0]

    def __getitem__(self, rows: slice) -> RoundedRows:
        """Rows ``start:stop`` (``start`` a multiple of ROUNDED_ROW_BLOCK: the codes stay readable to a
        multiple of it)."""
        start, stop, stride = rows.indices(len(self))
        if stride != 1 or start % ROUNDED_ROW_BLOCK:
            raise ValueError(f"rows of RoundedRows start at a multiple of {ROUNDED_ROW_BLOCK}, one by one; got {rows}")
        return RoundedRows(self.codes[start:stop], self.step[start:stop], self.total[start:stop], self.sum[start:stop])


class Matmul(Protocol):
    """A quantized weight's product: x [rows, K] fp32 → [rows, N] fp32, x rounded to the int8 digits the
    product was bound with (quant_gemm.c), or already rounded (``RoundedRows``; one digit); where the
    library has a tile unit's path for prefill tokens (``CpuKernels.bf16_prefill``), the first
    ``prefill_rows`` rows of fp32 x take it instead (bf16_gemm.c). The product is written into ``out``
    where given (a contiguous fp32 [rows, N]), else into a new tensor."""

    def __call__(
        self, x: torch.Tensor | RoundedRows, prefill_rows: int = 0, out: torch.Tensor | None = None
    ) -> torch.Tensor: ...


class PrefillMlp(Protocol):
    """A SwiGLU MLP's prefill rows (``CpuKernels.prefill_mlp``): x [rows, H] fp32 → [rows, H], written into
    ``out`` where given (a contiguous fp32 [rows, H])."""

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor: ...


def resolve_kernels(choice: str, flags: frozenset[str] | None = None) -> CpuKernels | None:
    """The library ``choice`` asks for on a CPU with ``flags`` (this one's by default), or None for
    torch's kernels. ``auto`` takes the best variant that builds and logs why none did; ``c`` and
    ``c:<variant>`` raise a ``RuntimeError`` saying why instead."""
    runnable = variants_for(choice, cpu_flags() if flags is None else flags)
    if choice == "torch":
        return None
    if choice.startswith("c:") and not runnable:
        raise RuntimeError(f"kernels={choice!r}: this CPU cannot run the {choice.removeprefix('c:')} variant")
    failures = []
    for variant in runnable:
        try:
            return load_variant(variant.name)
        except OSError as e:
            failures.append(f"{variant.name}: {e}")
    why = "; ".join(failures) if failures else "the CPU has none of AVX-512 VNNI, AVX-VNNI, AVX2 + FMA + F16C"
    if choice == "auto":
        logger.warning("C kernels unavailable, torch's kernels run instead: %s", why)
        return None
    raise RuntimeError(f"kernels={choice!r}: the C kernels cannot run here: {why}")


@cache
def load_variant(name: str) -> CpuKernels:
    """One variant's library, built on first use (a few seconds) and then loaded from the cache.
    Raises ``OSError`` where it does not build."""
    return load_sources(name, SOURCE_DIR)


def load_sources(name: str, source_dir: Path) -> CpuKernels:
    """One variant's library built from the kernel sources in ``source_dir`` and bound through that
    directory's own ``kernels.h``: this package's (``load_variant``), or another commit's for a benchmark
    that times two commits' kernels in one process."""
    variant = next(v for v in VARIANTS if v.name == name)
    return CpuKernels(build(variant, source_dir), variant, source_dir / "kernels.h")


@cache
def _ffi(header: Path) -> cffi.FFI:
    """The boundary as cffi reads it: ``header`` (``kernels.h``) without its preprocessor lines."""
    ffi = cffi.FFI()
    ffi.cdef("\n".join(line for line in header.read_text().splitlines() if not line.lstrip().startswith("#")))
    return ffi


def open_library(path: Path, header: Path = HEADER) -> Any:
    """The library at ``path`` bound through ``header``'s declarations (cffi); nothing in it is called."""
    return _ffi(header).dlopen(str(path))


def undefined_declarations(lib: Any) -> list[str]:
    """The names ``lib``'s header declares that the library does not define (looked up, none called: a
    build this CPU cannot execute is checked too)."""
    missing = []
    for name in dir(lib):
        try:
            getattr(lib, name)
        except AttributeError:
            missing.append(name)
    return missing


_C_TYPES = {
    torch.float32: "float *", torch.bfloat16: "uint16_t *", torch.float16: "uint16_t *", torch.int64: "int64_t *",
    torch.int8: "int8_t *", torch.uint8: "uint8_t *", torch.int32: "int32_t *",
}  # fmt: skip


def _check(name: str, t: object, dtypes: tuple[torch.dtype, ...], shape: tuple[int | None, ...]) -> torch.Tensor:
    """``t`` as the C code reads it: a contiguous CPU tensor of one of ``dtypes`` and ``shape``
    (None: any size), else a ``ValueError`` naming ``name``."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")  # noqa: TRY004 - one error for any bad argument
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, got {t.device}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must be {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
    if t.dim() != len(shape) or any(want is not None and want != got for want, got in zip(shape, t.shape)):
        wanted = ", ".join("*" if s is None else str(s) for s in shape)
        raise ValueError(f"{name} must have shape [{wanted}], got {list(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (strides {t.stride()})")
    return t


def _check_token_rows(name: str, t: object) -> tuple[int, int, int]:
    """``t``'s (tokens, heads, d) where it is an fp32 CPU [tokens, heads, d] tensor whose heads of a token
    lie contiguous, the tokens' rows any number of floats apart (at least a row's), else a ``ValueError``
    naming ``name``."""
    if not isinstance(t, torch.Tensor) or t.dim() != 3:
        raise ValueError(f"{name} must be a [tokens, heads, d] tensor, got {getattr(t, 'shape', type(t).__name__)}")
    tokens, heads, d = t.shape
    if t.dtype != torch.float32 or t.device.type != "cpu":
        raise ValueError(f"{name} must be torch.float32 on the CPU, got {t.dtype} on {t.device}")
    if (d > 1 and t.stride(2) != 1) or (heads > 1 and t.stride(1) != d) or (tokens > 1 and t.stride(0) < heads * d):
        raise ValueError(
            f"{name} must hold each token's heads contiguous (shape {list(t.shape)}, strides {t.stride()})"
        )
    return tokens, heads, d


Int4Buffers = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # codes, scale, minimum (``int4``'s layout)


QUANT_TILE = 16  # output rows per tile of a quantized weight (kernels.h's Int4 and Int8)


def _check_int4(name: str, weight: Int4Buffers, n: int) -> int:
    """The K of an [n, K] int4 weight in tiles (kernels.h's Int4), its three buffers checked against
    each other: codes [tiles, 8 K] uint8, scale and minimum [tiles, K / 2] fp16."""
    codes, scale, minimum = weight
    tiles = -(-n // QUANT_TILE)
    _check(f"{name} codes", codes, (torch.uint8,), (tiles, None))
    k = codes.shape[1] // 8
    if codes.shape[1] % (8 * 32) or k == 0:
        raise ValueError(
            f"{name} codes must have a multiple of 256 bytes a tile (32 int4 columns), got {codes.shape[1]}"
        )
    _check(f"{name} scale", scale, (torch.float16,), (tiles, k // 2))
    _check(f"{name} minimum", minimum, (torch.float16,), (tiles, k // 2))
    return k


Int8Buffers = tuple[torch.Tensor, torch.Tensor]  # codes, scale (``int8``'s)


def _check_int8(name: str, weight: Int8Buffers, n: int) -> int:
    """The K of an [n, K] int8 weight in tiles (kernels.h's Int8): codes [tiles, 16 K] int8, scale
    [tiles * 16] fp32."""
    codes, scale = weight
    tiles = -(-n // QUANT_TILE)
    _check(f"{name} codes", codes, (torch.int8,), (tiles, None))
    k = codes.shape[1] // QUANT_TILE
    if codes.shape[1] % (QUANT_TILE * 32) or k == 0:
        raise ValueError(
            f"{name} codes must have a multiple of 512 bytes a tile (32 int8 columns), got {codes.shape[1]}"
        )
    _check(f"{name} scale", scale, (torch.float32,), (tiles * QUANT_TILE,))
    return k


def _check_rows(first: int, rows: int, n: int) -> None:
    if not 0 <= first <= first + rows <= n:
        raise ValueError(f"rows {first}..{first + rows} outside the weight's {n}")


def _check_projection(name: str, weight: Int4Buffers | Int8Buffers, n: int, k: int) -> None:
    """A projection (``decode_layer.c``, ``mlp_bf16``) [n, k], int4 (three buffers) or int8 (two)."""
    if (_check_int4(name, weight, n) if len(weight) == 3 else _check_int8(name, weight, n)) != k:
        raise ValueError(f"{name} must be [{n}, {k}]")


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer with a dense MLP whose four projections are int4 or int8 (``decode_layer.c``):
    Llama's, Qwen2's (a QKV bias) or Qwen3's (Q/K head norms)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    input_norm: torch.Tensor  # fp32 [hidden]
    post_norm: torch.Tensor
    qkv: Int4Buffers | Int8Buffers  # [(heads + 2 kv_heads) * head_dim, hidden]
    o: Int4Buffers | Int8Buffers
    gate_up: Int4Buffers | Int8Buffers  # gate rows, then up rows
    down: Int4Buffers | Int8Buffers
    qkv_bias: torch.Tensor | None = None  # fp32 [(heads + 2 kv_heads) * head_dim] (Qwen2)
    q_norm: torch.Tensor | None = None  # fp32 [head_dim], with k_norm (Qwen3): eps is the layer's
    k_norm: torch.Tensor | None = None


class CpuKernels:
    """One variant's library loaded. ``int4``/``int8`` bind a weight once and return its product
    with fp32 rows: a decode step makes ~120 of these calls, so each does little more than check
    ``x`` and call. Methods with ``reference=True`` run the plain C reference the library exports
    instead of its SIMD body (the tests' yardstick)."""

    def __init__(
        self, path: Path, variant: Variant, header: Path = HEADER, calls: Callable[[Any, cffi.FFI], Any] | None = None
    ) -> None:
        """``path``: the library, built from the sources beside ``header``, its declarations. ``calls``: what
        its functions are called through, given the library and its ffi (the tests' emulated CPU, for a
        build this one cannot execute); None calls them directly."""
        self.variant, self.ffi = variant, _ffi(header)
        library = open_library(path, header)
        missing = undefined_declarations(library)  # now, not at first use
        if missing:
            raise OSError(f"{path.name} lacks {', '.join(missing)}, which kernels.h declares")
        self.lib: Any = library if calls is None else calls(library, self.ffi)
        built = self.ffi.string(self.lib.kernels_variant()).decode()
        if built != variant.name:
            raise OSError(f"the {variant.name} build compiled the {built} bodies: the compiler lacks its flags")
        if self.lib.kernels_prepare() != self.lib.KERNELS_OK:
            raise OSError(f"the OS refused the {variant.name} build's instructions (AMX: arch_prctl's tile permission)")
        # Prefill rows' products in bf16 on the tile unit (the amx build's; the others refuse any call).
        none = self.ffi.NULL
        self.bf16_prefill = self.lib.int4_gemm_bf16(none, 0, 32, none, none, none, 0, none, 1) == self.lib.KERNELS_OK

    def __repr__(self) -> str:
        return f"CpuKernels({self.variant.name})"

    def pointer(self, t: torch.Tensor) -> Any:
        """``t``'s data as the C type of its dtype (the tensor must outlive the pointer's use)."""
        return self.ffi.cast(_C_TYPES[t.dtype], t.data_ptr())

    def raise_for(self, what: str, code: int) -> None:
        """The exception a kernel's error code (kernels.h) stands for, raised; nothing for 0. The
        paged attention checks its slots and lengths itself (cheaper there than a torch op each)."""
        lib = self.lib
        if code == lib.KERNELS_NO_MEMORY:
            raise MemoryError(f"{what}: the kernel's buffers could not be allocated")
        problems = {
            lib.KERNELS_BAD_OUT_SLOT: "out_slots holds a slot outside the pool",
            lib.KERNELS_BAD_KV_LEN: "kv_lens holds a length outside [0, kv_slots' row length]",
            lib.KERNELS_BAD_KV_SLOT: "kv_slots holds an attended slot outside the pool",
            lib.KERNELS_NO_INSTRUCTIONS: "this CPU lacks the instructions its body needs",
        }
        if code:
            raise ValueError(f"{what}: {problems.get(code, f'the kernel refused the shapes (code {code})')}")

    def int4(
        self,
        codes: torch.Tensor,
        scale: torch.Tensor,
        minimum: torch.Tensor,
        n: int,
        digits: int = 1,
        reference: bool = False,
    ) -> Matmul:
        """An [n, K] int4 weight's tiles (``Int4Weight``; kernels.h's Int4). The product takes
        [rows, K] fp32 and gives [rows, n] fp32, x rounded to ``digits`` (1 or 2) int8 digits per
        group of 32 columns."""
        k = _check_int4("int4 weight", (codes, scale, minimum), n)
        weight = (self.pointer(codes), self.pointer(scale), self.pointer(minimum))
        return self._bind("int4_gemm", n, k, digits, weight, (codes, scale, minimum), reference)

    def int8(
        self, codes: torch.Tensor, scale: torch.Tensor, n: int, digits: int = 1, reference: bool = False
    ) -> Matmul:
        """An [n, K] int8 weight's tiles (``Int8Weight``; kernels.h's Int8). The product takes
        [rows, K] fp32 and gives [rows, n] fp32, x rounded as for ``int4``."""
        k = _check_int8("int8 weight", (codes, scale), n)
        weight = (self.pointer(codes), self.pointer(scale))
        return self._bind("int8_gemm", n, k, digits, weight, (codes, scale), reference)

    def set_projection(self, field: Any, buffers: Int4Buffers | Int8Buffers) -> None:
        """A kernels.h ``Projection`` (``field``, a cffi view) pointed at a weight's buffers: int4 with three,
        int8 with two (checked by ``_check_projection``; the caller keeps the tensors alive)."""
        if len(buffers) == 3:
            field.bits, field.int4.codes, field.int4.scale, field.int4.minimum = 4, *map(self.pointer, buffers)
        else:
            field.bits, field.int8.codes, field.int8.scale = 8, *map(self.pointer, buffers)

    def prefill_mlp(
        self,
        gate_up: Int4Buffers | Int8Buffers,
        down: Int4Buffers | Int8Buffers,
        hidden: int,
        intermediate: int,
        reference: bool = False,
    ) -> PrefillMlp:
        """A SwiGLU MLP's prefill rows on the tile unit (``mlp_bf16``: the amx build's, see ``bf16_prefill``):
        x [rows, hidden] fp32 → down(silu(gate) * up), gate_up [2 intermediate, hidden] (gate rows, then up
        rows) and down [hidden, intermediate] each int4 (three buffers) or int8 (two); into ``out`` where given.
        Each row the same bits as ``int4``/``int8``'s prefill rows through gate_up, ``silu_and_mul`` and down,
        gate_up never written out. With ``reference``, ``mlp_bf16_ref``."""
        _check_projection("gate_up", gate_up, 2 * intermediate, hidden)
        _check_projection("down", down, hidden, intermediate)
        structs = self.ffi.new("Projection[2]")
        self.set_projection(structs[0], gate_up)
        self.set_projection(structs[1], down)
        keep = (*gate_up, *down)

        def mlp(
            x: torch.Tensor, out: torch.Tensor | None = None, keep: tuple[torch.Tensor, ...] = keep
        ) -> torch.Tensor:
            _check("x", x, (torch.float32,), (None, hidden))
            y = torch.empty(x.shape[0], hidden) if out is None else _check("out", out, (torch.float32,), x.shape)
            args = (self.pointer(x), x.shape[0], hidden, structs, intermediate, structs + 1, self.pointer(y))
            if reference:
                self.raise_for("mlp_bf16_ref", self.lib.mlp_bf16_ref(*args))
            else:
                self.raise_for("mlp_bf16", self.lib.mlp_bf16(*args, torch.get_num_threads()))
            return y

        return mlp

    def int4_from_gguf(self, blocks: torch.Tensor, q4_1: bool, first: int, weight: Int4Buffers, n: int) -> None:
        """GGUF Q4_0 (or, with ``q4_1``, Q4_1) ``blocks`` [rows, K / 32 * block bytes] uint8 written as
        they are into rows ``first ..`` of an [n, K] int4 weight's tiles (kernels.h's Int4)."""
        k = _check_int4("int4 weight", weight, n)
        _check("blocks", blocks, (torch.uint8,), (None, k // 32 * (20 if q4_1 else 18)))
        _check_rows(first, blocks.shape[0], n)
        p = self.pointer
        args = (p(blocks), int(q4_1), blocks.shape[0], k, first, *map(p, weight), n, torch.get_num_threads())
        self.raise_for("int4_tiles_from_gguf", self.lib.int4_tiles_from_gguf(*args))

    def int8_from_q8_0(self, blocks: torch.Tensor, first: int, weight: Int8Buffers, n: int) -> None:
        """GGUF Q8_0 ``blocks`` [rows, K / 32 * 34] uint8 rounded to one scale per row, as
        ``Int8Weight.quantize`` rounds the dequantized rows, into rows ``first ..`` of an [n, K] int8
        weight's tiles (kernels.h's Int8)."""
        k = _check_int8("int8 weight", weight, n)
        _check("blocks", blocks, (torch.uint8,), (None, k // 32 * 34))
        _check_rows(first, blocks.shape[0], n)
        p = self.pointer
        args = (p(blocks), blocks.shape[0], k, first, *map(p, weight), n, torch.get_num_threads())
        self.raise_for("int8_tiles_from_q8_0", self.lib.int8_tiles_from_q8_0(*args))

    def _bind(
        self,
        name: str,
        n: int,
        k: int,
        digits: int,
        weight: tuple[Any, ...],
        keep: tuple[torch.Tensor, ...],
        reference: bool,
    ) -> Matmul:
        """x [rows, k] → [rows, n]: the first ``prefill_rows`` rows through ``<name>_bf16(x, rows, k, *weight,
        n, y, threads)`` where the library has it (``bf16_prefill``), the others through ``name(x, digits,
        rows, k, *weight, n, y, threads)``; with ``reference``, their ``_ref`` functions (no threads). The
        weight's pointers are cast once (the closure keeps its tensors, so the pointers stay valid)."""
        if digits not in (1, 2):
            raise ValueError(f"digits must be 1 or 2, got {digits}")
        suffix = "_ref" if reference else ""
        run, prefill, cast = getattr(self.lib, name + suffix), getattr(self.lib, f"{name}_bf16{suffix}"), self.ffi.cast
        bf16_prefill = self.bf16_prefill

        def call(function: Any, what: str, *args: Any) -> None:
            self.raise_for(what, function(*args) if reference else function(*args, torch.get_num_threads()))

        def rounded(x: RoundedRows, prefill_rows: int, out: torch.Tensor | None) -> torch.Tensor:
            if digits != 1 or reference or (prefill_rows and bf16_prefill):
                raise ValueError(f"{name}: rounded rows take the one-digit products of decode rows or, without the "
                                 f"tile unit's prefill path, of any rows")  # fmt: skip
            rows = len(x)
            _check("x.codes", x.codes, (torch.int8,), (rows, k))
            for what, t, dtype in (("x.step", x.step, torch.float32), ("x.total", x.total, torch.int32),
                                   ("x.sum", x.sum, torch.float32)):  # fmt: skip
                _check(what, t, (dtype,), (rows, k // 32))
            y = torch.empty(rows, n) if out is None else _check("out", out, (torch.float32,), (rows, n))
            p = self.pointer
            call(getattr(self.lib, f"{name}_rounded"), f"{name}_rounded", p(x.codes), p(x.step), p(x.total),
                 p(x.sum), rows, k, *weight, n, p(y))  # fmt: skip
            return y

        def matmul(
            x: torch.Tensor | RoundedRows, prefill_rows: int = 0, out: torch.Tensor | None = None,
            keep: tuple[torch.Tensor, ...] = keep,
        ) -> torch.Tensor:  # fmt: skip
            if isinstance(x, RoundedRows):
                return rounded(x, prefill_rows, out)
            _check("x", x, (torch.float32,), (None, k))
            rows = x.shape[0]
            if not 0 <= prefill_rows <= rows:
                raise ValueError(f"prefill_rows must be within 0..{rows} (x's rows), got {prefill_rows}")
            y = torch.empty(rows, n) if out is None else _check("out", out, (torch.float32,), (rows, n))
            split = prefill_rows if bf16_prefill else 0
            y_at = y.data_ptr()
            if split:
                call(
                    prefill, f"{name}_bf16", cast("float *", x.data_ptr()), split, k, *weight, n, cast("float *", y_at)
                )
            if rows > split:
                x_rest, y_rest = cast("float *", x[split:].data_ptr()), cast("float *", y_at + 4 * split * n)
                call(run, name, x_rest, digits, rows - split, k, *weight, n, y_rest)
            return y

        return matmul

    def paged_decode_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out_slots: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        kv_slots: torch.Tensor,
        kv_lens: torch.Tensor,
        reference: bool = False,
    ) -> torch.Tensor:
        """``q``: [batch, heads, d] fp32; ``k``, ``v``: [batch, kv_heads, d] fp32, first stored at
        ``out_slots`` of ``k_pool``, ``v_pool`` (one layer's [slots, kv_heads, d], fp32 or bf16,
        written in place); ``kv_slots``: [batch, n] int64, of which row b's first ``kv_lens[b]`` are
        attended → [batch, heads * d]. q, k and v hold each request's heads contiguous, its rows any
        number of floats apart (views into the fused QKV output, as ``store_kv`` takes them)."""
        batch, heads, d = _check_token_rows("q", q)
        _check("k_pool", k_pool, (torch.float32, torch.bfloat16), (None, None, d))
        slots, kv_heads = k_pool.shape[0], k_pool.shape[1]
        _check("v_pool", v_pool, (k_pool.dtype,), tuple(k_pool.shape))
        _check_heads(heads, kv_heads, d)
        for name, t in (("k", k), ("v", v)):
            if _check_token_rows(name, t) != (batch, kv_heads, d):
                raise ValueError(f"{name} must have shape {[batch, kv_heads, d]}, got {list(t.shape)}")
        _check("out_slots", out_slots, (torch.int64,), (batch,))
        _check("kv_slots", kv_slots, (torch.int64,), (batch, None))
        _check("kv_lens", kv_lens, (torch.int64,), (batch,))
        out = torch.empty(batch, heads * d)
        p = self.pointer
        args = (
            p(q), q.stride(0), p(k), k.stride(0), p(v), v.stride(0), p(out_slots), p(k_pool), p(v_pool), slots,
            int(k_pool.dtype == torch.bfloat16), p(kv_slots), kv_slots.shape[1], p(kv_lens), batch, heads, kv_heads,
            d, d**-0.5, p(out),
        )  # fmt: skip
        if reference:
            self.raise_for("paged_decode_attention_ref", self.lib.paged_decode_attention_ref(*args))
        else:
            self.raise_for("paged_decode_attention", self.lib.paged_decode_attention(*args, torch.get_num_threads()))
        return out

    def store_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        out_slots: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        reference: bool = False,
    ) -> None:
        """An extend pass's new keys and values stored in place: ``k``, ``v`` [tokens, kv_heads, d] fp32,
        each token's heads contiguous and its rows any number of floats apart (views into the fused QKV
        output), at ``out_slots`` [tokens] of ``k_pool``, ``v_pool`` (one layer's [slots, kv_heads, d],
        fp32 or bf16), rounded as torch's cast rounds (``KVPool.store``'s bits)."""
        tokens, kv_heads, d = _check_token_rows("k", k)
        if _check_token_rows("v", v) != (tokens, kv_heads, d):
            raise ValueError(f"v must have k's shape {list(k.shape)}, got {list(v.shape)}")
        if d % 16:
            raise ValueError(f"store_kv needs head_dim % 16 == 0, got {d}")
        _check("k_pool", k_pool, (torch.float32, torch.bfloat16), (None, kv_heads, d))
        _check("v_pool", v_pool, (k_pool.dtype,), tuple(k_pool.shape))
        _check("out_slots", out_slots, (torch.int64,), (tokens,))
        p = self.pointer
        args = (
            p(k), k.stride(0), p(v), v.stride(0), p(out_slots), tokens, p(k_pool), p(v_pool), k_pool.shape[0],
            int(k_pool.dtype == torch.bfloat16), kv_heads, d,
        )  # fmt: skip
        if reference:
            self.raise_for("store_new_kv_ref", self.lib.store_new_kv_ref(*args))
        else:
            self.raise_for("store_new_kv", self.lib.store_new_kv(*args, torch.get_num_threads()))

    @cached_property
    def decode_attention_bf16(self) -> bool:
        """Whether this library's decode attention over a bf16 pool multiplies in bf16 on this CPU (queries and
        softmax weights rounded to bf16, as prefill attention's), else fp32: where it issues vdpbf16ps as fast as
        fp32 fmas."""
        return bool(self.lib.decode_attention_bf16())

    @cached_property
    def runs_prefill_attention(self) -> bool:
        """Whether this library's prefill attention runs on this CPU (the AVX2 builds', or AVX-512 BF16 for the
        AVX-512 ones)."""
        return bool(self.lib.prefill_attention_runs())

    def prefill_attention(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        kv_slots: torch.Tensor,
        q_starts: torch.Tensor,
        new_lens: torch.Tensor,
        prefix_lens: torch.Tensor,
        reference: bool = False,
    ) -> torch.Tensor:
        """Causal attention of an extend pass: ``q`` [tokens, heads, d] fp32, each token's heads
        contiguous and its rows any number of floats apart (a view into the fused QKV output); the pools
        one layer's [slots, kv_heads, d] bf16, every attended key and value already stored; request b's
        queries are rows ``q_starts[b]`` .. + ``new_lens[b]``, its keys the first ``prefix_lens[b] +
        new_lens[b]`` of ``kv_slots[b]`` ([batch, n] int64), its token t seeing ``prefix_lens[b] + t + 1``
        of them → [tokens, heads * d] (rows of no request are left as they were allocated)."""
        tokens, heads, d = _check_token_rows("q", q)
        _check("k_pool", k_pool, (torch.bfloat16,), (None, None, d))
        slots, kv_heads = k_pool.shape[0], k_pool.shape[1]
        _check("v_pool", v_pool, (torch.bfloat16,), tuple(k_pool.shape))
        if not prefill_attention_fits(heads, kv_heads, d):
            raise ValueError(f"prefill attention needs head_dim % 16 == 0 and heads a multiple of KV heads, "
                             f"got {heads} heads, {kv_heads} KV heads, head_dim {d}")  # fmt: skip
        _check("kv_slots", kv_slots, (torch.int64,), (None, None))
        batch = kv_slots.shape[0]
        for name, t in (("q_starts", q_starts), ("new_lens", new_lens), ("prefix_lens", prefix_lens)):
            _check(name, t, (torch.int64,), (batch,))
        out = torch.empty(tokens, heads * d)
        p = self.pointer
        args = (
            p(q), q.stride(0), tokens, heads, kv_heads, d, p(k_pool), p(v_pool), slots, p(kv_slots),
            kv_slots.shape[1], p(q_starts), p(new_lens), p(prefix_lens), batch, d**-0.5, p(out),
        )  # fmt: skip
        if reference:
            self.raise_for("prefill_attention_ref", self.lib.prefill_attention_ref(*args))
        else:
            self.raise_for("prefill_attention", self.lib.prefill_attention(*args, torch.get_num_threads()))
        return out

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RMSNorm of ``x`` (+ ``delta``) over its last dimension, fp32: (normed, the sum normed)."""
        _check("x", x, (torch.float32,), (None,) * x.dim())
        n = x.shape[-1]
        _check("weight", weight, (torch.float32,), (n,))
        out = torch.empty_like(x)
        total, delta_ptr, sum_ptr = self._residual_sum(x, delta)
        rows = x.numel() // n if n else 0
        p = self.pointer
        self.lib.rms_norm(p(x), delta_ptr, sum_ptr, p(weight), rows, n, eps, p(out), torch.get_num_threads())
        return out, total

    def _residual_sum(self, x: torch.Tensor, delta: torch.Tensor | None) -> tuple[torch.Tensor, Any, Any]:
        """A norm's sum x + delta (x itself without delta) and the pointers the C norms take for delta and
        for that sum (NULL, NULL without delta)."""
        if delta is None:
            return x, self.ffi.NULL, self.ffi.NULL
        _check("delta", delta, (torch.float32,), tuple(x.shape))
        total = torch.empty_like(x)
        return total, self.pointer(delta), self.pointer(total)

    def rms_norm_rounded(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None
    ) -> tuple[RoundedRows, torch.Tensor]:
        """``rms_norm``'s, the normed rows rounded for a quantized product (``RoundedRows``; x [rows, n], n a
        multiple of 32): the same rounded values as the product would make of ``rms_norm``'s."""
        _check("x", x, (torch.float32,), (None, None))
        rows, n = x.shape
        _check("weight", weight, (torch.float32,), (n,))
        if n % 32:
            raise ValueError(f"rounded rows need a multiple of 32 columns, got {n}")
        total, delta_ptr, sum_ptr = self._residual_sum(x, delta)
        out, p = RoundedRows.empty(rows, n), self.pointer
        code = self.lib.rms_norm_rounded(p(x), delta_ptr, sum_ptr, p(weight), rows, n, eps, p(out.codes),
                                         p(out.step), p(out.total), p(out.sum), torch.get_num_threads())  # fmt: skip
        self.raise_for("rms_norm_rounded", code)
        return out, total

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate-half RoPE of fp32 heads ``x`` [tokens, heads, d], each token's heads contiguous and
        its rows any number of floats apart (a view into the fused QKV output), by ``cos``/``sin``
        [tokens, d] (``RotaryEmbedding``'s tables: sin's first half negated) → a contiguous [tokens,
        heads, d], bit for bit ``apply_rotary``'s."""
        tokens, heads, d = _check_token_rows("x", x)
        if d % 2:
            raise ValueError(f"x must have an even d, got {d}")
        _check("cos", cos, (torch.float32,), (tokens, d))
        _check("sin", sin, (torch.float32,), (tokens, d))
        out = torch.empty(tokens, heads, d)
        p = self.pointer
        self.lib.rotary(p(x), x.stride(0), tokens, heads, d, p(cos), p(sin), p(out), torch.get_num_threads())
        return out

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """SwiGLU's activation, silu(gate) * up, of fp32 ``gate_up`` [rows, 2 n] (each row's gate, then
        its up) → [rows, n]: the fused decode step's arithmetic, within fp32 rounding of torch's."""
        _check("gate_up", gate_up, (torch.float32,), (None, None))
        rows, n = gate_up.shape[0], gate_up.shape[1] // 2
        if gate_up.shape[1] % 2:
            raise ValueError(f"gate_up must have an even number of columns, got {gate_up.shape[1]}")
        act = torch.empty(rows, n)
        p = self.pointer
        self.lib.silu_mul(p(gate_up), rows, n, p(act), torch.get_num_threads())
        return act

    def silu_and_mul_rounded(self, gate_up: torch.Tensor) -> RoundedRows:
        """``silu_and_mul``'s rows rounded for a quantized product (``RoundedRows``; n a multiple of 32)."""
        _check("gate_up", gate_up, (torch.float32,), (None, None))
        rows, n = gate_up.shape[0], gate_up.shape[1] // 2
        if gate_up.shape[1] != 2 * n or n % 32:
            raise ValueError(f"gate_up must have 2 x (a multiple of 32) columns, got {gate_up.shape[1]}")
        out, p = RoundedRows.empty(rows, n), self.pointer
        code = self.lib.silu_mul_rounded(p(gate_up), rows, n, p(out.codes), p(out.step), p(out.total),
                                         p(out.sum), torch.get_num_threads())  # fmt: skip
        self.raise_for("silu_mul_rounded", code)
        return out

    def argmax(self, x: torch.Tensor, reference: bool = False) -> torch.Tensor:
        """Each row's index of its largest value in fp32 ``x`` [rows, n], the first of equal ones, or of its
        first NaN: ``x.max(dim=-1).indices``, the greedy sampler's tokens → [rows] int64."""
        return self._per_row("argmax_rows", x, torch.int64, reference)

    def logsumexp(self, x: torch.Tensor, reference: bool = False) -> torch.Tensor:
        """Each row's log sum_i e^x_i of fp32 ``x`` [rows, n] → [rows] fp32: ``torch.logsumexp(x, -1)``, what a
        token's logit is less its log-probability (NaN for a row with a NaN)."""
        return self._per_row("logsumexp_rows", x, torch.float32, reference)

    def _per_row(self, name: str, x: torch.Tensor, dtype: torch.dtype, reference: bool) -> torch.Tensor:
        """One value of ``dtype`` per row of fp32 ``x`` [rows, n] from kernel ``name`` (``logits.c``) or its
        plain reference."""
        _check("x", x, (torch.float32,), (None, None))
        if x.shape[1] < 1:
            raise ValueError("x must have at least one column")
        out = torch.empty(x.shape[0], dtype=dtype)
        args = (self.pointer(x), x.shape[0], x.shape[1], self.pointer(out))
        if reference:
            self.raise_for(f"{name}_ref", getattr(self.lib, f"{name}_ref")(*args))
        else:
            self.raise_for(name, getattr(self.lib, name)(*args, torch.get_num_threads()))
        return out

    def fused_decoder(self, layers: list[LayerWeights]) -> FusedDecoder:
        return FusedDecoder(self, layers)


def paged_attention_fits(heads: int, kv_heads: int, d: int) -> bool:
    """What paged_attention.c takes: head_dim a multiple of 16, 1-16 query heads per KV head."""
    return d % 16 == 0 and kv_heads >= 1 and heads % kv_heads == 0 and heads // kv_heads <= 16


def prefill_attention_fits(heads: int, kv_heads: int, d: int) -> bool:
    """What prefill_attention.c takes: head_dim a multiple of 16, whole groups of query heads per KV head."""
    return d % 16 == 0 and d > 0 and kv_heads >= 1 and heads % kv_heads == 0


def _check_heads(heads: int, kv_heads: int, d: int) -> None:
    if not paged_attention_fits(heads, kv_heads, d):
        raise ValueError(f"paged attention needs head_dim % 16 == 0 and 1-16 query heads per KV head, "
                         f"got {heads} heads, {kv_heads} KV heads, head_dim {d}")  # fmt: skip


class FusedDecoder:
    """Decode steps through a stack of ``LayerWeights``, one C call a step. Its scratch buffers and
    step struct are kept between steps (the buffers grown for a larger batch)."""

    def __init__(self, kernels: CpuKernels, layers: list[LayerWeights]) -> None:
        if not layers:
            raise ValueError("a fused decoder needs at least one layer")
        first = layers[0]
        self._shape = (first.hidden, first.heads, first.kv_heads, first.head_dim, first.intermediate)
        hidden, heads, kv_heads, head_dim, intermediate = self._shape
        _check_heads(heads, kv_heads, head_dim)
        self._kernels, self._keep = kernels, layers  # the structs point into the layers' tensors
        self._layers = kernels.ffi.new("Layer[]", len(layers))
        p = kernels.pointer
        for i, w in enumerate(layers):
            if (w.hidden, w.heads, w.kv_heads, w.head_dim, w.intermediate) != self._shape:
                raise ValueError(f"layer {i} has shapes unlike layer 0's {self._shape}")
            _check(f"layer {i} input_norm", w.input_norm, (torch.float32,), (hidden,))
            _check(f"layer {i} post_norm", w.post_norm, (torch.float32,), (hidden,))
            q_width, qkv_rows = heads * head_dim, (heads + 2 * kv_heads) * head_dim
            shapes = {
                "qkv": (qkv_rows, hidden), "o": (hidden, q_width), "gate_up": (2 * intermediate, hidden),
                "down": (hidden, intermediate),
            }  # fmt: skip
            for name, (n, k) in shapes.items():
                _check_projection(f"layer {i} {name}", getattr(w, name), n, k)
            c = self._layers[i]
            if w.qkv_bias is not None:
                c.qkv_bias = p(_check(f"layer {i} qkv_bias", w.qkv_bias, (torch.float32,), (qkv_rows,)))
            if (w.q_norm is None) != (w.k_norm is None):
                raise ValueError(f"layer {i} needs both q_norm and k_norm, or neither")
            if w.q_norm is not None and w.k_norm is not None:
                c.q_norm = p(_check(f"layer {i} q_norm", w.q_norm, (torch.float32,), (head_dim,)))
                c.k_norm = p(_check(f"layer {i} k_norm", w.k_norm, (torch.float32,), (head_dim,)))
            c.layer, c.hidden, c.heads, c.kv_heads, c.head_dim, c.intermediate = i, *self._shape
            c.eps, c.input_norm, c.post_norm = w.eps, p(w.input_norm), p(w.post_norm)
            for name in shapes:
                kernels.set_projection(getattr(c, name), getattr(w, name))  # getattr(c, ...): a view into the struct
        self._scratch = torch.empty(0)
        self._buffer = torch.empty(0)
        self._step = kernels.ffi.new("Step *")  # refilled every step

    def run(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        out_slots: torch.Tensor,
        kv_slots: torch.Tensor,
        kv_lens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: the embedded tokens [batch, hidden] fp32, one per request; ``cos``/``sin``: their
        RoPE rows; the pools: all layers' [layers, slots, kv_heads, head_dim] fp32 or bf16 (the new K/V
        are stored); ``kv_slots``/``kv_lens`` as for ``paged_decode_attention``. Returns (last layer's
        MLP output, the residual stream before it)."""
        hidden, _, kv_heads, head_dim, _ = self._shape
        _check("x", x, (torch.float32,), (None, hidden))
        batch = x.shape[0]
        _check("cos", cos, (torch.float32,), (batch, head_dim))
        _check("sin", sin, (torch.float32,), (batch, head_dim))
        _check("k_pool", k_pool, (torch.float32, torch.bfloat16), (None, None, kv_heads, head_dim))
        if k_pool.shape[0] < len(self._keep):
            raise ValueError(f"k_pool has {k_pool.shape[0]} layers, the decoder {len(self._keep)}")
        _check("v_pool", v_pool, (k_pool.dtype,), tuple(k_pool.shape))
        _check("out_slots", out_slots, (torch.int64,), (batch,))
        _check("kv_slots", kv_slots, (torch.int64,), (batch, None))
        _check("kv_lens", kv_lens, (torch.int64,), (batch,))
        kernels, p = self._kernels, self._kernels.pointer
        scratch = int(kernels.lib.decode_layer_scratch(batch, *self._shape))
        if self._scratch.numel() < scratch:
            self._scratch = torch.empty(scratch)
        if self._buffer.numel() < batch * hidden:
            self._buffer = torch.empty(batch * hidden)
        residual, out = torch.empty_like(x), torch.empty_like(x)
        step = self._step
        step.batch, step.k_pool, step.v_pool = batch, p(k_pool), p(v_pool)
        step.kv_bf16 = int(k_pool.dtype == torch.bfloat16)
        step.pool_slots, step.pool_layer_stride = k_pool.shape[1], k_pool[0].numel()
        step.out_slots, step.kv_slots, step.kv_lens = p(out_slots), p(kv_slots), p(kv_lens)
        step.kv_stride = kv_slots.shape[1]
        step.cos, step.sin, step.scratch, step.threads = p(cos), p(sin), p(self._scratch), torch.get_num_threads()
        count = len(self._keep)
        failed = kernels.lib.decode_layers(self._layers, count, step, p(x), p(residual), p(out), p(self._buffer))
        kernels.raise_for(f"decode_layers {self._shape}", failed)
        return out, residual


def attention_products(kernels: CpuKernels | None) -> dict[str, str]:
    """The products of decode and of prefill attention over a bf16 KV pool with ``kernels`` on this host, in
    words (the start-up log, the test suite's header, the benchmarks' headers)."""
    if kernels is None:
        return {"decode": "fp32 (torch's SDPA over a gathered copy)", "prefill": "fp32 (torch's SDPA)"}
    decode = "bf16 on AVX-512 BF16" if kernels.decode_attention_bf16 else "fp32"
    if not kernels.runs_prefill_attention:
        prefill = "fp32 (torch's SDPA)"
    elif kernels.variant.name in ("avx2", "avxvnni"):
        prefill = "fp32 fmas on the bf16 values (minisgl C kernels)"
    else:
        tiles = " (AMX-BF16 tiles where head_dim is a multiple of 32)" if kernels.variant.name == "amx" else ""
        prefill = f"bf16 on AVX-512 BF16{tiles} (minisgl C kernels)"
    return {"decode": f"{decode} (minisgl C kernels)", "prefill": prefill}


def cpu_paths(kernels: CpuKernels | None) -> dict[str, str]:
    """Which code runs the quantized products with ``kernels`` on this host, in words (the start-up
    log, the test suite's header): the C kernels at every row count, or torch's kernels for few rows
    and, for many, the weight expanded to bf16 and oneDNN's bf16 GEMM with the instructions it can use
    (it asks the kernel for AMX tiles itself, ``arch_prctl(ARCH_REQ_XCOMP_PERM)``)."""
    if kernels is not None and kernels.bf16_prefill:
        return {
            "decode rows": "minisgl C kernels (AVX-512 VNNI; from 9 rows, AMX-INT8 sums)",
            "prefill rows": "minisgl C kernels (bf16 on AMX-BF16)",
        }
    if kernels is not None:
        return {"every row count": f"minisgl C kernels ({kernels.variant.description})"}
    if torch.cpu._is_amx_tile_supported():
        gemm = "AMX-BF16"
    elif torch.cpu._is_avx512_bf16_supported():
        gemm = "AVX-512 BF16"
    else:
        gemm = torch.backends.cpu.get_cpu_capability()
    return {"few rows": "torch's int4/int8 kernels", "many rows": f"bf16 expansion + oneDNN bf16 GEMM ({gemm})"}
