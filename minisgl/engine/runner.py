"""How the scheduler's batches reach the engine: in this process, or broadcast to every
tensor-parallel rank first (``minisgl.parallel.runner``)."""

from __future__ import annotations

from typing import Protocol

from minisgl.batch import Batch
from minisgl.engine.engine import Engine
from minisgl.sampler import Sampled


class Runner(Protocol):
    engine: Engine  # this process's engine: its pool, page table and model config are the scheduler's

    def forward(self, batch: Batch) -> Sampled:
        """Run the batch everywhere it must run; the next token of each sampled row (CPU int64) and
        the rows whose own sampling failed. Raises if the pass itself fails (every request's error)."""
        ...

    def check_ranks(self) -> list[dict[str, int]]:
        """Every rank's KV report, rank 0 first (raises if they diverged); empty with one rank."""
        ...

    def shutdown(self) -> None:
        """Release what the runner started. Safe to call twice."""
        ...


class LocalRunner:
    """One rank: the engine in this process, nothing to broadcast, check or stop."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def forward(self, batch: Batch) -> Sampled:
        return self.engine.forward(batch)

    def check_ranks(self) -> list[dict[str, int]]:
        return []

    def shutdown(self) -> None:
        pass
