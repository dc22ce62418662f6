"""``python -m benchmarks``: minisgl and its peers on the same model, requests and machine, in one run."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

from benchmarks.machine import usable_cores
from benchmarks.online_systems import parse_serve
from benchmarks.peers import PEERS
from benchmarks.scale_model import SCALE_MODELS
from benchmarks.systems import MINISGL_VARIANTS, OFFLINE_SYSTEMS
from benchmarks.workloads import WORKLOADS, Sizes

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"


def comma_names(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(value: str) -> list[str]:
        names = [n for n in value.split(",") if n and n != "none"]
        unknown = [n for n in names if n not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose from {', '.join(choices)}")
        return names

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument(
        "--model",
        default=None,
        help="GGUF file or Hugging Face folder (default: SmolLM2-135M-Instruct GGUF), or a scale model: random "
        "weights in a real model's shape as a Q4_1 GGUF, written on first use (benchmarks/scale_model.py): "
        f"{', '.join(SCALE_MODELS)}",
    )
    p.add_argument(
        "--workloads",
        type=comma_names(WORKLOADS),
        default=list(WORKLOADS),
        help="comma-separated: " + ",".join(WORKLOADS),
    )
    p.add_argument(
        "--systems",
        type=comma_names(OFFLINE_SYSTEMS),
        default=["minisgl", "hf"],
        help="offline systems, comma-separated ('none' for none): " + ",".join(OFFLINE_SYSTEMS),
    )
    online = tuple(MINISGL_VARIANTS)
    p.add_argument(
        "--online",
        type=comma_names(online),
        default=["minisgl", "minisgl-naive", "minisgl-bf16"],
        help="built-in minisgl variants to serve and load over HTTP ('none' for none): " + ",".join(online),
    )
    p.add_argument(
        "--serve",
        type=parse_serve,
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="one more minisgl server to load, started with these `python -m minisgl serve` flags "
        "(repeatable), e.g. --serve 'minisgl-bf16-fcfs=--dtype bfloat16 --schedule-policy fcfs'",
    )
    add_peer_arguments(p, default_peers=list(PEERS), default_slots=[1, 4])
    p.add_argument(
        "--reference",
        default="minisgl",
        help="system whose outputs the others are compared with, in the same mode (offline / online)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for results.json, results.md and the PNGs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--token-source",
        choices=["text", "random"],
        default="text",
        help="text: built-in English corpus; random: random ids (for tokenizers without real words)",
    )
    p.add_argument(
        "--threads", type=int, default=usable_cores(), help="CPU threads for every system (default: usable cores)"
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", choices=["cpu", "cuda", "auto"])
    p.add_argument("--hf-batch-size", type=int, default=8, help="batch size of the padded transformers peer (hf-batch)")
    p.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="online: Poisson arrivals per second (inf: all at once)",
    )
    p.add_argument("--max-concurrency", type=int, default=None, help="online: most requests in flight")
    add_size_arguments(p)
    return p


def add_peer_arguments(p: argparse.ArgumentParser, default_peers: list[str], default_slots: list[int]) -> None:
    """``--peers``, ``--llama-server-parallel``, ``--vllm-kv-cache-gib`` and ``--vllm-dtype``
    (``online_systems.peer_systems`` reads them)."""
    p.add_argument(
        "--peers",
        type=comma_names(PEERS),
        default=default_peers,
        help="peer servers, comma-separated ('none' for none; install with python -m benchmarks.peers setup): "
        + ",".join(PEERS),
    )
    p.add_argument(
        "--llama-server-parallel",
        type=lambda v: [int(x) for x in v.split(",")],
        default=default_slots,
        help="llama-server slot counts (-np) to run, comma-separated; each is its own system",
    )
    p.add_argument("--vllm-kv-cache-gib", type=float, default=1.0, help="VLLM_CPU_KVCACHE_SPACE (minisgl's default)")
    p.add_argument(
        "--vllm-dtype", choices=["auto", "bfloat16", "float32"], default="auto",
        help="vLLM's --dtype (auto: its fastest on this CPU, benchmarks.peers.vllm.fastest_dtype)",
    )  # fmt: skip


def add_size_arguments(p: argparse.ArgumentParser) -> None:
    """``--groups``, ``--system-len``, ...: one flag per field of ``Sizes`` (``sizes_of`` reads them back)."""
    sizes = p.add_argument_group("workload sizes")
    for f in fields(Sizes):
        sizes.add_argument(f"--{f.name.replace('_', '-')}", type=int, default=f.default)


def sizes_of(args: argparse.Namespace) -> Sizes:
    return Sizes(**{f.name: getattr(args, f.name) for f in fields(Sizes)})


def main(argv: list[str] | None = None) -> int:
    """Exit status 1 when a system failed (its error is in the report), else 0."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request would drown the progress
    from benchmarks import suite  # heavy (torch, transformers): only once the arguments are valid

    report = suite.run(args, argv)
    suite.write(report, args.out)
    return 1 if any(s.get("failed") for s in report["skipped"]) else 0
