"""One measured run (a system on a workload) and the figures derived from it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RunResult:
    system: str
    mode: str  # "offline" | "online"
    workload: str
    description: str
    requests: int
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int  # as the system reports (or, for llama.cpp, as its reuse rule implies)
    best_cached_tokens: int  # what an unlimited prefix cache could have served (benchmarks.hit_rate)
    duration_s: float
    texts: list[str] = field(repr=False)  # completions, for the agreement check; not saved
    latency: dict[str, dict[str, float]] = field(default_factory=dict)  # online: ttft/itl/tpot/e2e summaries
    ttft_s: list[float] = field(default_factory=list)  # online: every request's, for the distribution plot
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the server's /metrics counters
    others_cpu_s: float | None = None  # CPU time other processes took meanwhile (benchmarks.machine.OtherLoad)
    agreement: dict[str, Any] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def best_hit_rate(self) -> float:
        return self.best_cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def throughput(self) -> dict[str, float]:
        d = self.duration_s or float("nan")
        return {
            "requests_per_s": self.requests / d,
            "input_tokens_per_s": self.prompt_tokens / d,
            "output_tokens_per_s": self.output_tokens / d,
            "total_tokens_per_s": (self.prompt_tokens + self.output_tokens) / d,
        }

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        del record["texts"]
        return {**record, "hit_rate": self.hit_rate, "best_hit_rate": self.best_hit_rate, **self.throughput()}
