"""What a result was measured on: numbers from a shared or different machine are not comparable."""

from __future__ import annotations

import ctypes
import datetime
import importlib.metadata
import mmap
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            check=False,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def machine_info(threads: int) -> dict[str, Any]:
    import torch

    return {
        "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "threads": threads,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "llama_cpp_python": _version("llama_cpp_python"),
        "git_commit": _git_commit(),
    }


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages; above ~0.5 on a 2-core box the timings are suspect."""
    return [round(x, 2) for x in os.getloadavg()]


def amx_flags() -> str:
    """This CPU's AMX flags (``/proc/cpuinfo``), or ``none``."""
    from minisgl.kernels.variants import cpu_flags

    return " ".join(sorted(f for f in cpu_flags() if f.startswith("amx"))) or "none"


def code_path() -> str:
    """AMX or not, and the build of the C kernels that ``kernels=auto`` takes on this CPU: for a benchmark's
    header."""
    from minisgl.kernels.variants import cpu_flags, variants_for

    builds = variants_for("auto", cpu_flags())
    kernels = f"the {builds[0].name} build ({builds[0].description})" if builds else "none (torch's kernels)"
    return f"AMX: {amx_flags()}; C kernels with kernels=auto: {kernels}"


def first_write_gbps(huge_pages: bool, nbytes: int = 256 << 20) -> float:
    """GB/s of this process's first writes to fresh memory, on huge pages (advised ``MADV_HUGEPAGE``, as a
    model load's weights take theirs: ``minisgl.heap``) or small ones: the kernel's page faults and zeroing,
    and a VM host's backing of the pages, which on a VM can drift by several times between hours and sway a
    start's time."""
    huge = 2 << 20
    region = mmap.mmap(-1, nbytes + huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buffer = (ctypes.c_char * (nbytes + huge)).from_buffer(region)
    start = ctypes.addressof(buffer) + (-ctypes.addressof(buffer) % huge)
    if huge_pages:
        ctypes.CDLL(None).madvise(ctypes.c_void_p(start), ctypes.c_size_t(nbytes), mmap.MADV_HUGEPAGE)
    begin = time.perf_counter()
    ctypes.memset(start, 1, nbytes)
    elapsed = time.perf_counter() - begin
    del buffer
    region.close()
    return round(nbytes / elapsed / 1e9, 2)


def first_writes() -> str:
    """``first_write_gbps`` on huge and on small pages, each in a fresh process (one that wrote and freed
    memory before gets it back at once), for a benchmark's header and footer."""

    def measure(huge_pages: bool) -> str:
        code = f"from benchmarks.machine import first_write_gbps; print(first_write_gbps({huge_pages}))"
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        return subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()

    return f"first writes to fresh memory {measure(True)} GB/s on huge pages, {measure(False)} on small"


def _tree_cpu_seconds(root: int) -> float:
    """CPU time of a live process and all its descendants, reaped ones included (Linux /proc)."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # Fields after the parenthesised name: state ppid ... utime(11) stime(12) cutime(13) cstime(14).
                stats[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # exited while we looked
    tree, frontier = set(), [root]
    while frontier:
        pid = frontier.pop()
        tree.add(pid)
        frontier += [child for child, f in stats.items() if int(f[1]) == pid and child not in tree]
    ticks = sum(int(x) for pid in tree if pid in stats for x in stats[pid][11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_peak_rss(root: int) -> int | None:
    """Bytes: the sum of the peak resident sets (VmHWM) of a live process and its live descendants
    (Linux /proc; None elsewhere). Each peak is its own process's, so the sum bounds the tree's peak."""
    parents: dict[int, int] = {}
    peaks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue  # exited while we looked
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        parents[int(entry.name)] = int(fields.get("PPid", "0").strip() or 0)
        if "VmHWM" in fields:
            peaks[int(entry.name)] = int(fields["VmHWM"].split()[0]) * 1024
    if root not in parents:
        return None
    tree, frontier = set(), [root]
    while frontier:
        pid = frontier.pop()
        tree.add(pid)
        frontier += [child for child, parent in parents.items() if parent == pid and child not in tree]
    return sum(peaks.get(pid, 0) for pid in tree)


class OtherLoad:
    """CPU time that processes outside this run used while it ran: the load average cannot tell a
    benchmark's own threads from a neighbour's, this can (Linux only; None elsewhere). ``server``:
    the pid of a server this run started and is measuring, whose time is the run's own."""

    def __init__(self, server: int | None = None) -> None:
        self.server = server
        self._start = self._sample()

    def _sample(self) -> tuple[float, float] | None:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
            server = _tree_cpu_seconds(self.server) if self.server is not None else 0.0
        except OSError:
            return None
        # user nice system idle iowait irq softirq steal: all but idle and iowait are busy time.
        busy = sum(int(x) for i, x in enumerate(fields[:8]) if i not in (3, 4)) / os.sysconf("SC_CLK_TCK")
        t = os.times()  # children: processes this run started and has already waited for
        return busy, t.user + t.system + t.children_user + t.children_system + server

    def used_s(self) -> float | None:
        """Others' CPU seconds since this was made."""
        end = self._sample()
        if self._start is None or end is None:
            return None
        return max(0.0, (end[0] - self._start[0]) - (end[1] - self._start[1]))

    def core_seconds(self) -> float | None:
        used = self.used_s()
        return None if used is None else round(used, 1)


def wait_for_quiet(longest_s: float = 10.0, window_s: float = 0.25, busy_cores: float = 0.05) -> float:
    """Wait until processes other than this one use under ``busy_cores`` cores over a ``window_s``
    window (``longest_s`` at most), and give the seconds waited. A server that has just finished a
    run may keep its threads spinning for a second or so (vLLM's worker does): without this wait,
    that time falls on whatever runs next. Returns at once where /proc/stat cannot be read."""
    start = time.perf_counter()
    while time.perf_counter() - start < longest_s:
        load = OtherLoad()
        time.sleep(window_s)
        used = load.used_s()
        if used is None or used < busy_cores * window_s:
            break
    return time.perf_counter() - start
