"""Engine configuration: one dataclass shared by the offline API, the CLI and the server."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.attention.base import backend_names
from minisgl.kvcache.base import cache_types


@dataclass
class EngineConfig:
    model: str | None = None  # HF folder or GGUF file; None = the default SmolLM2 wheel
    dtype: str = "float32"  # float32 | bfloat16 | float16
    device: str = "auto"  # cpu | cuda | auto
    max_running_req: int = 64
    num_page_override: int | None = None  # KV pool size in pages; else from the memory budget
    kv_memory_gb: float = 1.0  # memory budget for the KV pool when num_page_override is unset
    max_seq_len_override: int | None = None  # context length; else the model's
    page_size: int = 1
    cache_type: str = "radix"  # naive | radix
    schedule_policy: str = "lpm"  # lpm | fcfs
    max_prefill_tokens: int = 2048  # token budget of one prefill batch (longer prompts are chunked)
    attention_backend: str = "torch"
    num_threads: int | None = None  # torch intra-op threads on CPU; None = all cores
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"device must be cpu, cuda or auto, got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' requested but CUDA is not available")
        for name in ("max_running_req", "page_size", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_page_override is not None and self.num_page_override < 1:
            raise ValueError(f"num_page_override must be >= 1, got {self.num_page_override}")
        if self.cache_type not in cache_types():
            raise ValueError(f"unknown cache_type {self.cache_type!r}; choose one of {cache_types()}")
        if self.attention_backend not in backend_names():
            raise ValueError(f"unknown attention backend {self.attention_backend!r}; choose one of {backend_names()}")
        if self.schedule_policy not in ("lpm", "fcfs"):
            raise ValueError(f"schedule_policy must be lpm or fcfs, got {self.schedule_policy!r}")

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)
