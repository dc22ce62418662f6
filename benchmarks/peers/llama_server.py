"""llama.cpp's own server: continuous batching over ``-np`` parallel slots, each keeping its last prompt.

Configuration (llama.cpp's documented server setup, defaults otherwise): ``-t``/``-tb`` = the run's
threads, ``-np N`` slots with ``-c N x`` the workload's longest sequence so every slot fits one,
continuous batching and its prompt cache on (both default). Its prompt cache also keeps evicted
slot states in host memory, beyond the reach of any endpoint, so emptying it means restarting the
server, which on a 135M-parameter GGUF takes about a second. On an AMX CPU it also gets
``--no-repack`` (``benchmarks.peers.amx``).
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Self

import aiohttp

from benchmarks.child import ChildFailed, exit_description
from benchmarks.client import Timing, client_session, complete
from benchmarks.peers.amx import llama_server_flags
from benchmarks.peers.paths import LLAMA_CPP_PYTHON_VERSION, SETUP_COMMAND, llama_server_binary
from benchmarks.server import ServerProcess, start_warm
from benchmarks.systems.base import SystemOptions, Unavailable

CHECK_STARTUP_TIMEOUT_S = 120.0


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
            "-c", str(context), *llama_server_flags(),
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


def check_generates(gguf: Path, prompt: str, tokens: int, threads: int) -> None:
    """The setup's check: llama-server started as the benchmarks start it (the AMX rule included) on
    a free port of 127.0.0.1, one greedy completion of ``tokens`` tokens, stopped. Raises
    ``ChildFailed`` saying how it failed (killed by SIGILL on its first completion, say)."""
    opts = SystemOptions(model=None, hf_folder=Path("unused"), gguf=gguf, threads=threads, max_seq_len=256)
    server = ServerProcess(LlamaServer(1, opts)._command, timeout_s=CHECK_STARTUP_TIMEOUT_S)
    try:
        with server as url:  # its log goes when the block ends without an exception: the message has its tail
            failure = _first_completion_failure(server, url, prompt, tokens)
    except (RuntimeError, TimeoutError) as e:  # from ServerProcess: it died or hung while loading the model
        raise ChildFailed(f"llama-server did not start: {e}") from e
    if failure is not None:
        raise ChildFailed(f"llama-server {failure}")


def _first_completion_failure(server: ServerProcess, url: str, prompt: str, tokens: int) -> str | None:
    """None when the server streams the completion it is asked for; else how it failed, with its
    log's tail (its death when it died of the request)."""

    async def complete_once() -> Timing:
        async with client_session(timeout_s=60.0) as client:
            return await complete(client, url, prompt, tokens)

    assert server.process is not None
    try:
        timing = asyncio.run(complete_once())
    except (aiohttp.ClientError, TimeoutError, RuntimeError) as e:
        try:
            returncode = server.process.wait(timeout=5)  # a dying server may still be closing its sockets
        except subprocess.TimeoutExpired:
            how = f"failed its first completion ({e!r})"
        else:
            how = f"{exit_description(returncode)} on its first completion"
        return f"{how}; its log's tail:\n{server.log_tail()}"
    if timing.completion_tokens != tokens:
        return f"gave {timing.completion_tokens} tokens, not the {tokens} asked for"
    return None
