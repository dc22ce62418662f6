"""Prometheus metrics: latencies measured in the front end, engine counters from the scheduler's stats."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from minisgl.scheduler.stats import StatsSnapshot

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _SchedulerCollector(Collector):
    """Renders the latest ``StatsSnapshot`` pushed by the scheduler process at scrape time."""

    def __init__(self, stats: Callable[[], StatsSnapshot]) -> None:
        self.stats = stats

    def describe(self) -> list[Metric]:
        return []  # values come and go with the scheduler; nothing to pre-register

    def collect(self) -> Iterator[Metric]:
        snapshot = self.stats()
        s = snapshot.counters
        yield CounterMetricFamily("minisgl_prompt_tokens", "Prompt tokens of admitted requests", value=s.prompt_tokens)
        yield CounterMetricFamily(
            "minisgl_cached_tokens", "Prompt tokens reused from the prefix cache", value=s.cached_tokens
        )
        yield CounterMetricFamily("minisgl_prefill_tokens", "Tokens computed in prefill passes", value=s.prefill_tokens)
        yield CounterMetricFamily("minisgl_generated_tokens", "Tokens generated", value=s.generated_tokens)
        yield CounterMetricFamily("minisgl_prefill_seconds", "Wall time of prefill passes", value=s.prefill_seconds)
        yield CounterMetricFamily("minisgl_decode_seconds", "Wall time of decode steps", value=s.decode_seconds)
        yield CounterMetricFamily("minisgl_decode_steps", "Decode steps", value=s.decode_steps)
        yield GaugeMetricFamily("minisgl_cache_hit_rate", "cached_tokens / prompt_tokens since start", value=s.hit_rate)
        yield CounterMetricFamily(
            "minisgl_draft_tokens", "Speculative decoding: draft tokens verified", value=s.draft_tokens
        )
        yield CounterMetricFamily(
            "minisgl_accepted_draft_tokens", "Speculative decoding: draft tokens kept", value=s.accepted_draft_tokens
        )
        yield GaugeMetricFamily(
            "minisgl_draft_acceptance_rate", "accepted_draft_tokens / draft_tokens since start", value=s.acceptance_rate
        )
        yield GaugeMetricFamily(
            "minisgl_tokens_per_step", "Tokens a request gains per pass it is sampled in, since start",
            value=s.tokens_per_step,
        )  # fmt: skip
        yield GaugeMetricFamily("minisgl_running_requests", "Requests being prefilled or decoded", value=snapshot.running)
        yield GaugeMetricFamily("minisgl_waiting_requests", "Requests queued for admission", value=snapshot.waiting)
        kv = GaugeMetricFamily("minisgl_kv_tokens", "KV pool slots by state", labels=["state"])
        for state in ("capacity", "free", "evictable", "protected", "in_use"):
            if state in snapshot.kv:
                kv.add_metric([state], snapshot.kv[state])
        yield kv
        yield CounterMetricFamily(
            "minisgl_kv_evicted_tokens", "KV slots evicted from the prefix cache", value=snapshot.kv.get("evicted_total", 0)
        )
        if "window_capacity" in snapshot.kv:  # a model whose sliding-window layers have a pool of their own
            window = GaugeMetricFamily(
                "minisgl_window_kv_tokens", "Sliding-window layers' KV slots by state", labels=["state"]
            )
            for state in ("capacity", "free", "cached", "in_use"):
                window.add_metric([state], snapshot.kv[f"window_{state}"])
            yield window
            yield CounterMetricFamily(
                "minisgl_window_kv_evicted_tokens", "Cached tokens' sliding-window KV evicted",
                value=snapshot.kv["window_evicted_total"],
            )  # fmt: skip
        memory = GaugeMetricFamily("minisgl_memory_bytes", "Memory held by part (weights, KV pool, buffers)", labels=["part"])
        for part, size in snapshot.memory.items():
            memory.add_metric([part], size)
        yield memory


class ServerMetrics:
    def __init__(self, stats: Callable[[], StatsSnapshot]) -> None:
        # A registry of our own: no process-global state, several servers can live in one process.
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "minisgl_requests", "Finished requests by finish reason (abort: the client went away)",
            ["finish_reason"], registry=self.registry,
        )  # fmt: skip
        self.ttft = Histogram(
            "minisgl_time_to_first_token_seconds", "Request arrival to its first token",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.itl = Histogram(
            "minisgl_inter_token_latency_seconds", "Time between consecutive tokens of a request",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.registry.register(_SchedulerCollector(stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)
