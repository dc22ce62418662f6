"""The stats record: the scheduler's counters, and the snapshot with its gauges that ``LLM.stats()``,
the server's ``/metrics`` and the benchmarks read (sent as is from the scheduler process)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import msgspec


@dataclass
class EngineStats:
    """Cumulative counters since start (the benchmarks subtract two readings)."""

    prompt_tokens: int = 0  # prompt tokens of every admitted request
    cached_tokens: int = 0  # of those, reused from the prefix cache
    prefill_tokens: int = 0  # tokens actually computed in prefill passes
    generated_tokens: int = 0
    finished_requests: int = 0
    forward_passes: int = 0  # of any kind (a jump-forward's extend pass too)
    prefill_seconds: float = 0.0  # wall time of prefill passes, decode tokens riding along included
    decode_seconds: float = 0.0  # wall time of decode-only passes (forward and sampling)
    decode_steps: int = 0
    decode_tokens: int = 0  # tokens sampled by decode-only passes
    decode_kv_tokens: int = 0  # KV entries attended over all decode steps (what decode reads)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class StatsSnapshot(msgspec.Struct, tag=True):
    """The counters and the gauges at one moment."""

    counters: EngineStats = msgspec.field(default_factory=EngineStats)
    running: int = 0
    waiting: int = 0
    kv: dict[str, int] = {}  # KV pool slots by state (Scheduler.kv_usage)

    def as_dict(self) -> dict[str, Any]:
        """Flat: every counter, ``hit_rate``, ``running``, ``waiting`` and ``kv_<state>``."""
        return {
            **asdict(self.counters),
            "hit_rate": self.counters.hit_rate,
            "running": self.running,
            "waiting": self.waiting,
            **{f"kv_{k}": v for k, v in self.kv.items()},
        }
