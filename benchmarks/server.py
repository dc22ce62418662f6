"""A benchmarked HTTP server as a child process on a free port: started, waited for, stopped.

The process is generic (minisgl, llama-server, vLLM); ``minisgl_command`` builds minisgl's own.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from benchmarks.child import exit_description
from benchmarks.client import warm_up

STARTUP_TIMEOUT_S = 600.0  # a first start may convert the GGUF; on a loaded 2-core box that is minutes
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_available() -> bool:
    """Whether this checkout has the HTTP server (the offline benchmarks do not need it)."""
    return importlib.util.find_spec("minisgl.server.launch") is not None


class ServerProcess:
    """``with ServerProcess(command_for_port) as url:`` a running server at ``url``, healthy at ``/health``.

    ``env``: variables added to this process's environment."""

    def __init__(
        self,
        command_for_port: Callable[[int], list[str]],
        env: dict[str, str] | None = None,
        timeout_s: float = STARTUP_TIMEOUT_S,
    ) -> None:
        self.command_for_port = command_for_port
        self.env = env or {}
        self.timeout_s = timeout_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("the server has not been started")
        return self.process.pid

    def __enter__(self) -> str:
        # Lives as long as the server; closed in __exit__.
        self.log = tempfile.NamedTemporaryFile("w+", prefix="bench-server-", suffix=".log", delete=False)
        env = {**os.environ, **self.env}
        # Its own process group, so stopping it also stops the processes it spawned (vLLM's engine
        # and workers outlive their API server otherwise).
        self.process = subprocess.Popen(
            self.command_for_port(self.port),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        try:
            self._wait_healthy()
        except BaseException:
            self._stop()
            raise
        return self.url

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()
        self.log.close()
        if exc is None:
            os.unlink(self.log.name)  # keep the log only when something went wrong

    def _wait_healthy(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"server {exit_description(self.process.returncode)}; log: {self.log.name}\n{self.log_tail()}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not healthy after {self.timeout_s:.0f} s; log: {self.log.name}\n{self.log_tail()}")

    def _stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: every server here shuts down cleanly on it
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        _kill_group(self.process.pid)  # whatever it left behind

    def log_tail(self, chars: int = 4000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-chars:]


def _kill_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return  # the group is empty: everything has exited
        time.sleep(5)


def minisgl_server(engine_args: list[str]) -> ServerProcess:
    """``python -m minisgl serve`` with these engine flags, importing this checkout's code."""

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "minisgl", "serve", "--port", str(port), "--log-level", "warning", *engine_args]

    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return ServerProcess(command, env={"PYTHONPATH": pythonpath})


def start_warm(server: ServerProcess) -> str:
    """Starts the server and sends it the warm-up requests (stopping it again if they fail); returns its url."""
    url = server.__enter__()
    try:
        warm_up(url)
    except BaseException as e:
        server.__exit__(type(e), e, e.__traceback__)
        raise
    return url


class WarmServer:
    """An online system that is one server process: started and warmed up on entry, stopped on
    exit; ``fresh()`` empties its prefix cache through ``flush_path`` and returns its url."""

    flush_path: str
    server: ServerProcess
    url: str

    def __enter__(self) -> Self:
        self.url = start_warm(self.server)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.__exit__(exc_type, exc, tb)

    @property
    def pid(self) -> int:
        return self.server.pid

    def fresh(self) -> str:
        response = httpx.post(f"{self.url}{self.flush_path}", timeout=60.0)
        if response.status_code != 200:
            raise RuntimeError(f"{self.flush_path} answered {response.status_code}: {response.text[:300]}")
        return self.url
