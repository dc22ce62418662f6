"""The C kernel builds this CPU cannot execute, run on an emulated one: Bochs's CPU (``bochscpu-python``)
modelled as a Sapphire Rapids (AVX-512 F/BW/VL/VNNI/BF16, AVX-VNNI; it reports no AMX),
so that the AVX-512 and AVX-VNNI bodies are checked against their references on every machine, as the
bodies the host runs are.

The library is loaded into this process as usual; only its calls change (``EmulatedLibrary``). Each call
runs on the emulated CPU in 64-bit mode with the process's memory as it is: the emulated pages are this
process's pages (all its readable ones, given to Bochs before the call), so the kernel reads the tensors
in place and its writes land in them. The registers follow the System V calling convention, and the call
ends on a ``hlt`` at its return address. FS holds the TLS of an idle thread of this process, so that the
kernel's malloc takes that thread's arena and never holds a lock Bochs or Python needs. Its system calls
come back here: the memory ones (malloc's mmap, brk, ...) are made for it, ``arch_prctl`` succeeds, starting a
thread is an error, anything else fails with ENOSYS. The builds are compiled without OpenMP, so that each
call runs on one thread and never touches libgomp, whose state the host's threads share. The plain C
references (``*_ref``) run natively, from a build this CPU runs.
"""

from __future__ import annotations

import atexit
import ctypes
import mmap
import os
import re
import shlex
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from functools import cache, partial
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np

from minisgl.kernels.build import SOURCE_DIR, build, c_compiler, cache_dir
from minisgl.kernels.native import CpuKernels, load_variant
from minisgl.kernels.variants import VARIANTS, cpu_flags, host_variants

PAGE = 4096
GIB = 1 << 30
# Bochs's CPU models by their index in bochscpu's list (Bochs's cpudb.h order): the emulated CPU.
SAPPHIRE_RAPIDS = 30
# Guest-physical address of the page tables, below Bochs's 40 address bits and above the memory: each
# GiB region of this process's address space in use takes the next GiB of guest-physical memory.
TABLES_PA = 512 * GIB
TABLE_PAGES = 1024  # the PML4, one PDPT per 512 GiB, one page directory (2 MiB pages) per GiB region
CR0 = 1 << 0 | 1 << 1 | 1 << 4 | 1 << 5 | 1 << 16 | 1 << 31  # PE, MP, ET, NE, WP, PG
CR4 = 1 << 5 | 1 << 9 | 1 << 10 | 1 << 18  # PAE, OSFXSR, OSXMMEXCPT, OSXSAVE
TABLE_ENTRY = 0x7  # present, writable, user
LARGE_PAGE = 0x87  # the same, of 2 MiB (the emulated CPU has no 1 GiB pages)
XCR0_AVX512 = 0xE7  # x87, SSE, AVX, opmask, the upper halves of zmm0-15, zmm16-31
XCR0_AMX = 0x60000  # the tile configuration and data
HLT = b"\xf4"
SYSCALL_ENTRY = 64  # the offset in the code page of the hlt SYSCALL jumps to (LSTAR)
ARCH_PRCTL, ENOSYS = 158, 38
MMAP, MPROTECT, MUNMAP, BRK, MREMAP, MADVISE = 9, 10, 11, 12, 25, 28
MEMORY_CALLS = {MMAP, MPROTECT, MUNMAP, BRK, MREMAP, MADVISE}  # run for the kernel (malloc's)
PROT_READ = 1
READABLE_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) r", re.MULTILINE)
THREAD_CALLS = {56, 435}  # clone, clone3
# /proc/cpuinfo's names for the CPUID bits the kernel builds need: (leaf, subleaf, register, bit).
CPUID_FLAGS = {
    "fma": (1, 0, "ecx", 12), "f16c": (1, 0, "ecx", 29), "avx2": (7, 0, "ebx", 5),
    "avx512f": (7, 0, "ebx", 16), "avx512bw": (7, 0, "ebx", 30), "avx512vl": (7, 0, "ebx", 31),
    "avx512vbmi": (7, 0, "ecx", 1), "avx512_vnni": (7, 0, "ecx", 11), "amx_bf16": (7, 0, "edx", 22),
    "amx_tile": (7, 0, "edx", 24), "amx_int8": (7, 0, "edx", 25), "avx_vnni": (7, 1, "eax", 4),
    "avx512_bf16": (7, 1, "eax", 5),
}  # fmt: skip
# mov eax, leaf; mov ecx, subleaf; cpuid; then the register asked for into rax; ret.
CPUID_MOVES = {"eax": b"", "ebx": b"\x48\x89\xd8", "ecx": b"\x48\x89\xc8", "edx": b"\x48\x89\xd0"}


