"""Background work that yields the CPU: a thread's niceness raised, for the threads whose work nobody
waits for first (a grammar's compile beside the forward passes, the kernels' first build beside the
start-up)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading


def lower_thread_priority(niceness: int) -> None:
    """Add ``niceness`` to the calling thread's: Linux keeps it per thread, and the threads and processes
    the thread starts inherit it. Elsewhere niceness is per process: left alone."""
    if sys.platform == "linux":
        thread = threading.get_native_id()
        with contextlib.suppress(OSError):  # only a preference: a sandbox that forbids it still runs the work
            os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + niceness))
