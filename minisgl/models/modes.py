"""The quantization modes a model loads in (``EngineConfig.quantization``; ``quantize.py`` says what
each does). Torch-free, so that a flag or a config is checked without loading torch."""

from __future__ import annotations

QUANTIZATION_MODES = ("auto", "none", "int4", "int8")


def check_mode(mode: str) -> None:
    if mode not in QUANTIZATION_MODES:
        raise ValueError(f"unknown quantization {mode!r}; choose one of {', '.join(QUANTIZATION_MODES)}")
