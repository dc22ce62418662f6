"""A GGUF's weights as a dense Hugging Face folder, for the peers that load only folders (vLLM,
transformers): minisgl reads the GGUF in place and writes no weights, so the benchmarks write this
copy themselves, once, into their own cache (fp32: the file's values exactly)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from minisgl.models.gguf import gguf_model_folder
from minisgl.models.gguf_tensors import GGUFTensors

CACHE = Path(os.environ.get("MINISGL_BENCH_CACHE", Path.home() / ".cache" / "minisgl-bench")) / "dense"


def dense_folder(gguf: Path) -> Path:
    """The folder (config, tokenizer, ``model.safetensors``) of ``gguf``'s dequantized weights."""
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
        save_file({name: tensors.dense(name) for name in tensors.names()}, str(tmp / "model.safetensors"))
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
