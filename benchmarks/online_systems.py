"""The online systems of a run, by name: minisgl servers (built-in variants and ``--serve NAME=FLAGS``)
and the peers (``--peers``). Each comes as a factory, so a peer that is not installed raises
``Unavailable`` when its turn comes and the run lists it as not run."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from functools import partial

from benchmarks.systems import MINISGL_VARIANTS, OnlineSystem, SystemOptions

Factory = Callable[[], OnlineSystem]


def parse_serve(value: str) -> tuple[str, str]:
    """``NAME=FLAGS`` of ``--serve``: a minisgl server variant with these ``python -m minisgl serve`` flags."""
    name, sep, flags = value.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=FLAGS, e.g. 'minisgl-bf16=--dtype bfloat16'; got {value!r}")
    shlex.split(flags)  # quoting errors now, not after minutes of other systems' runs
    return name.strip(), flags


def minisgl_with_flags(name: str, args: argparse.Namespace, flags: list[str]) -> Factory:
    """A minisgl server with these ``python -m minisgl serve`` flags (after ``args``' model, dtype, device and
    threads, which they may override)."""
    from benchmarks.systems.minisgl_server import MinisglServer

    base = ["--model", args.model] if args.model else []
    base += ["--dtype", args.dtype, "--device", args.device, "--num-threads", str(args.threads)]
    description = "minisgl server" + (", " + " ".join(flags) if flags else ", default flags")
    return lambda: MinisglServer(name, base + flags, description)  # later flags override earlier ones


def _variant_flags(options: dict[str, str]) -> list[str]:
    return [f for k, v in options.items() for f in (f"--{k.replace('_', '-')}", v)]


def minisgl_variant(name: str, args: argparse.Namespace) -> Factory:
    """A built-in variant's server (``MINISGL_VARIANTS``), from ``args``' model, dtype, device and threads."""
    return minisgl_with_flags(name, args, _variant_flags(MINISGL_VARIANTS[name]))


def online_systems(args: argparse.Namespace, opts: SystemOptions) -> dict[str, Factory]:
    systems = {name: minisgl_variant(name, args) for name in args.online}
    systems |= {name: minisgl_with_flags(name, args, shlex.split(flags)) for name, flags in args.serve}
    return systems | peer_systems(args, opts)


def peer_systems(args: argparse.Namespace, opts: SystemOptions) -> dict[str, Factory]:
    """The peers ``cli.add_peer_arguments``' flags ask for."""
    systems: dict[str, Factory] = {}
    if "llama-server" in args.peers:
        from benchmarks.peers.llama_server import LlamaServer

        for slots in args.llama_server_parallel:
            systems[f"llama-server-np{slots}"] = partial(LlamaServer, slots, opts)
    if "vllm" in args.peers:
        from benchmarks.peers.vllm import VllmServer

        systems["vllm"] = partial(VllmServer, opts, args.vllm_kv_cache_gib, args.vllm_dtype)
    return systems
