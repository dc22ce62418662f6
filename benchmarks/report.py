"""The run's JSON record and its markdown summary; both are built from the same dictionary."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def plain(value: Any) -> Any:
    """Strict JSON: NaN (a figure with no data, e.g. ITL of one-token answers) becomes null, infinity "inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def write_json(report: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")


def _pct(x: float | None) -> str:
    return "–" if x is None or math.isnan(x) else f"{100 * x:.0f}%"


def _num(x: float | None, digits: int = 1) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def _ms(summary: dict[str, float], key: str) -> str:
    return _num(None if summary[key] is None else 1000 * summary[key], 0)


def _spread(summary: dict[str, float]) -> str:
    return " / ".join(_ms(summary, key) for key in ("mean", "p50", "p99"))


def _others(run: dict[str, Any], cores: int | None) -> str:
    """Share of the machine other processes used during this row's run."""
    if run["others_cpu_s"] is None:
        return "–"
    return _pct(run["others_cpu_s"] / (run["duration_s"] * (cores or 1)))


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def markdown(report: dict[str, Any], figures: list[str]) -> str:
    m = report["machine"]
    machine = (
        f"{m['cpu']}, {m['usable_cores']} usable cores, {m['threads']} threads, GPU: {m['gpu'] or 'none'}; "
        f"torch {m['torch']}, transformers {m['transformers']}, "
        f"llama-cpp-python {m['llama_cpp_python'] or 'not installed'}; commit {m['git_commit']}"
    )
    load = f"at start {report['load_average_start']}, at end {report['load_average_end']}"
    other = report["other_processes_core_seconds"]
    if other is not None:
        share = other / (report["duration_s"] * (m["cores"] or 1))
        load += f"; other processes used {other:.0f} core-seconds during the run ({100 * share:.0f}% of the machine)"
    lengths = ", ".join(f"{name} {w['output_len']}" for name, w in report["workloads"].items())
    method = (
        f"greedy decoding, the same number of output tokens per request for every system ({lengths}; end of "
        "sequence ignored); every system warmed up and its cache emptied before each workload, one system at a time"
    )
    hit = (
        "*hit rate*: prompt tokens served from a prefix cache / all prompt tokens; *best possible*: the same for an "
        "unlimited cache that reuses every earlier prompt and answer, computed from the token ids actually sent"
    )
    agree = (
        f"*identical*: share of completions equal to `{report['reference']}`'s on the same workload in the same mode "
        "(online prompts are text that each server tokenizes, so only an online reference saw the same input); "
        "*prefix agreement*: mean share of characters before the first difference"
    )
    others = (
        "*others' CPU*: share of the machine that other processes used during that row's run; "
        "a row with more than a few percent was measured on a busy machine"
    )
    lines = [
        "# minisgl benchmark results",
        "",
        f"- Command: `{report['command']}`",
        f"- Machine: {machine}",
        f"- When: {m['time']}; took {report['duration_s'] / 60:.1f} min",
        f"- Load average (1/5/15 min) {load}. Timings are only meaningful when the machine was otherwise idle.",
        f"- Method: {method}.",
        f"- {hit}.",
        f"- {agree}.",
        f"- {others}.",
        "",
    ]
    runs = report["runs"]
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    offline = [r for r in runs if r["mode"] == "offline"]
    if offline:
        lines += ["## Offline (whole workload submitted at once; multi-turn: one batch per round)", ""]
        header = [
            "workload",
            "system",
            "time (s)",
            "req/s",
            "output tok/s",
            "total tok/s",
            "hit rate",
            "best possible",
            "identical",
            "prefix agreement",
            "others' CPU",
        ]
        rows = [
            [
                r["workload"],
                r["system"],
                _num(r["duration_s"]),
                _num(r["requests_per_s"], 2),
                _num(r["output_tokens_per_s"]),
                _num(r["total_tokens_per_s"]),
                _pct(r["hit_rate"]),
                _pct(r["best_hit_rate"]),
                _pct(r["agreement"].get("identical")),
                _pct(r["agreement"].get("prefix")),
                _others(r, m["cores"]),
            ]
            for w in workloads
            for r in offline
            if r["workload"] == w
        ]
        lines += _table(header, rows) + [""]
    online = [r for r in runs if r["mode"] == "online"]
    if online:
        c = report["config"]
        load = (
            f"Poisson rate {c['request_rate']}/s, max concurrency {c['max_concurrency'] or 'none'}; sessions "
            "concurrent, each sending its turns in order; single-stream and copy: one request at a time"
        )
        lines += [f"## Online (OpenAI streaming API; {load})", ""]
        header = [
            "workload",
            "system",
            "time (s)",
            "req/s",
            "output tok/s",
            "total tok/s",
            "TTFT mean / p50 / p99 (ms)",
            "ITL mean / p50 / p99 (ms)",
            "TPOT mean / p50 / p99 (ms)",
            "E2E mean / p50 / p99 (ms)",
            "hit rate",
            "best possible",
            "identical",
            "others' CPU",
        ]
        rows = []
        for w in workloads:
            for r in (r for r in online if r["workload"] == w):
                lat = r["latency"]
                rows.append(
                    [
                        r["workload"],
                        r["system"],
                        _num(r["duration_s"]),
                        _num(r["requests_per_s"], 2),
                        _num(r["output_tokens_per_s"]),
                        _num(r["total_tokens_per_s"]),
                        _spread(lat["ttft_s"]),
                        _spread(lat["itl_s"]),
                        _spread(lat["tpot_s"]),
                        _spread(lat["e2e_s"]),
                        _pct(r["hit_rate"]),
                        _pct(r["best_hit_rate"]),
                        _pct(r["agreement"].get("identical")),
                        _others(r, m["cores"]),
                    ]
                )
        lines += _table(header, rows) + [""]
    servers: dict[str, dict[str, Any]] = {}
    for r in online:
        if "ready_s" in r["extra"]:
            seen = servers.setdefault(r["system"], {"ready_s": r["extra"]["ready_s"], "rss": 0})
            seen["rss"] = max(seen["rss"], r["extra"]["server_peak_rss_bytes"] or 0)
    if servers:
        lines += [
            (
                "## Servers (*ready*: start to healthy plus the warm-up requests; *peak memory*: the highest resident "
                "set of each of the server's processes, summed, over the whole run)"
            ),
            "",
        ]
        rows = [[name, _num(s["ready_s"]), _num(s["rss"] / 2**30, 2)] for name, s in servers.items()]
        lines += _table(["system", "ready (s)", "peak memory (GiB)"], rows) + [""]
    if report["skipped"]:
        lines += (
            ["## Not run", ""] + [f"- {s['system']} ({s['mode']}): {s['reason']}" for s in report["skipped"]] + [""]
        )
    lines += ["## Systems", ""] + sorted({f"- {r['system']} ({r['mode']}): {r['description']}" for r in runs}) + [""]
    lines += [f"![{Path(f).stem}]({f})" for f in figures]
    return "\n".join(lines) + "\n"
