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
    prefill_tokens: int = 0  # prompt tokens actually computed
    generated_tokens: int = 0
    finished_requests: int = 0
    forward_passes: int = 0  # of any kind
    # A pass that computes prompt tokens is a prefill pass; one that computes none is a decode step,
    # whatever its attention (after a jump-forward a request computes several tokens in a step).
    prefill_seconds: float = 0.0  # wall time of prefill passes, decode tokens riding along included
    prefill_decode_tokens: int = 0  # tokens of decoding requests riding along prefill passes
    decode_seconds: float = 0.0  # wall time of decode steps (forward and sampling)
    decode_steps: int = 0
    # tokens computed by decode steps: one per request, more after a jump-forward or with a draft
    decode_tokens: int = 0
    decode_kv_tokens: int = 0  # KV entries attended over all decode steps (what decode reads)
    samples: int = 0  # times a request was sampled: once per pass each, with or without a draft
    draft_tokens: int = 0  # speculative decoding: draft tokens verified
    accepted_draft_tokens: int = 0  # of those, kept as output

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens a request gains per pass it is sampled in (jump-forward aside): 1 without speculation."""
        return (self.samples + self.accepted_draft_tokens) / self.samples if self.samples else 0.0

    def record_pass(
        self, prefill_tokens: int, decode_tokens: int, kv_tokens: int, samples: int, seconds: float
    ) -> None:
        """Book one forward pass by what its requests computed: ``prefill_tokens`` prompt tokens,
        ``decode_tokens`` after the prompt, attending ``kv_tokens`` KV entries in all; ``samples``
        requests were sampled."""
        self.forward_passes += 1
        self.samples += samples
        if prefill_tokens:
            self.prefill_seconds += seconds
            self.prefill_tokens += prefill_tokens
            self.prefill_decode_tokens += decode_tokens
        else:
            self.decode_seconds += seconds
            self.decode_steps += 1
            self.decode_tokens += decode_tokens
            self.decode_kv_tokens += kv_tokens


class StatsSnapshot(msgspec.Struct, tag=True):
    """The counters and the gauges at one moment."""

    counters: EngineStats = msgspec.field(default_factory=EngineStats)
    running: int = 0
    waiting: int = 0
    kv: dict[str, int] = {}  # KV pool slots by state (Scheduler.kv_usage)
    memory: dict[str, int] = {}  # bytes by part: weights, kv_pool, dequant_buffer (Engine.memory)

    def as_dict(self) -> dict[str, Any]:
        """Flat: every counter, ``hit_rate``, ``acceptance_rate``, ``tokens_per_step``, ``running``,
        ``waiting``, ``kv_<state>`` and ``memory_<part>_bytes``."""
        return {
            **asdict(self.counters),
            "hit_rate": self.counters.hit_rate,
            "acceptance_rate": self.counters.acceptance_rate,
            "tokens_per_step": self.counters.tokens_per_step,
            "running": self.running,
            "waiting": self.waiting,
            **{f"kv_{k}": v for k, v in self.kv.items()},
            **{f"memory_{k}_bytes": v for k, v in self.memory.items()},
        }
