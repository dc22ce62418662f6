"""How llama.cpp runs on this CPU: the one rule, applied to llama-server and llama-cpp-python alike.

On a CPU with AMX (``amx_tile``, ``amx_int8`` or ``amx_bf16`` in /proc/cpuinfo), llama.cpp runs without
its extra buffer types: llama-server gets ``--no-repack``, llama-cpp-python's model parameters
``use_extra_bufts=False``. Built with ``-DGGML_NATIVE=ON`` there, llama.cpp puts the weights in its AMX
buffer type, whose kernel dies with SIGILL on the first prompt (seen on Intel Sapphire Rapids VMs);
without extra buffer types it runs its AVX-512 kernels. The same switch turns off weight repacking,
which llama.cpp has for some types (Q4_0, Q8_0, several K-quants) but not for the default model's
Q4_1. Elsewhere llama.cpp runs with its defaults.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from minisgl.kernels.variants import cpu_flags

if TYPE_CHECKING:
    from llama_cpp import Llama

AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")


def host_amx_flags() -> list[str]:
    """The AMX flags this CPU has (none: llama.cpp keeps its defaults)."""
    flags = cpu_flags()
    return [f for f in AMX_FLAGS if f in flags]


def extra_buffer_types_off() -> bool:
    """The rule: llama.cpp's extra buffer types (its AMX one among them) are off on AMX CPUs."""
    return bool(host_amx_flags())


def llama_server_flags() -> list[str]:
    return ["--no-repack"] if extra_buffer_types_off() else []


def llama_model_params() -> dict[str, bool]:
    """Fields of llama.cpp's ``llama_model_params`` that differ from its defaults here."""
    return {"use_extra_bufts": False} if extra_buffer_types_off() else {}


def rule_note() -> str:
    """What the rule does on this CPU, in a line for the setup's output."""
    amx = host_amx_flags()
    if not amx:
        return "this CPU has no AMX: llama.cpp runs with its defaults"
    return (
        f"this CPU has AMX ({' '.join(amx)}): llama.cpp runs without its extra buffer types "
        "(llama-server --no-repack, llama-cpp-python use_extra_bufts=False), as its AMX kernel dies with SIGILL"
    )


@contextlib.contextmanager
def _model_params_override(fields: dict[str, bool]) -> Iterator[None]:
    import llama_cpp.llama_cpp as native

    defaults = native.llama_model_default_params

    def with_fields() -> Any:
        params = defaults()
        for name, value in fields.items():
            setattr(params, name, value)
        return params

    native.llama_model_default_params = with_fields
    try:
        yield
    finally:
        native.llama_model_default_params = defaults


def load_llama(model_path: str, **kwargs: Any) -> Llama:
    """``llama_cpp.Llama(model_path, **kwargs)`` with this CPU's model parameters.

    ``Llama`` takes no argument for ``use_extra_bufts``: it fills the model parameters from
    ``llama_model_default_params()``, which is overridden for the call."""
    from llama_cpp import Llama

    fields = llama_model_params()
    with _model_params_override(fields):
        llm = Llama(model_path, **kwargs)
    wrong = {name: value for name, value in fields.items() if getattr(llm.model_params, name) != value}
    if wrong:  # a llama-cpp-python that builds its parameters another way: fail here, not with SIGILL later
        llm.close()
        raise RuntimeError(f"llama-cpp-python ignored the model parameters {wrong}")
    return llm
