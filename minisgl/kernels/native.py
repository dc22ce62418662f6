"""The engine's C kernels (``cpu/*.c``), built for this machine on first use and called via ctypes.

- ``quant_gemm.c``: int4/int8 weight-only products, fp32 in and out. torch's CPU kernels for them
  take bf16 activations (two casts a product, and 3e-3 relative error against these ~1e-4); at one
  row its int4 product is about as fast as this one, its int8 one 2-3x slower (SmolLM2's LM head:
  2.2 ms against 0.6-1.1 ms, 2-core AVX-512 machine).
- ``dequantize.c``: int4/int8 weights expanded to bf16 a band of rows at a time, for the many-row
  products (prefill), which then run torch's bf16 GEMM.
- ``paged_attention.c``: decode attention read in place from the KV pool, no gathered copy.
- ``rms_norm.c``: RMSNorm (after a residual add) in one call instead of torch's seven ops.
- ``rotary.c``: RoPE, with torch's roundings, for ``decode_layer.c``.
- ``decode_layer.c``: a whole decode step through int4 Llama layers, the kernels above chained in C
  (``FusedDecoder``): at one request the Python between them was a third of the step.

The library is compiled with the system's C compiler (``cc``, or ``$CC``) and ``-march=native``
into the user's cache. Where that fails (no compiler, or a CPU without AVX-512 VNNI, which the
source requires), ``cpu_kernels()`` returns None and the callers keep torch's kernels; the log
says why.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

logger = logging.getLogger("minisgl.kernels")

SOURCE_DIR = Path(__file__).parent / "cpu"
SOURCES = sorted(SOURCE_DIR.glob("*.c"))


def _cache_dir() -> Path:
    root = os.environ.get("MINISGL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "minisgl")
    return Path(root) / "kernels"


def _build() -> Path:
    """The shared library for this host, compiled once per source, compiler and flags."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler (cc, gcc or $CC)")
    flags = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11"]
    texts = [f.read_text() for f in sorted(SOURCE_DIR.glob("*.[ch]"))]  # the header too
    key = hashlib.sha256("\n".join([*texts, compiler, *flags]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"cpu_kernels-{key}.so"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{target.name}-", dir=target.parent)
        os.close(fd)
        try:
            command = [compiler, *flags, "-o", tmp, *map(str, SOURCES)]
            subprocess.run(command, check=True, capture_output=True, text=True)
            os.replace(tmp, target)  # atomic: concurrent first uses each build, one wins
        except subprocess.CalledProcessError as e:
            errors = [line for line in e.stderr.splitlines() if "error" in line]
            raise OSError(f"{compiler} failed: {(errors or [e.stderr.strip()])[0][-500:]}") from e
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return target


Matmul = Callable[[torch.Tensor], torch.Tensor]
_p, _i64, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class _Int4(ctypes.Structure):
    _fields_ = [("codes", _p), ("scale", _p), ("minimum", _p)]


class _Layer(ctypes.Structure):
    _fields_ = [
        *((name, _i64) for name in ("layer", "hidden", "heads", "kv_heads", "head_dim", "intermediate")),
        ("eps", _f32), ("input_norm", _p), ("post_norm", _p),
        *((name, _Int4) for name in ("qkv", "o", "gate_up", "down")),
    ]  # fmt: skip


class _Step(ctypes.Structure):
    _fields_ = [
        ("batch", _i64), ("k_pool", _p), ("v_pool", _p), ("kv_bf16", ctypes.c_int), ("pool_layer_stride", _i64), ("out_slots", _p),
        ("kv_slots", _p), ("kv_lens", _p), ("kv_stride", _i64), ("cos", _p), ("sin", _p), ("scratch", _p),
        ("threads", ctypes.c_int),
    ]  # fmt: skip


Int4Buffers = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # codes, scale, minimum (``int4``'s layout)


@dataclass(frozen=True)
class LayerWeights:
    """One plain Llama decoder layer whose four projections are int4 (``decode_layer.c``)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    input_norm: torch.Tensor  # fp32 [hidden]
    post_norm: torch.Tensor
    qkv: Int4Buffers  # [(heads + 2 kv_heads) * head_dim, hidden]
    o: Int4Buffers
    gate_up: Int4Buffers  # gate rows, then up rows
    down: Int4Buffers


class CpuKernels:
    """The library loaded. ``int4``/``int8`` bind a weight once and return its product with fp32
    rows: a decode step makes ~120 of these calls, so each does little more than the C call
    (ctypes ~2.6 us, the output's allocation ~0.9 us)."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        lib.int4_matmul.argtypes = [p, i64, i64, p, p, p, i64, p, i32]
        lib.int8_matmul.argtypes = [p, i64, i64, p, p, i64, p, i32]
        lib.paged_decode_attention.argtypes = [p, p, p, p, p, p, i32, p, i64, p, i64, i64, i64, i64, ctypes.c_float, p, i32]
        lib.rms_norm.argtypes = [p, p, p, p, i64, i64, ctypes.c_float, p, i32]
        lib.decode_layer_scratch.argtypes = [i64] * 6
        lib.decode_layer_scratch.restype = i64
        lib.decode_layers.argtypes = [p, i64, p, p, p, p, p]
        lib.int4_dequantize_bf16.argtypes = [p, p, p, i64, i64, i64, p, i32]
        lib.int8_dequantize_bf16.argtypes = [p, p, i64, i64, i64, p, i32]
        self._lib = lib

    def int4(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> Matmul:
        """``codes``: [N, K / 2] uint8 in the C layout (``Int4Weight.from_codes``); ``scale``,
        ``minimum``: [N, K / 32] fp16; w = code * scale + minimum. The product takes [rows, K] fp32
        and gives [rows, N] fp32."""
        return _bind(self._lib.int4_matmul, codes.shape[0], codes.shape[1] * 2, (codes, scale, minimum))

    def int8(self, codes: torch.Tensor, scale: torch.Tensor) -> Matmul:
        """``codes``: [N, K] int8; ``scale``: [N] fp32; w = code * scale row by row."""
        return _bind(self._lib.int8_matmul, codes.shape[0], codes.shape[1], (codes, scale))

    def int4_dequantize(
        self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, start: int, out: torch.Tensor
    ) -> None:
        """Rows ``start .. start + len(out)`` of an int4 weight (``int4``'s buffers) into ``out``,
        [rows, K] bf16."""
        _check_band(codes.shape[0], codes.shape[1] * 2, start, out)
        self._lib.int4_dequantize_bf16(
            codes.data_ptr(), scale.data_ptr(), minimum.data_ptr(), codes.shape[1] * 2, start, out.shape[0],
            out.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip

    def int8_dequantize(self, codes: torch.Tensor, scale: torch.Tensor, start: int, out: torch.Tensor) -> None:
        """Rows ``start .. start + len(out)`` of an int8 weight into ``out``, [rows, K] bf16."""
        _check_band(codes.shape[0], codes.shape[1], start, out)
        self._lib.int8_dequantize_bf16(
            codes.data_ptr(), scale.data_ptr(), codes.shape[1], start, out.shape[0], out.data_ptr(), torch.get_num_threads()
        )

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
    ) -> torch.Tensor:
        """``q``: [batch, heads, d] fp32; ``k``, ``v``: [batch, kv_heads, d] fp32, first stored at
        ``out_slots`` of ``k_pool``, ``v_pool`` (one layer's [slots, kv_heads, d], fp32 or bf16,
        written in place); ``kv_slots``: [batch, n] int64, of which row b's first ``kv_lens[b]`` are
        attended → [batch, heads * d]."""
        batch, heads, d = q.shape
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out_slots, kv_slots, kv_lens = out_slots.contiguous(), kv_slots.contiguous(), kv_lens.contiguous()
        if not out_slots.dtype == kv_slots.dtype == kv_lens.dtype == torch.int64:
            raise ValueError("paged_decode_attention takes int64 slots and lengths")
        if not q.dtype == k.dtype == v.dtype == torch.float32:
            raise ValueError(f"paged_decode_attention takes fp32 q, k, v, got {q.dtype}, {k.dtype}, {v.dtype}")
        out = torch.empty(batch, heads * d)
        failed = self._lib.paged_decode_attention(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), out_slots.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(),
            _kv_bf16(k_pool, v_pool), kv_slots.data_ptr(), kv_slots.shape[1], kv_lens.data_ptr(), batch, heads,
            k_pool.shape[1], d, d**-0.5,
            out.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        if failed:
            shape = f"heads {heads}, KV heads {k_pool.shape[1]}, dim {d}"
            raise RuntimeError(f"paged_decode_attention failed ({failed}): {shape}")
        return out

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RMSNorm of ``x`` (+ ``delta``) over its last dimension, fp32: (normed, the sum normed)."""
        x = x.contiguous()
        n, out = x.shape[-1], torch.empty_like(x)
        total = x if delta is None else torch.empty_like(x)
        delta_ptr = None if delta is None else (delta := delta.contiguous()).data_ptr()
        sum_ptr = None if delta is None else total.data_ptr()
        threads = torch.get_num_threads()
        self._lib.rms_norm(
            x.data_ptr(), delta_ptr, sum_ptr, weight.data_ptr(), x.numel() // n, n, eps, out.data_ptr(), threads
        )
        return out, total

    def fused_decoder(self, layers: list[LayerWeights]) -> FusedDecoder:
        return FusedDecoder(self._lib, layers)


def _kv_bf16(k_pool: torch.Tensor, v_pool: torch.Tensor) -> int:
    """The C kernels' pool flag: 1 for bf16, 0 for fp32 (anything else is refused)."""
    if k_pool.dtype != v_pool.dtype or k_pool.dtype not in (torch.float32, torch.bfloat16) or not k_pool.is_contiguous():
        raise ValueError(f"the KV pools must be contiguous fp32 or bf16, got {k_pool.dtype} and {v_pool.dtype}")
    return int(k_pool.dtype == torch.bfloat16)


def _check_band(n: int, k: int, start: int, out: torch.Tensor) -> None:
    if out.dtype != torch.bfloat16 or not out.is_contiguous() or out.dim() != 2 or out.shape[1] != k:
        raise ValueError(f"out must be a contiguous [rows, {k}] bf16 tensor, got {out.dtype} {tuple(out.shape)}")
    if not 0 <= start <= start + out.shape[0] <= n:
        raise ValueError(f"rows {start}..{start + out.shape[0]} outside the weight's {n}")


def _bind(run: Callable[..., object], n: int, k: int, weight: tuple[torch.Tensor, ...]) -> Matmul:
    """x [rows, k] → [rows, n] through ``run(x, rows, k, *weight, n, y, threads)``, the weight's
    pointers taken once (the closure keeps the tensors, so the pointers stay valid)."""
    pointers = tuple(t.data_ptr() for t in weight)

    def matmul(x: torch.Tensor, keep: tuple[torch.Tensor, ...] = weight) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty(x.shape[0], n)
        run(x.data_ptr(), x.shape[0], k, *pointers, n, y.data_ptr(), torch.get_num_threads())
        return y

    return matmul


class FusedDecoder:
    """Decode steps through a stack of ``LayerWeights``, one C call a step."""

    def __init__(self, lib: ctypes.CDLL, layers: list[LayerWeights]) -> None:
        self._lib, self._keep = lib, layers  # the structs point into the layers' tensors
        self._layers = (_Layer * len(layers))()
        for i, w in enumerate(layers):
            int4 = [_Int4(*(t.data_ptr() for t in m)) for m in (w.qkv, w.o, w.gate_up, w.down)]
            self._layers[i] = _Layer(
                i, w.hidden, w.heads, w.kv_heads, w.head_dim, w.intermediate, w.eps,
                w.input_norm.data_ptr(), w.post_norm.data_ptr(), *int4,
            )  # fmt: skip
        first = layers[0]
        self._shape = (first.hidden, first.heads, first.kv_heads, first.head_dim, first.intermediate)

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
        batch = x.shape[0]
        tensors = [t.contiguous() for t in (x, cos, sin, out_slots, kv_slots, kv_lens)]
        x, cos, sin, out_slots, kv_slots, kv_lens = tensors
        scratch = torch.empty(self._lib.decode_layer_scratch(batch, *self._shape))
        residual, out, buffer = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
        step = _Step(
            batch, k_pool.data_ptr(), v_pool.data_ptr(), _kv_bf16(k_pool, v_pool), k_pool[0].numel(), out_slots.data_ptr(), kv_slots.data_ptr(),
            kv_lens.data_ptr(), kv_slots.shape[1], cos.data_ptr(), sin.data_ptr(), scratch.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip
        failed = self._lib.decode_layers(
            self._layers, len(self._keep), ctypes.byref(step), x.data_ptr(), residual.data_ptr(), out.data_ptr(),
            buffer.data_ptr(),
        )  # fmt: skip
        if failed:
            raise RuntimeError(f"decode_layers failed ({failed}): attention refused shapes {self._shape}")
        return out, residual


@cache
def cpu_kernels() -> CpuKernels | None:
    """The kernels built for this host, or None where they cannot be: the reason is logged once."""
    try:
        return CpuKernels(_build())
    except OSError as e:
        logger.warning("C kernels unavailable, torch's kernels run instead: %s", e)
        return None


def cpu_paths() -> dict[str, str]:
    """Which code runs the quantized products on this host, in words (the start-up log, the test
    suite's header): the few-row kernels, and the instructions oneDNN's bf16 GEMM can use for the
    many-row ones (it asks the kernel for AMX tiles itself, ``arch_prctl(ARCH_REQ_XCOMP_PERM)``)."""
    kernels = "minisgl C kernels (AVX-512 VNNI)" if cpu_kernels() is not None else "torch's int4/int8 kernels"
    if torch.cpu._is_amx_tile_supported():
        gemm = "AMX-BF16"
    elif torch.cpu._is_avx512_bf16_supported():
        gemm = "AVX-512 BF16"
    else:
        gemm = torch.backends.cpu.get_cpu_capability()
    return {"few rows": kernels, "many rows": f"bf16 expansion + oneDNN bf16 GEMM ({gemm})"}