class Unavailable(Exception):
    """The emulator cannot run here (``bochscpu-python`` missing, or no compiler for its glibc shim)."""


def _import_bochscpu() -> Any:
    """``bochscpu``, imported. Its wheel (labelled manylinux_2_28) calls two glibc 2.38 symbols
    (``__isoc23_strtoull``, ``__isoc23_sscanf``); on an older glibc they are defined first, from a
    shim compiled here and loaded for every later library to resolve against."""
    try:
        import bochscpu
    except ModuleNotFoundError as e:
        raise Unavailable("bochscpu-python is not installed") from e
    except ImportError as e:
        if "__isoc23_" not in str(e):
            raise
        ctypes.CDLL(str(_glibc_shim()), mode=ctypes.RTLD_GLOBAL)
        import bochscpu
    import bochscpu.cpu
    import bochscpu.memory

    return bochscpu


GLIBC_SHIM = r"""
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
unsigned long long __isoc23_strtoull(const char *s, char **end, int base) { return strtoull(s, end, base); }
int __isoc23_sscanf(const char *s, const char *format, ...) {
    va_list args;
    va_start(args, format);
    int n = vsscanf(s, format, args);
    va_end(args);
    return n;
}
"""


def _glibc_shim() -> Path:
    """The shim's library, compiled once into the kernels' cache."""
    compiler = c_compiler()
    if compiler is None:
        raise Unavailable("no C compiler for bochscpu's glibc shim")
    shim = cache_dir() / "bochscpu-glibc-shim.so"
    if not shim.is_file():
        shim.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=shim.parent) as folder:
            (Path(folder) / "shim.c").write_text(GLIBC_SHIM)
            command = [compiler, "-shared", "-fPIC", "-O2", "-o", f"{folder}/shim.so", f"{folder}/shim.c"]
            subprocess.run(command, check=True, capture_output=True)
            os.replace(f"{folder}/shim.so", shim)  # whole, for a process that looks meanwhile
    return shim


