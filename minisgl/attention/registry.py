"""The attention backends by name (``EngineConfig.attention_backend``)."""

from __future__ import annotations

from minisgl.attention.base import AttentionBackend
from minisgl.attention.torch_backend import TorchAttentionBackend
from minisgl.registry import Registry

ATTENTION_BACKENDS: Registry[type[AttentionBackend]] = Registry(
    "unknown attention backend", {"torch": TorchAttentionBackend}
)

