"""The peers' and minisgl variants' server commands, built without starting anything (peers never run
in the suite): each follows the configuration docs/benchmarks/README.md documents."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.cli import parser
from benchmarks.online_systems import online_systems, parse_serve
from benchmarks.systems import SystemOptions, Unavailable


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


def test_llama_server_gets_a_context_per_slot_and_the_run_threads(installed_peers: Path) -> None:
    from benchmarks.peers.llama_server import LlamaServer

    server = LlamaServer(4, _options(Path("/models/m.gguf")))
    cmd = server._command(8080)
    assert cmd[0] == str(installed_peers / "llama-server") and server.name == "llama-server-np4"
    flags = dict(zip(cmd[1::2], cmd[2::2]))
    assert flags == {"--host": "127.0.0.1", "--port": "8080", "-m": "/models/m.gguf", "-t": "2", "-tb": "2",
                     "-np": "4", "-c": "1200"}  # fmt: skip
    with pytest.raises(Unavailable, match="GGUF"):
        LlamaServer(1, _options(None))


def test_vllm_pins_threads_and_reports_cached_tokens(installed_peers: Path) -> None:
    from benchmarks.peers.vllm import VllmServer

    server = VllmServer(_options(None), kv_cache_gib=1.5)
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
