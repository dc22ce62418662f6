"""Compiling the C kernels (``cpu/*.c``) into one shared library per variant, in the user's cache: torch-free,
so that the server's front end can start a first build while the rest of the server starts
(``start_build``), and the scheduler process, which loads it (``native.py``), finds it built or waits
for it instead of compiling again."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from minisgl.kernels.variants import Variant, cpu_flags, variants_for
from minisgl.priority import lower_thread_priority

logger = logging.getLogger("minisgl.kernels")

SOURCE_DIR = Path(__file__).parent / "cpu"
# Added to the niceness of the compilers of a build started early (``start_build``): the start-up's own
# work (imports, a GGUF's first read) is what the server waits for first, and the compilers take the CPU it
# leaves; once the scheduler process waits for them, nothing else asks for the cores.
BUILD_NICENESS = 10


def cache_dir() -> Path:
    root = os.environ.get("MINISGL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "minisgl")
    return Path(root) / "kernels"


def c_compiler() -> str | None:
    """The compiler the kernels are built with: $CC, else cc or gcc on the PATH; None for none."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@dataclass(frozen=True)
class _Library:
    """One variant's library: its sources, how they are compiled, and where the result lies."""

    variant: Variant
    compiler: str
    flags: tuple[str, ...]
    sources: tuple[Path, ...]
    target: Path

    @classmethod
    def of(cls, variant: Variant, source_dir: Path) -> _Library:
        """Keyed by the sources (the headers too), the compiler and the flags. ``OSError`` without a compiler."""
        compiler = c_compiler()
        if compiler is None:
            raise OSError("no C compiler (cc, gcc or $CC)")
        flags = ("-O3", *variant.compile_flags, "-fopenmp", "-fPIC", "-std=c11")
        texts = [f.read_text() for f in sorted(source_dir.glob("*.[ch]"))]
        key = hashlib.sha256("\n".join([*texts, compiler, *flags]).encode()).hexdigest()[:16]
        target = cache_dir() / f"cpu_kernels-{variant.name}-{key}.so"
        return cls(variant, compiler, flags, tuple(sorted(source_dir.glob("*.c"))), target)

    def lock(self) -> TextIO:
        """The lock file beside the library (taken with ``fcntl.flock``: released when the file closes, or
        when its process dies), through which processes asking for it at once compile it once."""
        self.target.parent.mkdir(parents=True, exist_ok=True)
        return open(self.target.parent / f".{self.target.name}.lock", "w")

    def compile_locked(self, since: float) -> None:
        """Compile the library, holding its lock, unless another process did meanwhile (``since``: when
        this one began to ask)."""
        waited = time.perf_counter() - since
        if self.target.is_file():
            logger.info("waited %.1f s for the %s kernels' build started earlier", waited, self.variant.name)
            return
        self._compile()
        logger.info(
            "compiled the %s kernels in %.1f s -> %s", self.variant.name, time.perf_counter() - since, self.target
        )

    def _compile(self) -> None:
        """Each source in its own compiler process (they run in parallel), then linked."""
        with tempfile.TemporaryDirectory(prefix=f".tmp-{self.target.name}-", dir=self.target.parent) as tmp:
            objects = [f"{tmp}/{s.stem}.o" for s in self.sources]
            commands = [[self.compiler, *self.flags, "-c", "-o", o, str(s)] for s, o in zip(self.sources, objects)]
            compiles = [subprocess.Popen(c, stderr=subprocess.PIPE, text=True) for c in commands]
            outcomes = [(p.communicate()[1], p.returncode) for p in compiles]  # read stderr: a full pipe would block
            errors = [stderr for stderr, code in outcomes if code != 0]
            if not errors:
                # -Bsymbolic: calls between the kernels stay inside this library when several variants are loaded.
                link = [self.compiler, "-shared", "-fopenmp", "-Wl,-Bsymbolic", "-o", f"{tmp}/lib.so", *objects]
                result = subprocess.run(link, capture_output=True, text=True, check=False)
                errors = [result.stderr] if result.returncode else []
            if errors:
                lines = [line for line in errors[0].splitlines() if "error" in line] or [errors[0].strip()]
                raise OSError(f"{self.compiler} failed for {self.variant.name}: {lines[0][-500:]}")
            os.replace(f"{tmp}/lib.so", self.target)  # atomic: a process that does not wait on the lock loads it whole


def build(variant: Variant, source_dir: Path) -> Path:
    """The shared library of ``variant`` from the sources in ``source_dir``, compiled once per source,
    compiler and flags. Processes that ask for it at once compile it once: the others wait for it.
    Raises ``OSError`` where it does not build."""
    library = _Library.of(variant, source_dir)
    if not library.target.is_file():
        since = time.perf_counter()
        with library.lock() as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            library.compile_locked(since)
    return library.target


def start_build(choice: str) -> threading.Thread | None:
    """Build, on a thread, the library that ``native.resolve_kernels(choice)`` loads first on this CPU;
    None where there is nothing to build: it is built, another process is building it, or it cannot be
    (no variant, no compiler). A build that fails is left to ``resolve_kernels``, which says why."""
    candidates = variants_for(choice, cpu_flags())
    if not candidates or c_compiler() is None:
        return None
    library = _Library.of(candidates[0], SOURCE_DIR)
    if library.target.is_file():
        return None
    lock = library.lock()
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None

    def run() -> None:
        lower_thread_priority(BUILD_NICENESS)  # the compilers it starts inherit it
        with lock, contextlib.suppress(OSError):  # a failed build: resolve_kernels tries again, and reports it
            library.compile_locked(time.perf_counter())

    # Not a daemon: a process that exits meanwhile waits for the compilers, so no half-built folder stays.
    thread = threading.Thread(target=run, name="minisgl-kernel-build")
    thread.start()
    return thread
