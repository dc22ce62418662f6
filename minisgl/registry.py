"""Name → implementation tables (prefix caches, attention backends, model architectures)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A fixed table built where its implementations are imported, so looking a name up has no
    import-time side effects and needs no registration decorator."""

    def __init__(self, unknown: str, entries: Mapping[str, T]) -> None:
        self._unknown = unknown  # how an unknown name is reported, e.g. "unknown cache_type"
        self._entries = dict(entries)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise ValueError(f"{self._unknown} {name!r}; choose one of {self.names()}")
        return self._entries[name]
