"""llama.cpp's own server: continuous batching over ``-np`` parallel slots, each keeping its last prompt.

Configuration (llama.cpp's documented server setup, defaults otherwise): ``-t``/``-tb`` = the run's
threads, ``-np N`` slots with ``-c N x`` the workload's longest sequence so every slot fits one,
continuous batching and its prompt cache on (both default). Its prompt cache also keeps evicted
slot states in host memory, beyond the reach of any endpoint, so emptying it means restarting the
server, which on a 135M-parameter GGUF takes about a second.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

from benchmarks.peers.paths import LLAMA_CPP_PYTHON_VERSION, SETUP_COMMAND, llama_server_binary
from benchmarks.server import ServerProcess, start_warm
from benchmarks.systems.base import SystemOptions, Unavailable


class LlamaServer:
    def __init__(self, slots: int, opts: SystemOptions) -> None:
        if opts.gguf is None:
            raise Unavailable("llama-server needs a GGUF model; --model is a Hugging Face folder")
        if opts.device not in ("cpu", "auto"):
            raise Unavailable("llama-server is built for the CPU here")
        if not llama_server_binary().is_file():
            raise Unavailable(f"{llama_server_binary()} is missing: run {SETUP_COMMAND}")
        self.name = f"llama-server-np{slots}"
        context = slots * opts.max_seq_len
        self.flags = [
            "-m", str(opts.gguf), "-t", str(opts.threads), "-tb", str(opts.threads), "-np", str(slots),
            "-c", str(context),
        ]  # fmt: skip
        self.description = (
            f"llama-server (llama.cpp of llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}), {opts.gguf.name}, "
            + " ".join(self.flags[2:])
            + "; restarted before each workload"
        )
        self.server: ServerProcess | None = None

    def _command(self, port: int) -> list[str]:
        return [str(llama_server_binary()), "--host", "127.0.0.1", "--port", str(port), *self.flags]

    def _start(self) -> str:
        self.server = ServerProcess(self._command)
        return start_warm(self.server)  # warm-up prompts share no prefix with a workload's: nothing to reuse

    def _stop(self, exc: BaseException | None = None) -> None:
        if self.server is not None:
            self.server.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
            self.server = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop(exc)

    @property
    def pid(self) -> int:
        if self.server is None:
            raise RuntimeError("llama-server is not running")
        return self.server.pid

    def fresh(self) -> str:
        self._stop()
        return self._start()

    def counters(self) -> dict[str, float]:
        return {}  # its cached prompt tokens come with each response's usage
