"""minisgl: a small LLM serving engine with a radix-tree prefix cache."""

from minisgl.llm import LLM
from minisgl.sampling import SamplingParams

__all__ = ["LLM", "SamplingParams"]
