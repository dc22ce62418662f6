"""Systems under test, by name. Imports are deferred so that naming a system never loads the others."""

from __future__ import annotations

from benchmarks.systems.base import Completion, OfflineSystem, OnlineSystem, SystemOptions, Unavailable

# minisgl engine options by name: "minisgl" is the engine as shipped, each variant changes one option
# (a variant's dtype replaces the run's --dtype).
MINISGL_VARIANTS: dict[str, dict[str, str]] = {
    "minisgl": {"cache_type": "radix", "schedule_policy": "lpm"},
    "minisgl-naive": {"cache_type": "naive", "schedule_policy": "lpm"},
    "minisgl-fcfs": {"cache_type": "radix", "schedule_policy": "fcfs"},
    "minisgl-bf16": {"cache_type": "radix", "schedule_policy": "lpm", "dtype": "bfloat16"},
    "minisgl-fp32": {"cache_type": "radix", "schedule_policy": "lpm", "quantization": "none"},  # dense, token-exact
    "minisgl-nospec": {"cache_type": "radix", "schedule_policy": "lpm", "speculative_algorithm": "none"},
}
OFFLINE_SYSTEMS = (*MINISGL_VARIANTS, "hf", "hf-batch", "llama.cpp")


def make_system(name: str, opts: SystemOptions) -> OfflineSystem:
    """Raises ``Unavailable`` when the system cannot run on this machine or model."""
    if name in MINISGL_VARIANTS:
        from benchmarks.systems.minisgl_offline import MinisglSystem

        return MinisglSystem(name, opts)
    if name == "hf":
        from benchmarks.systems.hf import HFSystem

        return HFSystem(name, opts, batch_size=1)
    if name == "hf-batch":
        from benchmarks.systems.hf import HFSystem

        return HFSystem(name, opts, batch_size=opts.hf_batch_size)
    if name == "llama.cpp":
        from benchmarks.systems.llamacpp import LlamaCppSystem

        return LlamaCppSystem(name, opts)
    raise ValueError(f"unknown system {name!r}; choose from {', '.join(OFFLINE_SYSTEMS)}")


__all__ = [
    "MINISGL_VARIANTS",
    "OFFLINE_SYSTEMS",
    "Completion",
    "OfflineSystem",
    "OnlineSystem",
    "SystemOptions",
    "Unavailable",
    "make_system",
]
