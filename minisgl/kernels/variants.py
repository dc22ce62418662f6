"""The builds of the C kernels and which this CPU can run: torch-free, so that a flag or a config
is checked (``KERNEL_CHOICES``) without loading the kernels or torch (the server's front end)."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Variant:
    """One build of the kernels: the compiler flags that select its SIMD bodies (``cpu/simd.h``) and
    the ``/proc/cpuinfo`` flags a CPU needs to run it."""

    name: str  # what ``kernels_variant()`` in the library returns, and ``kernels="c:<name>"``
    description: str
    compile_flags: tuple[str, ...]
    cpu_needs: frozenset[str]


_AVX2 = ("-mavx2", "-mfma", "-mf16c")
_AVX512 = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", *_AVX2)
_AVX512_NEEDS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx2", "fma", "f16c"})
VARIANTS = (  # best first
    Variant(
        "amx", "AVX-512 VNNI + AMX",
        (*_AVX512, "-mavx512bf16", "-mavx512vbmi", "-mamx-tile", "-mamx-bf16", "-mamx-int8"),
        _AVX512_NEEDS | {"avx512_bf16", "avx512vbmi", "amx_tile", "amx_bf16", "amx_int8"},
    ),
    Variant("avx512", "AVX-512 VNNI", _AVX512, _AVX512_NEEDS),
    Variant("avxvnni", "AVX2 + AVX-VNNI", (*_AVX2, "-mavxvnni"), frozenset({"avx_vnni", "avx2", "fma", "f16c"})),
    Variant("avx2", "AVX2 + FMA", _AVX2, frozenset({"avx2", "fma", "f16c"})),
)  # fmt: skip
KERNEL_CHOICES = ("auto", "c", "torch", *(f"c:{v.name}" for v in VARIANTS))


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags as Linux lists them: the ``flags`` line of ``cpuinfo``, the text of
    /proc/cpuinfo, read when not given (empty off x86-64 or without that file: no variant is then chosen)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        if platform.machine() != "x86_64" or not path.is_file():
            return frozenset()
        cpuinfo = path.read_text()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def host_variants(flags: frozenset[str]) -> list[Variant]:
    """The variants a CPU with ``flags`` can run, best first."""
    return [v for v in VARIANTS if v.cpu_needs <= flags]


def variants_for(choice: str, flags: frozenset[str]) -> list[Variant]:
    """The variants that kernel ``choice`` takes on a CPU with ``flags``, to be tried best first: none
    for ``torch``, or for ``c:<variant>`` where the CPU cannot run that one."""
    check_kernel_choice(choice)
    if choice == "torch":
        return []
    runnable = host_variants(flags)
    if choice.startswith("c:"):
        return [v for v in runnable if v.name == choice.removeprefix("c:")]
    return runnable


def check_kernel_choice(choice: str) -> None:
    """``EngineConfig.kernels``: auto (the C kernels where they build, else torch's), c (the C
    kernels or an error), torch, or c:<variant> (that build, for benchmarks and tests)."""
    if choice not in KERNEL_CHOICES:
        raise ValueError(f"kernels must be one of {', '.join(KERNEL_CHOICES)}; got {choice!r}")
