"""The peers' and minisgl variants' server commands, built without starting anything: each follows
the configuration docs/benchmarks/README.md documents. The setup's checks run against fake peers
(small Python scripts that answer or die like llama.cpp's AMX kernel), the AMX rule against the real
llama-cpp-python where it is installed; whatever loads a peer runs it in a child process, so a peer
that crashes fails its test with its message, never the whole run."""

from __future__ import annotations

import argparse
import logging
import os
import resource
import signal
import sys
from pathlib import Path

import pytest
from conftest import llama_cpp_and_default_gguf

from benchmarks.child import ChildFailed, call_in_child, run_child
from benchmarks.cli import parser
from benchmarks.online_systems import online_systems, parse_serve, peer_systems
from benchmarks.peers import amx
from benchmarks.systems import SystemOptions, Unavailable
from minisgl.kernels.variants import cpu_flags

AMX_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_vnni amx_bf16 amx_tile amx_int8\nbugs\t\t:\n"
EPYC_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_vnni avx512_bf16\nbugs\t\t:\n"

# Stands in for llama-server: healthy at /health, streams max_tokens chunks at /v1/completions; with
# FAULTS it dies of SIGILL on its first completion unless started with --no-repack, as llama.cpp's
# AMX kernel does.
FAKE_LLAMA_SERVER = """
import json, os, resource, signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

FAULTS = {faults}
port = int(sys.argv[sys.argv.index("--port") + 1])


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if FAULTS and "--no-repack" not in sys.argv:
            print("in tinygemm_kernel_amx", file=sys.stderr, flush=True)
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.kill(os.getpid(), signal.SIGILL)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(body["max_tokens"]):
            self.wfile.write(b'data: {{"choices": [{{"text": " x"}}]}}\\n\\n')
        usage = {{"prompt_tokens": 5, "completion_tokens": body["max_tokens"]}}
        self.wfile.write(("data: " + json.dumps({{"choices": [], "usage": usage}}) + "\\n\\n").encode())
        self.wfile.write(b"data: [DONE]\\n\\n")

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def _options(gguf: Path | None) -> SystemOptions:
    return SystemOptions(model=None, hf_folder=Path("/models/hf"), gguf=gguf, threads=2, max_seq_len=300)


@pytest.fixture
def installed_peers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder where both peers look installed (empty files: nothing is run)."""
    monkeypatch.setenv("MINISGL_BENCH_CACHE", str(tmp_path))
    (tmp_path / "llama-server").touch()
    (tmp_path / "vllm-venv" / "bin").mkdir(parents=True)
    (tmp_path / "vllm-venv" / "bin" / "python").touch()
    return tmp_path


def _cpu(monkeypatch: pytest.MonkeyPatch, cpuinfo: str) -> None:
    """This process sees a CPU with ``cpuinfo``'s flags."""
    monkeypatch.setattr(amx, "cpu_flags", lambda: cpu_flags(cpuinfo))


def _write_fake_llama_server(binary: Path, faults: bool) -> None:
    binary.write_text(f"#!{sys.executable}\n" + FAKE_LLAMA_SERVER.format(faults=faults))
    binary.chmod(0o755)


