"""minisgl: a small LLM serving engine with a radix-tree prefix cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

from minisgl.sampling import SamplingParams

if TYPE_CHECKING:
    from minisgl.llm import LLM

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str) -> object:
    """``minisgl.LLM`` on first use: it loads torch and the engine, which importing any part of the
    package (the server's front end, the CLI's flags) must not."""
    if name == "LLM":
        from minisgl.llm import LLM

        return LLM
    raise AttributeError(f"module 'minisgl' has no attribute {name!r}")
