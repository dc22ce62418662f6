"""minisgl's own HTTP server (``python -m minisgl serve``), in any engine configuration given as flags."""

from __future__ import annotations

import re
from types import TracebackType
from typing import Self

import httpx

from benchmarks.server import minisgl_server, start_warm


class MinisglServer:
    def __init__(self, name: str, engine_args: list[str], description: str) -> None:
        self.name = name
        self.description = description
        self.server = minisgl_server(engine_args)

    def __enter__(self) -> Self:
        self.url = start_warm(self.server)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.__exit__(exc_type, exc, tb)

    @property
    def pid(self) -> int:
        return self.server.pid

    def fresh(self) -> str:
        response = httpx.post(f"{self.url}/flush_cache", timeout=60.0)
        if response.status_code != 200:
            raise RuntimeError(f"/flush_cache answered {response.status_code}: {response.text[:300]}")
        return self.url

    def counters(self) -> dict[str, float]:
        """Cumulative token counters from ``/metrics`` (Prometheus text format)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10.0).text
        found = re.findall(r"^minisgl_(prompt_tokens|cached_tokens)_total\s+(\S+)$", text, re.MULTILINE)
        return {name: float(value) for name, value in found}
