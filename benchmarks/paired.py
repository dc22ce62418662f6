"""Paired A/B of minisgl configurations: every server is up at once (an idle one polls twice a second)
and every offline engine loaded, and each workload runs on each of them in turn for ``--repeats`` rounds,
the order reversed every other round (A B, B A, A B, ...), so that this VM's drift in speed (20-50% within
a session) falls on every configuration alike (in one sequence, whichever ran second in a slowing minute
would lose by the drift alone). Caches are emptied before every run.

Per round, each configuration's speed against the first's on the same workload is the first's wall time
over its own (above 1: faster; the same requests and output lengths, so it is also the ratio of output
tok/s). The summary gives the median of those per-round ratios and their range. Each run starts once
the other processes have been quiet for a moment (``wait_for_quiet``: vLLM's worker spins for about a
second after its run, which would otherwise fall on the next system's; at 1.7B it was once seen busy for
minutes after its warm-up, so round 1 waits up to ``STARTED_QUIET_S`` for quiet). ``others' CPU``: what
processes besides the measured server (or this one, offline) used during its runs, the idle servers
included.

Configurations: built-in variants served over HTTP (``minisgl``, ``minisgl-nospec``, ...), the same run
offline through ``LLM.generate`` (``offline:minisgl``), and servers with any flags (``--serve NAME=FLAGS``,
after ``--systems``). Issue #23, speculation on (the default) against off: chat and random workloads at
least 0.95x, 16 users at once at least 1x (random: 16 prompts at once; shared prefix: 32)::

    python -m benchmarks.paired --systems minisgl-nospec,minisgl --workloads multi-turn,random,shared-prefix

Issue #21, one user through the server against offline (at least 0.95x)::

    python -m benchmarks.paired --systems offline:minisgl,minisgl --workloads single-stream

Peers (``--peers vllm,llama-server``, after the minisgl configurations) take their turns alike. Issue #20,
the shared-prefix burst and random prompts at most 0.7x vLLM CPU's wall (vllm's column: minisgl's wall
over vLLM's; the harness's sizes)::

    python -m benchmarks.paired --model scale-1.7b --systems minisgl --peers vllm \
        --workloads shared-prefix,random --groups 1 --prompts-per-group 16

Options: ``--repeats 6``, ``--model MODEL`` (as for ``python -m benchmarks``), ``--out FILE.md``, workload
sizes and peer settings as for ``python -m benchmarks``.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from benchmarks.cli import add_peer_arguments, add_size_arguments, comma_names, sizes_of
from benchmarks.dense_folder import dense_folder
from benchmarks.machine import OtherLoad, load_average, machine_info, usable_cores, wait_for_quiet
from benchmarks.offline import run_offline, warm_up
from benchmarks.online import run_online
from benchmarks.online_systems import minisgl_variant, minisgl_with_flags, parse_serve, peer_systems
from benchmarks.scale_model import gguf_of, resolve_scale_model
from benchmarks.systems import MINISGL_VARIANTS, SystemOptions, make_system
from benchmarks.systems.base import OfflineSystem, OnlineSystem
from benchmarks.workloads import WORKLOADS, Workload, build
from minisgl.kernels.native import attention_products, cpu_paths, resolve_kernels
from minisgl.models.source import resolve_model_path

OFFLINE = "offline:"
STARTED_QUIET_S = 300.0  # the most round 1 waits for every configuration to go quiet once all are up
CONFIGURATIONS = (*MINISGL_VARIANTS, *(OFFLINE + name for name in MINISGL_VARIANTS))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.paired", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="as for python -m benchmarks (default: the default model)")
    p.add_argument(
        "--systems", type=comma_names(CONFIGURATIONS), default=["minisgl-nospec", "minisgl"],
        help="the configurations, the first the baseline: minisgl variants served, or run offline as "
        "offline:VARIANT (default: minisgl-nospec,minisgl)",
    )  # fmt: skip
    p.add_argument(
        "--serve", type=parse_serve, action="append", default=[], metavar="NAME=FLAGS",
        help="one more server, with these `python -m minisgl serve` flags (repeatable; after --systems)",
    )  # fmt: skip
    p.add_argument(
        "--workloads", type=comma_names(WORKLOADS), default=["multi-turn", "random", "shared-prefix"],
        help=f"comma-separated, of {', '.join(WORKLOADS)}",
    )  # fmt: skip
    p.add_argument("--repeats", type=int, default=6, help="rounds: runs of every workload on every configuration")
    p.add_argument("--threads", type=int, default=usable_cores())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--token-source", choices=["text", "random"], default="text", help="as for python -m benchmarks")
    p.add_argument("--out", type=Path, default=None, help="also write the report to this markdown file")
    add_peer_arguments(p, default_peers=[], default_slots=[4])
    add_size_arguments(p)
    return p


def order(systems: list[str], round_index: int) -> list[str]:
    """The configurations in the order they run in a round: as given in even rounds, reversed in odd ones."""
    return systems if round_index % 2 == 0 else systems[::-1]


Walls = dict[tuple[str, str, int], float]  # (configuration, workload, round) -> seconds


def speed_ratios(walls: Walls, systems: list[str], workload: str, rounds: int) -> dict[str, list[float]]:
    """Per configuration, its speed against the first's in each round: the first's wall over its own."""
    base = systems[0]
    return {s: [walls[base, workload, r] / walls[s, workload, r] for r in range(rounds)] for s in systems}


COLUMNS = (
    "workload", "system", "wall per round (s)", "speed vs the first, per round", "median", "range",
    "others' CPU, most in a run (s)",
)  # fmt: skip


def seconds(wall: float) -> str:
    """Two decimals; two significant digits under 0.1 s, so a tiny model's runs do not print as 0.00."""
    return f"{wall:.2f}" if wall >= 0.1 else f"{wall:.2g}"


