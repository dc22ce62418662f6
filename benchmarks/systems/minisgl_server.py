"""minisgl's own HTTP server (``python -m minisgl serve``), in any engine configuration given as flags."""

from __future__ import annotations

import re

import httpx

from benchmarks.server import WarmServer, minisgl_server


class MinisglServer(WarmServer):
    flush_path = "/flush_cache"

    def __init__(self, name: str, engine_args: list[str], description: str) -> None:
        self.name = name
        self.description = description
        self.server = minisgl_server(engine_args)

    def counters(self) -> dict[str, float]:
        """Cumulative token counters from ``/metrics`` (Prometheus text format)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10.0).text
        found = re.findall(r"^minisgl_(prompt_tokens|cached_tokens)_total\s+(\S+)$", text, re.MULTILINE)
        return {name: float(value) for name, value in found}
