"""The process's memory on a CPU: freed memory kept for the next pass, and huge pages under the weights.

Every pass allocates its temporaries anew (activations, a band of the MLP, logits: megabytes each, at
1-8B tens of megabytes). glibc's malloc hands an allocation past its mmap threshold (128 KiB, rising
to 32 MiB as it sees such frees) to the kernel on ``free`` and maps fresh pages for the next one, and
trims the heap's top as it shrinks. Each fresh page faults on first write: a 2,000-token prefill took
tens to hundreds of thousands of page faults, each pass again (``docs/benchmarks/session19-amd/heap.md``).
Kept in the heap instead, the same memory serves every pass; the resident memory stays at the most
one pass needs, as a caching allocator's does.

A decode step streams every quantized weight once, and a weight on 4 KiB pages streams slower than on
Linux's 2 MiB transparent huge pages (one TLB entry covers 512 of the small ones): ``huge_page_buffer``
is memory that takes those on first write where the system gives them on request
(``/sys/kernel/mm/transparent_hugepage/enabled``: ``madvise``, a common default, or ``always``). Only
whole, aligned 2 MiB ranges of a mapping get one, so every quantized weight the C kernels run lies in a
``HugePageArena``, one after another in the order they are built (in its room where the loader builds them
there, else copied in): a small model's weights, each under 2 MiB, would get none on their own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import math
import mmap
import sys
from functools import cache

import torch

logger = logging.getLogger(__name__)

# glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_NEVER_TRIM = 2**31 - 1  # mallopt takes an int
_HUGE_PAGE = 2 << 20  # x86-64's transparent huge page


@cache
def _libc() -> ctypes.CDLL | None:
    """The C library, where it is glibc on Linux (None elsewhere: nothing here changes anything)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    needed = ("mallopt", "malloc_trim", "madvise", "gnu_get_libc_version")
    return libc if all(hasattr(libc, name) for name in needed) else None


def retain_freed_memory() -> bool:
    """From now on malloc serves every size from its heap and never returns freed memory to the
    kernel; what the heap holds now (a model load's temporaries) is returned first. False off Linux or
    where the C library is not glibc (nothing changes)."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    applied = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM) == 1
    logger.debug("malloc keeps freed memory: %s", applied)
    return applied


def huge_page_buffer(nbytes: int) -> torch.Tensor:
    """``nbytes`` of CPU memory (uint8), not yet written, starting on a 2 MiB boundary and advised
    ``MADV_HUGEPAGE``: its first writes take huge pages for each whole 2 MiB of it where the system
    gives them (off Linux, or without glibc, plain memory). Its tail past the last whole huge page
    is not advised, so that the buffer never holds memory past its end."""
    raw = torch.empty(nbytes + _HUGE_PAGE, dtype=torch.uint8)
    start = -raw.data_ptr() % _HUGE_PAGE
    buffer = raw[start : start + nbytes]
    libc = _libc()
    advised = nbytes // _HUGE_PAGE * _HUGE_PAGE
    if libc is not None and advised and hasattr(mmap, "MADV_HUGEPAGE"):
        libc.madvise(ctypes.c_void_p(buffer.data_ptr()), ctypes.c_size_t(advised), mmap.MADV_HUGEPAGE)
    return buffer


class HugePageArena:
    """CPU tensors placed one after another in ``huge_page_buffer`` chunks, so that many small ones
    share huge pages. A tensor larger than half a chunk gets a buffer of its own. What a chunk leaves
    unused is never written, and so never resident, but for the rest of its last huge page."""

    _ALIGN = 64  # each tensor starts on a cache line

    def __init__(self, chunk_bytes: int = 256 << 20) -> None:
        self.chunk_bytes = chunk_bytes
        self._chunk: torch.Tensor | None = None
        self._used = 0
        self._spans: list[tuple[int, int]] = []  # the addresses of every buffer taken: what ``holds``

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Room for a contiguous tensor of ``shape`` and ``dtype`` in the arena, not yet written: a
        weight built here takes its memory once, where a copy would write it twice."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > self.chunk_bytes // 2:
            room = self._take(nbytes)
        else:
            if self._chunk is None or self._used + nbytes > self.chunk_bytes:
                self._chunk, self._used = self._take(self.chunk_bytes), 0
            room = self._chunk[self._used : self._used + nbytes]
            self._used += -(-nbytes // self._ALIGN) * self._ALIGN
        return room.view(dtype).view(shape)

    def place(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (a CPU tensor) in the arena: itself where it lies there already (built in ``empty``'s
        room), else a contiguous copy with its shape and dtype."""
        if t.device.type != "cpu":
            raise ValueError(f"a huge-page arena holds CPU tensors, not {t.device} ones")
        if self.holds(t):
            return t
        return self.empty(tuple(t.shape), t.dtype).copy_(t)

    def holds(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is contiguous and lies in the arena's memory."""
        start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
        return t.is_contiguous() and any(low <= start and end <= high for low, high in self._spans)

    def _take(self, nbytes: int) -> torch.Tensor:
        buffer = huge_page_buffer(nbytes)
        self._spans.append((buffer.data_ptr(), buffer.data_ptr() + nbytes))
        return buffer
