"""A GGUF's weights as a dense Hugging Face folder, for the peers that load only folders (vLLM,
transformers): minisgl reads the GGUF in place and writes no weights, so the benchmarks write this
copy themselves, once, into their own cache (fp32: the file's values exactly). A model past
``SHARD_BYTES`` of fp32 is written in shards with Hugging Face's index, one shard in memory at a time
(a 7B model's fp32 values are 29 GB)."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

from minisgl.models.gguf import gguf_model_folder
from minisgl.models.gguf_tensors import GGUFTensors

CACHE = Path(os.environ.get("MINISGL_BENCH_CACHE", Path.home() / ".cache" / "minisgl-bench")) / "dense"
SHARD_BYTES = 2 << 30


def dense_folder(gguf: Path, shard_bytes: int = SHARD_BYTES) -> Path:
    """The folder (config, tokenizer, ``model.safetensors`` or its shards and their index) of ``gguf``'s
    dequantized weights."""
    from safetensors.torch import save_file

    meta = gguf_model_folder(gguf)
    final = CACHE / meta.name  # keyed like the config folder: by the file's path, size and time
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        for item in meta.iterdir():
            shutil.copy(item, tmp / item.name)
        tensors = GGUFTensors(gguf)
        shards = _shards(tensors, shard_bytes)
        weight_map: dict[str, str] = {}
        for i, names in enumerate(shards, 1):
            file = "model.safetensors" if len(shards) == 1 else f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file({name: tensors.dense(name) for name in names}, str(tmp / file))
            weight_map |= dict.fromkeys(names, file)
        if len(shards) > 1:
            total = sum(_fp32_bytes(tensors, name) for name in weight_map)
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _fp32_bytes(tensors: GGUFTensors, name: str) -> int:
    return math.prod(tensors.shape(name)) * 4


def _shards(tensors: GGUFTensors, shard_bytes: int) -> list[list[str]]:
    """The tensors' names in the file's order, cut into runs of at most ``shard_bytes`` of fp32 (a
    larger tensor alone)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name in tensors.names():
        nbytes = _fp32_bytes(tensors, name)
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards
