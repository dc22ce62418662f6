"""The process's memory on a CPU: freed memory kept for the next pass, and huge pages under the weights.

Every pass allocates its temporaries anew (activations, a band of the MLP, logits: megabytes each, at
1-8B tens of megabytes). glibc's malloc hands an allocation past its mmap threshold (128 KiB, rising
to 32 MiB as it sees such frees) to the kernel on ``free`` and maps fresh pages for the next one, and
trims the heap's top as it shrinks. Each fresh page faults on first write: a 2,000-token prefill took
tens to hundreds of thousands of page faults, each pass again (``docs/benchmarks/session19-amd/heap.md``).
Kept in the heap instead, the same memory serves every pass; the resident memory stays at the most
one pass needs, as a caching allocator's does.

A decode step streams every quantized weight once, and a weight on 4 KiB pages streams slower than on
Linux's 2 MiB transparent huge pages (one TLB entry covers 512 of the small ones): ``advise_huge_pages``
asks for those where the system gives them on request (``/sys/kernel/mm/transparent_hugepage/enabled``:
``madvise``, a common default, or ``always``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
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


def advise_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """``t``, its pages advised ``MADV_HUGEPAGE``: a CPU tensor just allocated and not yet written, so
    that its first writes take 2 MiB pages where its memory spans whole ones (past the first of a large
    allocation, which malloc's own header has written). Tensors under two huge pages are left alone:
    they could gain little, and each advised range may split the heap's mapping in three (a MoE model
    has thousands of small experts). Advice only: ``t`` is returned as it was. One user's decode with and
    without it, in one process: ``docs/benchmarks/session24-amd/huge_pages.md`` (its script there)."""
    libc = _libc()
    nbytes = t.numel() * t.element_size()
    if libc is None or t.device.type != "cpu" or nbytes < 2 * _HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return t
    start = t.data_ptr() // mmap.PAGESIZE * mmap.PAGESIZE
    end = t.data_ptr() + nbytes
    libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_HUGEPAGE)
    return t