def _address(buffer: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


class EmulatedCpu:
    """One emulated CPU that runs functions of this process (``call``) until ``close``."""

    def __init__(self, model: int = SAPPHIRE_RAPIDS) -> None:
        self._bochscpu = _import_bochscpu()
        self._set_model(model)
        self._session = self._bochscpu.Session()
        self._session.missing_page_handler = self._outside_the_process
        self._hook = self._bochscpu.Hook()
        self._hook.hlt = self._stop
        self._hook.exception = self._stop_on_exception
        self._fault = ""
        self._tables = mmap.mmap(-1, TABLE_PAGES * PAGE)
        self._entries = np.frombuffer(self._tables, dtype=np.uint64)
        for page in range(TABLE_PAGES):
            self._bochscpu.memory.page_insert(TABLES_PA + page * PAGE, _address(self._tables) + page * PAGE)
        # GiB region of this process -> its GiB of guest-physical memory, and which of its pages Bochs has
        self._slots: dict[int, tuple[int, np.ndarray]] = {}
        self._pdpts: dict[int, int] = {}  # PML4 index -> its PDPT's page in the tables
        self._mapped: set[tuple[str, str]] = set()  # the mappings of this process whose pages Bochs has
        self._stack = mmap.mmap(-1, 8 << 20)
        self._code = mmap.mmap(-1, PAGE)  # the return address's hlt, and the one SYSCALL jumps to
        self._code[: len(HLT)] = HLT
        self._code[SYSCALL_ENTRY : SYSCALL_ENTRY + len(HLT)] = HLT
        self._stray = mmap.mmap(-1, PAGE)  # what a page outside the process reads as, until the call stops
        self._cpuid_pages: list[mmap.mmap] = []
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        self._thread_pointer = _idle_thread_pointer(self._libc)
        self._xcr0 = XCR0_AVX512
        self.flags = frozenset(name for name, where in CPUID_FLAGS.items() if self._cpuid(*where))
        if "amx_tile" in self.flags:
            self._xcr0 |= XCR0_AMX
        atexit.register(self.close)  # bochscpu's objects left to the interpreter's exit crash it

    def _set_model(self, model: int) -> None:
        """Bochs reads ``cpu.model`` when a CPU is created; bochscpu's Python API does not set it."""
        library = ctypes.CDLL(self._bochscpu._bochscpu.__file__)
        get = library.sim_get_param_enum
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
        set_value = library._ZN14bx_param_num_c3setEl  # bx_param_num_c::set(Bit64s)
        set_value.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        set_value(get(b"cpu.model"), model)

    def close(self) -> None:
        self._hook = None
        self._session = None

    def _stop(self, session: Any, cpu: int) -> None:
        session.stop()

    def _stop_on_exception(self, session: Any, cpu: int, vector: int, code: int) -> None:
        self._fault = self._fault or f"the emulated CPU raised exception {vector} (code {code}) at {session.cpu.rip:#x}"
        session.stop()

    def _outside_the_process(self, physical: int) -> None:
        """Bochs asks for a page the process had no mapping for when the call began."""
        self._fault = self._fault or f"the kernel touched guest-physical {physical:#x}, outside the process's memory"
        self._bochscpu.memory.page_insert(physical & ~(PAGE - 1), _address(self._stray))
        self._session.stop()

    def _map_region(self, region: int) -> tuple[int, np.ndarray]:
        """Virtual GiB ``region`` of this process mapped to a GiB of guest-physical memory of its own,
        in 2 MiB pages: its guest-physical address, and which of its pages Bochs has."""
        if region not in self._slots:
            slot = len(self._slots)
            directory = 1 + 256 + slot  # the PML4, the PDPTs' pages, then one page directory per region
            if directory >= TABLE_PAGES:
                raise MemoryError("the emulated CPU's page tables are full")
            self._slots[region] = (slot * GIB, np.zeros(GIB // PAGE, dtype=bool))
            top, middle = divmod(region, 512)
            if top not in self._pdpts:
                self._pdpts[top] = 1 + len(self._pdpts)
                self._entries[top] = (TABLES_PA + self._pdpts[top] * PAGE) | TABLE_ENTRY
            self._entries[self._pdpts[top] * 512 + middle] = (TABLES_PA + directory * PAGE) | TABLE_ENTRY
            pages = np.arange(512, dtype=np.uint64) * np.uint64(2 << 20) + np.uint64(slot * GIB)
            self._entries[directory * 512 : (directory + 1) * 512] = pages | np.uint64(LARGE_PAGE)
        return self._slots[region]

    def _map_process(self) -> None:
        """Every readable page of this process given to Bochs, before the call: a page Bochs asks for
        during it is answered by Python, which may take malloc's lock while the kernel holds it."""
        with open("/proc/self/maps") as maps:
            spans = READABLE_MAPPING.findall(maps.read())
        for span in spans:
            if span not in self._mapped:  # new or changed since the last call
                self._mapped.add(span)
                self._give_pages(int(span[0], 16), int(span[1], 16))

    def _give_pages(self, low: int, high: int) -> None:
        """The pages of this process's [low, high) that Bochs does not have yet, given to it."""
        insert = self._bochscpu.memory.page_insert
        for region in range(low // GIB, (high - 1) // GIB + 1):
            base, given = self._map_region(region)
            first, last = max(low, region * GIB) % GIB // PAGE, (min(high, (region + 1) * GIB) - 1) % GIB // PAGE + 1
            for page in (first + np.flatnonzero(~given[first:last])).tolist():
                insert(base + page * PAGE, region * GIB + page * PAGE)
            given[first:last] = True

    def _cpuid(self, leaf: int, subleaf: int, register: str, bit: int) -> bool:
        code = bytes([0xB8, leaf, 0, 0, 0, 0xB9, subleaf, 0, 0, 0, 0x0F, 0xA2]) + CPUID_MOVES[register] + b"\xc3"
        page = mmap.mmap(-1, PAGE)  # a page of its own: Bochs caches decoded code by its page
        page[: len(code)] = code
        self._cpuid_pages.append(page)
        return bool(self.call(_address(page)) >> bit & 1)

    def call(self, function: int, integers: Sequence[int] = (), floats: Sequence[int] = ()) -> int:
        """Runs the function at ``function`` with these integer (and pointer) arguments and these float
        arguments (their bits), as the System V ABI passes them; returns rax. ``RuntimeError`` for a
        CPU exception (an instruction the emulated CPU lacks) or a page outside the process."""
        self._map_process()
        state = self._bochscpu.State()
        self._bochscpu.cpu.set_long_mode(state)
        state.cr0, state.cr3, state.cr4, state.xcr0 = CR0, TABLES_PA, CR4, self._xcr0
        state.cs, state.ss, state.ds, state.es, state.gs, state.fs = self._segments()
        state.mxcsr, state.fpcw = 0x1F80, 0x37F
        state.lstar = _address(self._code) + SYSCALL_ENTRY
        in_registers, on_stack = integers[:6], integers[6:]
        stack = _address(self._stack)
        top = (stack + len(self._stack) - PAGE) & ~15
        sp = top - 8 * (len(on_stack) + len(on_stack) % 2) - 8  # rsp + 8 aligned to 16 at the call
        struct.pack_into(f"<{1 + len(on_stack)}Q", self._stack, sp - stack, _address(self._code),
                         *(v & (1 << 64) - 1 for v in on_stack))  # fmt: skip
        for register, value in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9"), in_registers):
            setattr(state, register, value & (1 << 64) - 1)
        vectors = state.zmm
        for i, bits in enumerate(floats):
            lanes = list(vectors[i].q)
            lanes[0] = bits
            vectors[i].q = lanes
        state.zmm = vectors
        state.rsp, state.rip, state.rflags = sp, function, 0x2
        self._fault = ""
        while True:
            self._session.cpu.state = state
            self._session.run([self._hook])
            if self._fault:
                raise RuntimeError(self._fault)
            state = self._session.cpu.state
            if state.rip == _address(self._code) + len(HLT):  # returned
                return state.rax
            state.rax = self._system_call(state) & (1 << 64) - 1  # SYSCALL: rcx the return address, r11 the flags
            state.rip, state.rflags = state.rcx, state.r11

    def _system_call(self, state: Any) -> int:
        """What the kernel's SYSCALL gets: the memory calls made for it (malloc's), success for
        arch_prctl (the emulated CPU's tiles need no permission), ENOSYS for anything else."""
        number = state.rax
        if number == ARCH_PRCTL:
            return 0
        if number in THREAD_CALLS:
            raise RuntimeError("the kernel started a thread: the emulated builds are compiled without OpenMP")
        if number not in MEMORY_CALLS:
            return -ENOSYS
        args = (state.rdi, state.rsi, state.rdx, state.r10, state.r8, state.r9)
        result = self._libc.syscall(ctypes.c_long(number), *(ctypes.c_ulong(a) for a in args))
        if result == -1:
            return -ctypes.get_errno()
        readable = args[2] & PROT_READ
        if number == MMAP and readable:
            self._give_pages(result, result + args[1])
        elif number == MPROTECT and readable:
            self._give_pages(args[0], args[0] + args[1])
        elif number == MREMAP:
            self._give_pages(result, result + args[2])
        elif number == BRK:
            self._map_process()
        return result

    def _segments(self) -> tuple[Any, ...]:
        """CS (64-bit code), SS, DS, ES and GS (flat data), FS (flat, based at the idle thread's TLS)."""
        code = self._bochscpu.cpu.SegmentFlags()
        code.A = code.R = code.E = code.S = code.P = code.L = True
        segments = []
        flat_data = 0xC093  # present, writable, 4 KiB granularity
        for selector, attributes, base in [
            (0x08, int(code), 0),
            *[(0x10, flat_data, 0)] * 4,
            (0, flat_data, self._thread_pointer),
        ]:
            segment = self._bochscpu.Segment()
            segment.base, segment.limit, segment.selector, segment.present = base, 0xFFFFFFFF, selector, True
            segment.attr = attributes
            segments.append(segment)
        return tuple(segments)


def _idle_thread_pointer(libc: ctypes.CDLL) -> int:
    """The thread pointer (FS's base) of a thread started here that waits forever, having called
    malloc once: code run with its TLS allocates from that thread's malloc arena, so a kernel holding
    that arena's lock never blocks Bochs or Python, which allocate from this thread's."""
    ready, pointer = threading.Event(), []

    def idle() -> None:
        libc.free(libc.malloc(64))
        pointer.append(libc.pthread_self())
        ready.set()
        threading.Event().wait()

    libc.pthread_self.restype = ctypes.c_void_p
    libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    threading.Thread(target=idle, name="emulated-cpu-tls", daemon=True).start()
    ready.wait()
    return pointer[0]


class EmulatedLibrary:
    """A cffi library whose functions run on ``cpu``: what ``CpuKernels`` calls instead of the library."""

    def __init__(self, library: Any, ffi: Any, cpu: EmulatedCpu, references: Any) -> None:
        """``references``: a build this CPU runs, whose plain C references (``*_ref``, the same source
        whatever the build's flags) are called instead of emulating this one's, tens of times slower."""
        self._library, self._ffi, self._cpu, self._references = library, ffi, cpu, references
        self._functions: dict[str, Callable[..., Any]] = {}

    def __dir__(self) -> list[str]:
        return dir(self._library)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._library, name)
        if isinstance(value, int):  # an enum constant
            return value
        if name.endswith("_ref"):
            return getattr(self._references, name)
        if name not in self._functions:
            self._functions[name] = self._emulated(name, value)
        return self._functions[name]

    def _emulated(self, name: str, function: Any) -> Callable[..., Any]:
        ffi, cpu = self._ffi, self._cpu
        signature = ffi.typeof(function)
        if signature.result.cname in ("float", "double"):
            raise TypeError(f"{name} returns a {signature.result.cname}, which call() does not read back (xmm0)")
        address = int(ffi.cast("uintptr_t", ffi.addressof(self._library, name)))

        def call(*args: Any) -> Any:
            integers, floats = [], []
            for kind, value in zip(signature.args, args, strict=True):
                if kind.kind == "pointer":
                    integers.append(int(ffi.cast("uintptr_t", value)))
                elif kind.cname == "float":
                    floats.append(struct.unpack("<I", struct.pack("<f", value))[0])
                elif kind.cname == "double":
                    floats.append(struct.unpack("<Q", struct.pack("<d", value))[0])
                else:
                    integers.append(int(value))
            rax = cpu.call(address, integers, floats)
            result = signature.result
            if result.kind == "void":
                return None
            if result.kind == "pointer":
                return ffi.cast(result, rax)
            bits = 8 * ffi.sizeof(result)
            rax &= (1 << bits) - 1
            signed = int(ffi.cast(result, -1)) < 0
            return rax - (1 << bits) if signed and rax >> (bits - 1) else rax

        return call


@cache
def emulated_cpu() -> EmulatedCpu:
    """The process's one emulated CPU (Bochs has one CPU per process); ``Unavailable`` where it cannot run."""
    return EmulatedCpu()


@cache
def emulated_kernels(name: str) -> CpuKernels:
    """The ``name`` build's library, compiled without OpenMP, with its calls run on the emulated CPU.
    ``Unavailable`` where the emulator cannot run or its CPU lacks instructions the build needs."""
    variant = next(v for v in VARIANTS if v.name == name)
    runnable = host_variants(cpu_flags())
    if not runnable:
        raise Unavailable("this CPU runs none of the builds, whose references the emulated ones are checked against")
    cpu = emulated_cpu()
    lacking = sorted(variant.cpu_needs - cpu.flags)
    if lacking:
        raise Unavailable(f"the emulated CPU lacks {', '.join(lacking)}, which the {name} build needs")
    with patch.dict(os.environ, {"CC": str(_compiler_without_openmp())}):
        library = build(variant, SOURCE_DIR)
    references = load_variant(runnable[0].name).lib
    return CpuKernels(library, variant, calls=partial(EmulatedLibrary, cpu=cpu, references=references))


def _compiler_without_openmp() -> Path:
    """The C compiler, run without ``-fopenmp``: the emulated CPU runs one thread, and libgomp's state
    is shared with the host's threads, whose teams an emulated call must not touch. Its ``#pragma omp``
    lines are ignored, so each loop runs whole, in order, as on one thread. A path of its own, which
    keys the builds apart from the host's in the cache."""
    compiler = c_compiler()
    if compiler is None:
        raise Unavailable("no C compiler")
    wrapper = cache_dir() / "cc-without-openmp"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    drop = 'for arg do\n  shift\n  [ "$arg" = -fopenmp ] || set -- "$@" "$arg"\ndone\n'
    text = f'#!/bin/sh\n{drop}exec {shlex.quote(compiler)} "$@"\n'
    if not wrapper.is_file() or wrapper.read_text() != text:
        wrapper.write_text(text)
        wrapper.chmod(0o755)
    return wrapper