def test_llama_server_gets_a_context_per_slot_and_the_run_threads(
    installed_peers: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks.peers.llama_server import LlamaServer

    _cpu(monkeypatch, EPYC_CPUINFO)
    server = LlamaServer(4, _options(Path("/models/m.gguf")))
    cmd = server._command(8080)
    assert cmd[0] == str(installed_peers / "llama-server") and server.name == "llama-server-np4"
    flags = dict(zip(cmd[1::2], cmd[2::2]))
    assert flags == {"--host": "127.0.0.1", "--port": "8080", "-m": "/models/m.gguf", "-t": "2", "-tb": "2",
                     "-np": "4", "-c": "1200"}  # fmt: skip
    with pytest.raises(Unavailable, match="GGUF"):
        LlamaServer(1, _options(None))


def test_vllm_pins_threads_and_reports_cached_tokens(installed_peers: Path) -> None:
    from benchmarks.peers.vllm import VllmServer, fastest_dtype

    server = VllmServer(_options(None), kv_cache_gib=1.5, dtype="bfloat16")
    assert server.env == {"VLLM_CPU_KVCACHE_SPACE": "1.5", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
                          "VLLM_SERVER_DEV_MODE": "1"}  # fmt: skip
    cmd = server._command(8000)
    assert cmd[:3] == [
        str(installed_peers / "vllm-venv" / "bin" / "python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    for flag in ("--enable-prefix-caching", "--enable-chunked-prefill", "--enable-prompt-tokens-details"):
        assert flag in cmd
    assert cmd[cmd.index("--model") + 1] == "/models/hf" and cmd[cmd.index("--dtype") + 1] == "bfloat16"
    auto = VllmServer(_options(None), kv_cache_gib=1.5)._command(8000)
    assert auto[auto.index("--dtype") + 1] == fastest_dtype()
    assert fastest_dtype(frozenset({"avx2", "avx512f", "avx512bw"})) == "bfloat16"
    assert fastest_dtype(frozenset({"avx2", "fma", "f16c"})) == "float32"


def test_missing_peers_name_the_setup_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISGL_BENCH_CACHE", str(tmp_path))
    from benchmarks.peers.llama_server import LlamaServer
    from benchmarks.peers.vllm import VllmServer

    for make in (lambda: LlamaServer(1, _options(Path("m.gguf"))), lambda: VllmServer(_options(None), 1.0)):
        with pytest.raises(Unavailable, match="python -m benchmarks.peers setup"):
            make()


def test_minisgl_variants_come_from_serve_flags() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=FLAGS"):
        parse_serve("--dtype bfloat16")
    args = parser().parse_args([
        "--online", "minisgl-naive", "--serve", "fast=--dtype bfloat16 --max-prefill-tokens 512", "--peers", "none",
        "--threads", "2",
    ])  # fmt: skip
    systems = {name: make() for name, make in online_systems(args, _options(None)).items()}
    assert list(systems) == ["minisgl-naive", "fast"]
    cmd = systems["fast"].server.command_for_port(9000)  # type: ignore[attr-defined]
    # The variant's flags come after the run's, so its --dtype wins (argparse keeps the last).
    assert cmd[-4:] == ["--dtype", "bfloat16", "--max-prefill-tokens", "512"]
    assert cmd[cmd.index("--num-threads") + 1] == "2"
    naive = systems["minisgl-naive"].server.command_for_port(9000)  # type: ignore[attr-defined]
    assert naive[naive.index("--cache-type") + 1] == "naive"



def test_paired_takes_the_peers_after_its_configurations(installed_peers: Path) -> None:
    """``benchmarks.paired`` has no peer unless asked (its turns would double a minisgl A/B's time); asked,
    it gets them from the harness's own flags, one llama-server (4 slots) unless told otherwise."""
    from benchmarks import paired

    assert paired.parser().parse_args([]).peers == []
    args = paired.parser().parse_args(["--peers", "vllm,llama-server", "--vllm-kv-cache-gib", "2"])
    systems = {name: make() for name, make in peer_systems(args, _options(Path("m.gguf"))).items()}
    assert list(systems) == ["llama-server-np4", "vllm"]
    assert systems["vllm"].env["VLLM_CPU_KVCACHE_SPACE"] == "2"  # type: ignore[attr-defined]


def test_amx_cpus_run_llama_cpp_without_its_extra_buffer_types(
    installed_peers: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks.peers.llama_server import LlamaServer

    assert {"amx_tile", "amx_int8", "amx_bf16"} <= cpu_flags(AMX_CPUINFO)
    _cpu(monkeypatch, AMX_CPUINFO)
    assert amx.host_amx_flags() == ["amx_tile", "amx_int8", "amx_bf16"]
    assert LlamaServer(1, _options(Path("m.gguf")))._command(8080)[-1] == "--no-repack"
    assert amx.llama_model_params() == {"use_extra_bufts": False}
    assert "amx_tile" in amx.rule_note() and "--no-repack" in amx.rule_note()
    _cpu(monkeypatch, EPYC_CPUINFO)
    assert "--no-repack" not in LlamaServer(1, _options(Path("m.gguf")))._command(8080)
    assert amx.llama_model_params() == {} and "no AMX" in amx.rule_note()


def _fault_like_a_peer() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left behind
    print("repacking weights into the AMX buffer", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGILL)


def test_a_child_that_dies_of_sigill_fails_the_call_with_its_message() -> None:
    with pytest.raises(ChildFailed, match="killed by SIGILL") as failed:
        call_in_child(_fault_like_a_peer, timeout_s=120)
    assert "repacking weights into the AMX buffer" in str(failed.value)  # the child's output's tail
    # The caller lives on, and the same helper brings a working child's result back.
    assert call_in_child(os.getpid, timeout_s=120) != os.getpid()
    with pytest.raises(ChildFailed, match="exited with status 3"):
        run_child([sys.executable, "-c", "import sys; sys.exit(3)"], what="a failing command", timeout_s=120)


def test_the_llama_server_check_generates_and_names_the_signal_that_killed_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks.peers import install

    monkeypatch.setenv("MINISGL_BENCH_CACHE", str(tmp_path))
    _write_fake_llama_server(tmp_path / "llama-server", faults=True)
    _cpu(monkeypatch, EPYC_CPUINFO)  # no AMX: no --no-repack, so the fake dies on its first completion
    problem = install.llama_server_problem(Path("m.gguf"))
    assert problem is not None and "killed by SIGILL" in problem and "on its first completion" in problem, problem
    assert "in tinygemm_kernel_amx" in problem  # its log's tail
    _cpu(monkeypatch, AMX_CPUINFO)  # the rule's --no-repack: it answers
    assert install.llama_server_problem(Path("m.gguf")) is None


def test_setup_rebuilds_a_peer_whose_check_fails_and_stops_when_it_still_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from benchmarks.peers import install

    monkeypatch.setenv("MINISGL_BENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(install, "default_model_path", lambda: Path("m.gguf"))
    _cpu(monkeypatch, EPYC_CPUINFO)
    binary = tmp_path / "llama-server"
    _write_fake_llama_server(binary, faults=True)  # as if built for another CPU
    builds: list[bool] = []

    def build(faults: bool) -> None:
        builds.append(faults)
        _write_fake_llama_server(binary, faults)

    monkeypatch.setitem(install.STEPS, "llama-server", (install.llama_server_problem, lambda: build(False)))
    with caplog.at_level(logging.INFO, logger="benchmarks.peers"):
        install.setup(["llama-server"])
    assert builds == [False]
    assert "no AMX" in caplog.text and "killed by SIGILL" in caplog.text and "ready" in caplog.text

    _write_fake_llama_server(binary, faults=True)
    monkeypatch.setitem(install.STEPS, "llama-server", (install.llama_server_problem, lambda: build(True)))
    with pytest.raises(RuntimeError, match="llama-server: installed, but .* killed by SIGILL"):
        install.setup(["llama-server"])
    assert builds == [False, True]


def _llama_cpp_python_as_on_an_amx_cpu(gguf: str) -> dict[str, object]:
    """In a child: LlamaCppSystem under the AMX rule, with the model parameters llama.cpp got."""
    from benchmarks.systems.llamacpp import LlamaCppSystem

    amx.cpu_flags = lambda: cpu_flags(AMX_CPUINFO)  # type: ignore[assignment]  # the child's own module
    opts = SystemOptions(model=None, hf_folder=Path("unused"), gguf=Path(gguf), threads=1, max_seq_len=64)
    system = LlamaCppSystem("llama.cpp", opts)
    try:
        (completion,) = system.generate([list(range(1000, 1010))], output_len=3)
        return {"use_extra_bufts": system.llm.model_params.use_extra_bufts, "tokens": len(completion.output_ids)}
    finally:
        system.close()


def test_the_amx_rule_reaches_llama_cpp_pythons_model_parameters() -> None:
    gguf = llama_cpp_and_default_gguf()
    # Extra buffer types off is safe on any CPU (llama.cpp then runs its plain kernels).
    got = call_in_child(_llama_cpp_python_as_on_an_amx_cpu, str(gguf), timeout_s=600)
    assert got == {"use_extra_bufts": False, "tokens": 3}
