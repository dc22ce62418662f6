"""Code that may crash its process (a peer's native library faulting on this CPU) run in a child
process, so that a crash fails one call with its message instead of killing the caller (a benchmark,
the setup's check, a pytest run).

``call_in_child(function, *args)`` calls a module-level function in a fresh interpreter that imports
as this one does, and returns its JSON result; ``run_child(command)`` runs any command. Both raise
``ChildFailed`` naming how the child ended (``killed by SIGILL (Illegal instruction)``, an exit status,
a timeout) with the tail of what it wrote.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

OUTPUT_TAIL_CHARS = 3000
# The child's first line restores the caller's sys.path, so it finds this module where the caller did.
CHILD_MAIN = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1])['sys_path']; "
    "import benchmarks.child as c; c.serve(sys.argv[1])"
)


class ChildFailed(RuntimeError):
    """The child crashed, failed or ran out of time; the message says which, with its output's tail."""


def exit_description(returncode: int) -> str:
    """How a process ended, from its return code (negative: the signal that killed it)."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        sig = signal.Signals(-returncode)
    except ValueError:
        return f"was killed by signal {-returncode}"
    return f"was killed by {sig.name} ({signal.strsignal(sig)})"


def _tail(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        output = output.decode(errors="replace")
    return (output or "").strip()[-OUTPUT_TAIL_CHARS:] or "(no output)"


def run_child(command: list[str], what: str, timeout_s: float, env: dict[str, str] | None = None) -> str:
    """Runs ``command`` (its stderr merged into its stdout) and returns that output; raises
    ``ChildFailed`` starting with ``what`` when it does not exit with status 0 within ``timeout_s``."""
    try:
        done = subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=timeout_s,
            env={**os.environ, **(env or {})},
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise ChildFailed(f"{what} did not finish within {timeout_s:g} s; output's tail:\n{_tail(e.output)}") from None
    if done.returncode != 0:
        raise ChildFailed(f"{what} {exit_description(done.returncode)}; output's tail:\n{_tail(done.stdout)}")
    return done.stdout


def call_in_child(function: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
    """``function(*args)`` in a fresh interpreter with this one's ``sys.path``; its result back.

    ``function`` must be importable by name (defined at a module's top level); ``args`` and the result
    travel as JSON."""
    target = f"{function.__module__}:{function.__qualname__}"
    with tempfile.TemporaryDirectory(prefix="bench-child-") as folder:
        result_file = Path(folder) / "result.json"
        request = {"function": target, "args": list(args), "sys_path": sys.path, "result_file": str(result_file)}
        run_child([sys.executable, "-c", CHILD_MAIN, json.dumps(request)], what=target, timeout_s=timeout_s)
        return json.loads(result_file.read_text())


def serve(request_json: str) -> None:
    """The child's side of ``call_in_child`` (its sys.path already the caller's)."""
    request = json.loads(request_json)
    module_name, qualname = request["function"].split(":")
    function: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        function = getattr(function, part)
    Path(request["result_file"]).write_text(json.dumps(function(*request["args"])))
