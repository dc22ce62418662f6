"""The private directory of the ZeroMQ ipc sockets between a front end and its scheduler process.

Its name carries the front end's pid, so that a later start can tell the directories of front ends
that were killed (with no chance to clean up) from those of live ones, and remove them."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "minisgl-ipc-"


def create_ipc_dir(root: Path | None = None) -> Path:
    """A new directory for this process, after removing those of dead front ends."""
    remove_stale_ipc_dirs(root)
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root))


def remove_stale_ipc_dirs(root: Path | None = None) -> list[Path]:
    """Remove this user's ipc directories whose front end is gone; returns what was removed."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(PREFIX + "*"):
        pid = path.name[len(PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)) or path.is_symlink() or not path.is_dir():
            continue
        if path.stat().st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
