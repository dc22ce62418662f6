"""PNG figures from a run's report dictionary (so they can be redrawn from the JSON alone)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def _label(run: dict[str, Any]) -> str:
    return run["system"] if run["mode"] == "offline" else f"{run['system']} (online)"


def _grouped(runs: list[dict[str, Any]]) -> tuple[list[str], list[str], dict[tuple[str, str], dict[str, Any]]]:
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    labels = list(dict.fromkeys(_label(r) for r in runs))
    return workloads, labels, {(r["workload"], _label(r)): r for r in runs}


def _bars(
    ax: Any,
    workloads: list[str],
    labels: list[str],
    value: Callable[[dict[str, Any]], float],
    by: dict[tuple[str, str], dict[str, Any]],
) -> float:
    """One group of bars per workload, one bar per system; returns the bar width."""
    width = 0.8 / len(labels)
    x = np.arange(len(workloads))
    for i, label in enumerate(labels):
        heights = [value(by[(w, label)]) if (w, label) in by else math.nan for w in workloads]
        bars = ax.bar(x + i * width - 0.4 + width / 2, heights, width, label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=6)  # a 0 bar is otherwise invisible
    ax.set_xticks(x, workloads)
    return width


def throughput(report: dict[str, Any], path: Path) -> bool:
    if not report["runs"]:
        return False
    plt = _pyplot()
    workloads, labels, by = _grouped(report["runs"])
    fig, ax = plt.subplots(figsize=(11, 4.5), layout="constrained")
    _bars(ax, workloads, labels, lambda r: r["output_tokens_per_s"], by)
    ax.set_ylabel("output tokens / s")
    ax.set_title("Output throughput (higher is better)")
    fig.legend(loc="outside right upper", fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def hit_rate(report: dict[str, Any], path: Path) -> bool:
    """Measured prefix-cache hit rate per system, with the workload's best possible drawn over each bar."""
    if not report["runs"]:
        return False
    plt = _pyplot()
    workloads, labels, by = _grouped(report["runs"])
    fig, ax = plt.subplots(figsize=(11, 4.5), layout="constrained")
    width = _bars(ax, workloads, labels, lambda r: 100 * r["hit_rate"], by)
    for i, label in enumerate(labels):
        for j, w in enumerate(workloads):
            if (w, label) in by:
                x = j + i * width - 0.4 + width / 2
                best = 100 * by[(w, label)]["best_hit_rate"]
                ax.plot([x - width / 2, x + width / 2], [best, best], color="black", linewidth=2)
    ax.plot([], [], color="black", linewidth=2, label="best possible")
    ax.set_ylabel("prompt tokens served from cache (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Prefix-cache hit rate vs the best an unlimited cache could do")
    fig.legend(loc="outside right upper", fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def ttft(report: dict[str, Any], path: Path) -> bool:
    """Box plots of time to first token of the online runs; False (no file) when there were none."""
    online = [r for r in report["runs"] if r["mode"] == "online"]
    if not online:
        return False
    plt = _pyplot()
    workloads = list(dict.fromkeys(r["workload"] for r in online))
    fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 4), squeeze=False, layout="constrained")
    for ax, w in zip(axes[0], workloads):
        runs = [r for r in online if r["workload"] == w]
        ax.boxplot([[1000 * t for t in r["ttft_s"] if t is not None] for r in runs], showfliers=True)
        ax.set_xticks(range(1, len(runs) + 1), [r["system"] for r in runs], rotation=20)
        ax.set_title(w)
        ax.set_ylabel("TTFT (ms)")
        ax.set_ylim(bottom=0)
    fig.suptitle("Time to first token, online (lower is better)")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


LATENCY_PANELS = (("ttft_s", "p50", "TTFT p50"), ("ttft_s", "p99", "TTFT p99"), ("tpot_s", "mean", "TPOT mean"),
                  ("itl_s", "p99", "ITL p99"), ("e2e_s", "p50", "E2E p50"), ("e2e_s", "p99", "E2E p99"))  # fmt: skip


def latency(report: dict[str, Any], path: Path) -> bool:
    """One panel per latency figure of the online runs, bars per workload and system; False when none ran."""
    online = [r for r in report["runs"] if r["mode"] == "online"]
    if not online:
        return False
    plt = _pyplot()
    workloads, labels, by = _grouped(online)
    fig, axes = plt.subplots(2, 3, figsize=(16, 7), squeeze=False, layout="constrained")
    for ax, (metric, stat, title) in zip(axes.flat, LATENCY_PANELS):

        def value(r: dict[str, Any], metric: str = metric, stat: str = stat) -> float:
            v = r["latency"][metric][stat]
            return math.nan if v is None else 1000 * v

        _bars(ax, workloads, labels, value, by)
        ax.set_title(f"{title} (ms)")
        ax.tick_params(axis="x", labelsize=7)
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside right upper", fontsize=8)
    fig.suptitle("Online latency per system (lower is better)")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def draw_all(report: dict[str, Any], out_dir: Path) -> list[str]:
    """Writes the figures into ``out_dir``; returns their file names."""
    names = []
    for name, draw in (("throughput.png", throughput), ("hit_rate.png", hit_rate), ("ttft.png", ttft),
                       ("latency.png", latency)):  # fmt: skip
        if draw(report, out_dir / name):
            names.append(name)
        else:
            (out_dir / name).unlink(missing_ok=True)  # a stale figure from an earlier run would mislead
    return names
