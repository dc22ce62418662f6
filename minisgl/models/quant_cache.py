"""Quantized weights of a GGUF model, cached on disk: building them reads the whole file (its
metadata alone takes seconds to parse) and re-rounds every weight, so it is done once per file,
mode and tensor-parallel shard, like the HF folder conversion (``gguf.py``)."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from minisgl.layers.quant import WEIGHT_CLASSES, QuantizedWeight
from minisgl.models.gguf import _cache_key, _cache_root

logger = logging.getLogger("minisgl.quantize")

# Bump when the stored layout of a quantized weight changes.
_FORMAT_VERSION = 2

Plan = dict[str, QuantizedWeight]


def cache_file(gguf_file: Path, mode: str, rank: int, size: int, cache_root: Path | None = None) -> Path:
    name = f"{_cache_key(gguf_file.resolve())}-{mode}-v{_FORMAT_VERSION}-tp{rank}of{size}.safetensors"
    return _cache_root(cache_root) / "quantized" / name


def cached_plan(path: Path, build: Callable[[], tuple[Plan, str]]) -> tuple[Plan, str]:
    """The plan stored at ``path``, or ``build()``'s (plan, summary), stored there first."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    if path.is_file():
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata()
            classes: dict[str, str] = json.loads(meta["classes"])
            states: dict[str, dict[str, torch.Tensor]] = {module: {} for module in classes}
            for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                module, _, buffer = key.rpartition(".")
                states[module][buffer] = f.get_tensor(key)
            plan: Plan = {m: WEIGHT_CLASSES[c](**states[m]) for m, c in classes.items()}
        return plan, f"{meta['summary']} (cached in {path})"
    plan, summary = build()
    tensors = {f"{m}.{k}": t.contiguous() for m, w in plan.items() for k, t in w.state_dict().items()}
    metadata = {"classes": json.dumps({m: type(w).__name__ for m, w in plan.items()}), "summary": summary}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.replace(tmp, path)  # atomic: a file at ``path`` is always complete
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return plan, summary
