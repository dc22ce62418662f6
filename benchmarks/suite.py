"""Runs every requested system on every workload, one after another on this machine, and writes the results."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from benchmarks import online as online_runner
from benchmarks.cli import sizes_of
from benchmarks.dense_folder import dense_folder
from benchmarks.machine import OtherLoad, load_average, machine_info, tree_peak_rss
from benchmarks.metrics import agreement
from benchmarks.offline import run_offline, warm_up
from benchmarks.online_systems import Factory, online_systems
from benchmarks.plots import draw_all
from benchmarks.report import markdown, plain, write_json
from benchmarks.results import RunResult
from benchmarks.scale_model import gguf_of, resolve_scale_model
from benchmarks.server import server_available
from benchmarks.systems import SystemOptions, Unavailable, make_system
from benchmarks.workloads import Workload, build
from minisgl.models.source import resolve_model_path

logger = logging.getLogger("benchmarks")


def _options(args: argparse.Namespace, hf_folder: Path, workloads: list[Workload]) -> SystemOptions:
    return SystemOptions(
        model=args.model,
        hf_folder=hf_folder,
        gguf=gguf_of(args.model),
        threads=args.threads,
        dtype=args.dtype,
        device=args.device,
        hf_batch_size=args.hf_batch_size,
        max_seq_len=max(w.max_seq_len() for w in workloads) + 64,  # + the warm-up's few tokens
    )


def _log(run: RunResult) -> None:
    logger.info(
        "%-8s %-14s %-13s %7.1f s  %6.2f req/s  %7.1f out tok/s  hit %3.0f%% (best %3.0f%%)  others' CPU %s s",
        run.mode,
        run.system,
        run.workload,
        run.duration_s,
        run.throughput()["requests_per_s"],
        run.throughput()["output_tokens_per_s"],
        100 * run.hit_rate,
        100 * run.best_hit_rate,
        run.others_cpu_s,
    )


def _run_offline(name: str, opts: SystemOptions, workloads: list[Workload], tokenizer: Any) -> list[RunResult]:
    logger.info("offline: loading %s", name)
    system = make_system(name, opts)
    try:
        warm_up(system, len(tokenizer))
        runs = []
        for w in workloads:
            others = OtherLoad()
            runs.append(run_offline(system, w, tokenizer))
            runs[-1].others_cpu_s = others.core_seconds()
            _log(runs[-1])
        return runs
    finally:
        system.close()


def _run_online(
    name: str, factory: Factory, args: argparse.Namespace, workloads: list[Workload], tokenizer: Any
) -> list[RunResult]:
    logger.info("online: starting %s", name)
    start = time.perf_counter()
    with factory() as system:
        ready_s: float | None = None
        runs = []
        for w in workloads:
            url = system.fresh()  # before OtherLoad: llama-server restarts, so its pid changes here
            if ready_s is None:  # to healthy and warmed up (a system that restarts per workload: in fresh())
                ready_s = time.perf_counter() - start
            others = OtherLoad(system.pid)
            runs.append(
                online_runner.run_online(system, url, w, tokenizer, args.request_rate, args.max_concurrency, args.seed)
            )
            # The server's processes as they stand after the workload (their peaks so far).
            runs[-1].extra |= {"ready_s": ready_s, "server_peak_rss_bytes": tree_peak_rss(system.pid)}
            runs[-1].others_cpu_s = others.core_seconds()
            _log(runs[-1])
        return runs


def _annotate_agreement(runs: list[RunResult], reference: str) -> None:
    """Each run against the reference system's run of the same workload in the same mode: online prompts
    are text, which a server re-tokenizes, so only an online reference saw exactly the same input."""
    for run in runs:
        ref = next((r for r in runs if (r.workload, r.system, r.mode) == (run.workload, reference, run.mode)), None)
        if ref is not None:
            run.agreement = agreement(run.texts, ref.texts)


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    started, load_start, others = time.perf_counter(), load_average(), OtherLoad()
    sizes = sizes_of(args)
    args.model = resolve_scale_model(args.model)  # a scale model's name: its GGUF, written on first use
    hf_folder = resolve_model_path(args.model)
    gguf = gguf_of(args.model)
    if gguf is not None and ({"hf", "hf-batch"} & set(args.systems) or "vllm" in args.peers):
        hf_folder = dense_folder(gguf)  # those peers load weights from a folder only
    tokenizer = AutoTokenizer.from_pretrained(str(hf_folder))
    workloads = build(args.workloads, tokenizer, sizes, args.seed, args.token_source)
    opts = _options(args, hf_folder, workloads)
    runs: list[RunResult] = []
    skipped: list[dict[str, Any]] = []
    minisgl_names = {*args.online, *(name for name, _ in args.serve)}

    def attempt(name: str, mode: str, go: Callable[[], list[RunResult]]) -> None:
        # One broken system must not throw away the others' minutes of measurements; the failure
        # is logged with its traceback, listed in the report, and makes the command exit non-zero.
        try:
            runs.extend(go())
        except Unavailable as e:
            logger.warning("skipping %s (%s): %s", name, mode, e)
            skipped.append({"system": name, "mode": mode, "reason": str(e)})
        except Exception as e:
            logger.exception("%s (%s) failed", name, mode)
            skipped.append({"system": name, "mode": mode, "reason": f"FAILED: {type(e).__name__}: {e}", "failed": True})

    for name in args.systems:
        attempt(name, "offline", partial(_run_offline, name, opts, workloads, tokenizer))
    for name, factory in online_systems(args, opts).items():
        if name in minisgl_names and not server_available():
            skipped.append({"system": name, "mode": "online", "reason": "this checkout has no minisgl/server"})
            continue
        attempt(name, "online", partial(_run_online, name, factory, args, workloads, tokenizer))
    _annotate_agreement(runs, args.reference)
    return {
        "command": " ".join(["python -m benchmarks", *argv]),
        "machine": machine_info(args.threads),
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "other_processes_core_seconds": others.core_seconds(),
        "duration_s": time.perf_counter() - started,
        "config": vars(args),
        "reference": args.reference,
        "workloads": {
            w.name: {"requests": w.num_requests, "rounds": len(w.rounds), "output_len": w.output_len} for w in workloads
        },
        "runs": [r.to_json() for r in runs],
        "skipped": skipped,
    }


def write(report: dict[str, Any], out_dir: Path) -> None:
    """JSON, figures and markdown, all from the same JSON-safe dictionary."""
    report = plain({**report, "config": {k: str(v) if isinstance(v, Path) else v for k, v in report["config"].items()}})
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(report, out_dir / "results.json")
    figures = draw_all(report, out_dir)
    (out_dir / "results.md").write_text(markdown(report, figures))
    print(f"wrote {out_dir / 'results.json'}, {out_dir / 'results.md'} and {', '.join(figures)}", file=sys.stderr)
