"""Start ``python -m minisgl serve`` on a free port for the online runner, and stop it afterwards."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx

STARTUP_TIMEOUT_S = 600.0  # a first start may convert the GGUF; on a loaded 2-core box that is minutes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_available() -> bool:
    """Whether this checkout has the HTTP server (the offline benchmarks do not need it)."""
    return importlib.util.find_spec("minisgl.server.launch") is not None


class ServerProcess:
    """``with ServerProcess([...engine flags]) as url:`` a running server at ``url``."""

    def __init__(self, engine_args: list[str], timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        self.engine_args = engine_args
        self.timeout_s = timeout_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Lives as long as the server; closed in __exit__.
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            "w+", prefix="minisgl-serve-", suffix=".log", delete=False
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("the server has not been started")
        return self.process.pid

    def __enter__(self) -> str:
        cmd = [
            sys.executable,
            "-m",
            "minisgl",
            "serve",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            *self.engine_args,
        ]
        root = Path(__file__).resolve().parent.parent
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=root)
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
                    f"server exited with {self.process.returncode}; log: {self.log.name}\n{self._log_tail()}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not healthy after {self.timeout_s:.0f} s; log: {self.log.name}\n{self._log_tail()}")

    def _stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()  # SIGTERM: the server shuts its scheduler process down cleanly
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _log_tail(self, chars: int = 4000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-chars:]
