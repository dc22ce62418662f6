# Time to write 256 MiB into fresh memory: session 24's advice (a buffer advised on its own), a
# minisgl.heap.huge_page_buffer (the arena's chunks), and plain 4 KiB pages; four rounds, all kept.
import ctypes
import mmap
import time

import torch

from minisgl.heap import huge_page_buffer

libc = ctypes.CDLL("libc.so.6")
def anon():
    with open("/proc/self/smaps_rollup") as smaps:
        return int(next(l.split()[1] for l in smaps if "AnonHuge" in l)) // 1024
def head_style(n):
    t = torch.empty(n, dtype=torch.uint8); start = t.data_ptr() // 4096 * 4096
    libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(t.data_ptr() + n - start), mmap.MADV_HUGEPAGE); return t
keep = []
for i in range(4):
    for name, f in (("head", head_style), ("arena", huge_page_buffer), ("plain", lambda n: torch.empty(n, dtype=torch.uint8))):
        a0 = anon(); t = time.perf_counter(); b = f(256 << 20); b.fill_(1); dt = time.perf_counter() - t
        print(f"{name}: {dt*1000:.0f} ms, +{anon()-a0} MiB huge", flush=True); keep.append(b)
