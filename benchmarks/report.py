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


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def markdown(report: dict[str, Any], figures: list[str]) -> str:
    m = report["machine"]
    lines = [
        "# minisgl benchmark results",
        "",
        f"- Command: `{report['command']}`",
        f"- Machine: {m['cpu']}, {m['usable_cores']} usable cores, {m['threads']} threads, "
        f"GPU: {m['gpu'] or 'none'}; torch {m['torch']}, transformers {m['transformers']}, "
        f"llama-cpp-python {m['llama_cpp_python'] or 'not installed'}; commit {m['git_commit']}",
        f"- When: {m['time']}; took {report['duration_s'] / 60:.1f} min",
        f"- Load average (1/5/15 min) at start {report['load_average_start']}, at end {report['load_average_end']}: "
        "timings are only meaningful when the machine was otherwise idle.",
        f"- Reference for agreement: `{report['reference']}` (offline); greedy decoding, {report['config']['output_len']} output tokens per request everywhere.",
        "",
    ]
    runs = report["runs"]
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    offline = [r for r in runs if r["mode"] == "offline"]
    if offline:
        lines += ["## Offline (whole workload submitted at once; multi-turn: one batch per round)", ""]
        header = ["workload", "system", "time (s)", "req/s", "output tok/s", "total tok/s", "hit rate", "best possible", "identical", "prefix agreement"]
        rows = [
            [
                r["workload"], r["system"], _num(r["duration_s"]), _num(r["requests_per_s"], 2),
                _num(r["output_tokens_per_s"]), _num(r["total_tokens_per_s"]), _pct(r["hit_rate"]),
                _pct(r["best_hit_rate"]), _pct(r["agreement"].get("identical")), _pct(r["agreement"].get("prefix")),
            ]
            for w in workloads for r in offline if r["workload"] == w
        ]
        lines += _table(header, rows) + [""]
    online = [r for r in runs if r["mode"] == "online"]
    if online:
        lines += [f"## Online (OpenAI streaming API; {online[0]['description'].split('; ')[-1]})", ""]
        header = ["workload", "system", "req/s", "output tok/s", "TTFT mean / p50 / p99 (ms)", "ITL mean / p99 (ms)",
                  "TPOT mean (ms)", "E2E mean / p99 (ms)", "hit rate", "best possible", "identical"]
        rows = []
        for w in workloads:
            for r in (r for r in online if r["workload"] == w):
                lat = r["latency"]
                rows.append([
                    r["workload"], r["system"], _num(r["requests_per_s"], 2), _num(r["output_tokens_per_s"]),
                    f"{_ms(lat['ttft_s'], 'mean')} / {_ms(lat['ttft_s'], 'p50')} / {_ms(lat['ttft_s'], 'p99')}",
                    f"{_ms(lat['itl_s'], 'mean')} / {_ms(lat['itl_s'], 'p99')}", _ms(lat["tpot_s"], "mean"),
                    f"{_ms(lat['e2e_s'], 'mean')} / {_ms(lat['e2e_s'], 'p99')}",
                    _pct(r["hit_rate"]), _pct(r["best_hit_rate"]), _pct(r["agreement"].get("identical")),
                ])
        lines += _table(header, rows) + [""]
    if report["skipped"]:
        lines += ["## Not run", ""] + [f"- {s['system']} ({s['mode']}): {s['reason']}" for s in report["skipped"]] + [""]
    lines += ["## Systems", ""] + sorted({f"- {r['system']} ({r['mode']}): {r['description']}" for r in runs}) + [""]
    lines += [f"![{Path(f).stem}]({f})" for f in figures]
    return "\n".join(lines) + "\n"