def report(
    walls: Walls,
    others: dict[tuple[str, str, int], float | None],
    systems: list[str],
    workloads: list[str],
    rounds: int,
) -> list[str]:
    """The markdown table: a row per workload and configuration."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for w in workloads:
        ratios = speed_ratios(walls, systems, w, rounds)
        for s in systems:
            runs = " / ".join(seconds(walls[s, w, r]) for r in range(rounds))
            per_round = " / ".join(f"{x:.2f}" for x in ratios[s])
            busiest = max((others[s, w, r] or 0.0) for r in range(rounds))
            lines.append(
                f"| {w} | {s} | {runs} | {per_round} | **{statistics.median(ratios[s]):.2f}** | "
                f"{min(ratios[s]):.2f}-{max(ratios[s]):.2f} | {busiest:.1f} |"
            )
    return lines


# One run of a workload on one configuration: (wall seconds, other processes' core-seconds meanwhile).
Runner = Callable[[Workload], tuple[float, float | None]]


def offline_runner(system: OfflineSystem, tokenizer: PreTrainedTokenizerBase) -> Runner:
    def run(workload: Workload) -> tuple[float, float | None]:
        wait_for_quiet()
        load = OtherLoad()
        return run_offline(system, workload, tokenizer).duration_s, load.core_seconds()

    return run


def online_runner(server: OnlineSystem, tokenizer: PreTrainedTokenizerBase, seed: int) -> Runner:
    def run(workload: Workload) -> tuple[float, float | None]:
        url = server.fresh()
        wait_for_quiet()
        load = OtherLoad(server.pid)
        return run_online(server, url, workload, tokenizer, seed=seed).duration_s, load.core_seconds()

    return run


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.model = resolve_scale_model(args.model)
    folder, gguf = resolve_model_path(args.model), gguf_of(args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    workloads = build(args.workloads, tokenizer, sizes_of(args), args.seed, args.token_source)
    served = argparse.Namespace(model=args.model, dtype="float32", device="auto", threads=args.threads)
    opts = SystemOptions(
        model=args.model, gguf=gguf, threads=args.threads,
        hf_folder=dense_folder(gguf) if gguf is not None and "vllm" in args.peers else folder,  # vLLM reads folders
        max_seq_len=max(w.max_seq_len() for w in workloads) + 64,  # + the warm-up's few tokens
    )  # fmt: skip
    peers = peer_systems(args, opts)
    names = [*args.systems, *(name for name, _ in args.serve), *peers]
    if len(set(names)) < 2 or len(set(names)) < len(names) or args.repeats < 1:
        raise SystemExit("need two or more distinct configurations (--systems, --serve, --peers) and one round or more")
    header = [
        "# Paired A/B",
        "",
        f"- Command: `python -m benchmarks.paired {' '.join(sys.argv[1:] if argv is None else argv)}`",
        f"- Machine: `{machine_info(args.threads)}`",
        f"- Model: {args.model or 'the default (SmolLM2-135M-Instruct, Q4_1 GGUF)'}",
        f"- Quantized products: {cpu_paths(resolve_kernels('auto'))}",
        f"- Attention's products over a bf16 KV pool: {attention_products(resolve_kernels('auto'))}",
        f"- Load average at start: {load_average()}",
    ]
    walls: Walls = {}
    others: dict[tuple[str, str, int], float | None] = {}
    with contextlib.ExitStack() as stack:
        runners: dict[str, Runner] = {}
        for name in args.systems:
            if name.startswith(OFFLINE):
                system = make_system(name.removeprefix(OFFLINE), opts)
                stack.callback(system.close)
                warm_up(system, len(tokenizer))
                runners[name], description = offline_runner(system, tokenizer), system.description
            else:
                server = stack.enter_context(minisgl_variant(name, served)())
                runners[name], description = online_runner(server, tokenizer, args.seed), server.description
            header.append(f"- {name}: {description}")
        for name, flags in args.serve:
            server = stack.enter_context(minisgl_with_flags(name, served, shlex.split(flags))())
            runners[name] = online_runner(server, tokenizer, args.seed)
            header.append(f"- {name}: {server.description}")
        for name, factory in peers.items():
            peer = stack.enter_context(factory())
            runners[name] = online_runner(peer, tokenizer, args.seed)
            header.append(f"- {name}: {peer.description}")
        waited = wait_for_quiet(longest_s=STARTED_QUIET_S)
        header.append(f"- Waited {waited:.0f} s, once all were up, for the other processes to go quiet")
        for r in range(args.repeats):
            for w in workloads:
                for name in order(names, r):
                    walls[name, w.name, r], others[name, w.name, r] = runners[name](w)
                    print(f"round {r + 1} {w.name:13s} {name:24s} {seconds(walls[name, w.name, r]):>6s} s", file=sys.stderr)
    header.append(f"- Load average at end: {load_average()}")
    table = report(walls, others, names, [w.name for w in workloads], args.repeats)
    text = "\n".join([*header, "", *table])
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
