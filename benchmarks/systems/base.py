"""What the offline runner needs from a system under test."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self


@dataclass(frozen=True)
class Completion:
    output_ids: list[int]
    cached_tokens: int  # prompt tokens this system reused from earlier requests


@dataclass(frozen=True)
class SystemOptions:
    """Shared by every system so they all run the same model with the same resources."""

    model: str | None  # as given on the command line: GGUF file, HF folder, or None (default model)
    hf_folder: Path  # the same weights as a Hugging Face folder
    gguf: Path | None  # the same weights as GGUF, when there is one
    threads: int
    dtype: str = "float32"
    device: str = "auto"
    hf_batch_size: int = 8
    max_seq_len: int = 2048  # longest prompt + output of the workloads, for systems that preallocate


class Unavailable(Exception):
    """The system cannot run here (missing package, wrong model format); the run skips it."""


class OfflineSystem(Protocol):
    name: str
    description: str

    def generate(self, prompts: list[list[int]], output_len: int) -> list[Completion]:
        """Greedy completions of exactly ``output_len`` tokens each (end of sequence ignored)."""
        ...

    def reset(self) -> None:
        """Forget every cached prefix."""
        ...

    def close(self) -> None: ...


class OnlineSystem(Protocol):
    """A server loaded over HTTP. ``with system:`` starts it and warms it up; ``fresh()`` then empties
    its caches before each workload and returns the address to load; ``pid`` is its process (its
    CPU time is the run's own, not other processes')."""

    name: str
    description: str

    def __enter__(self) -> Self: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    def fresh(self) -> str: ...

    @property
    def pid(self) -> int: ...

    def counters(self) -> dict[str, float]:
        """The server's cumulative token counters (``prompt_tokens``, ``cached_tokens``); {} when it has none."""
        ...
