"""The process's C heap on a CPU engine: freed memory kept for the next pass.

Every pass allocates its temporaries anew (activations, a band of the MLP, logits: megabytes each, at
1-8B tens of megabytes). glibc's malloc hands an allocation past its mmap threshold (128 KiB, rising
to 32 MiB as it sees such frees) to the kernel on ``free`` and maps fresh pages for the next one, and
trims the heap's top as it shrinks. Each fresh page faults on first write: a 2,000-token prefill took
tens to hundreds of thousands of page faults, each pass again (``docs/benchmarks/session19-amd/heap.md``).
Kept in the heap instead, the same memory serves every pass; the resident memory stays at the most
one pass needs, as a caching allocator's does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

logger = logging.getLogger("minisgl.engine")

# glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_NEVER_TRIM = 2**31 - 1  # mallopt takes an int


def retain_freed_memory() -> bool:
    """From now on malloc serves every size from its heap and never returns freed memory to the
    kernel; what the heap holds now (a model load's temporaries) is returned first. False off Linux or
    where the C library is not glibc (nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not all(hasattr(libc, name) for name in ("mallopt", "malloc_trim", "gnu_get_libc_version")):
        return False
    libc.malloc_trim(0)
    applied = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM) == 1
    logger.debug("malloc keeps freed memory: %s", applied)
    return applied
