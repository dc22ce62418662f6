# ruff: noqa: I001, PLR0402  (the imports are timed: they come after the thread starts, in this order)
"""Scratch: a scheduler-like process start, with or without the weights' huge pages faulted in on a
thread while torch and the engine import."""
import ctypes, mmap, os, sys, threading, time
T0 = time.perf_counter()
mode = sys.argv[1]
model = os.path.expanduser(sys.argv[2])
HUGE = 2 << 20
region = None
if mode == "prefault":
    size = os.path.getsize(model) + 64 * HUGE
    region = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    libc = ctypes.CDLL(None, use_errno=True)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(region))
    start = -addr % HUGE
    libc.madvise(ctypes.c_void_p(addr + start), ctypes.c_size_t(size // HUGE * HUGE), 14)
    done = {}
    def populate():
        t = time.perf_counter()
        for off in range(0, size // HUGE * HUGE, HUGE):
            ctypes.memset(addr + start + off, 0, 1)
        done["t"] = time.perf_counter() - t
    th = threading.Thread(target=populate); th.start()
from minisgl.scheduler.scheduler import Scheduler
from minisgl.config import EngineConfig
import torch, minisgl.heap as heap
T1 = time.perf_counter()
if region is not None:
    full = torch.frombuffer(region, dtype=torch.uint8)[start:]
    used = [0]
    def carve(nbytes):
        off = used[0]
        used[0] += -(-nbytes // HUGE) * HUGE
        return full[off:off + nbytes]
    heap.huge_page_buffer = carve
s = Scheduler.from_config(EngineConfig(model=model))
T2 = time.perf_counter()
if region is not None:
    th.join()
print(f"{mode}: imports {T1-T0:.2f} s, from_config {T2-T1:.2f} s, total {T2-T0:.2f} s", done if region is not None else "")
