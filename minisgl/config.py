"""Engine configuration: one dataclass shared by the offline API, the CLI and the server.

Torch-free: the server's front end builds and checks it without loading the engine. The names of
prefix caches and attention backends are checked by their registries when the scheduler starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from minisgl.kernels.variants import check_kernel_choice
from minisgl.models.modes import check_mode
from minisgl.tuning import WINDOW_KV_RATIO

if TYPE_CHECKING:
    import torch


@dataclass
class EngineConfig:
    model: str | None = None  # HF folder or GGUF file; None = the default SmolLM2 wheel
    # A Jinja chat template in place of the model's (a base model's, a GGUF's that lacks or mangles one):
    # its text, or a file holding it (read here, so the text is what travels to every process)
    chat_template: str | None = None
    dtype: str = "float32"  # float32 | bfloat16 | float16
    # KV cache: auto = bfloat16 where weights are quantized (exactness is not asked for there), else
    # dtype; or float32 | bfloat16 | float16
    kv_dtype: str = "auto"
    # auto | none | int4 | int8: auto runs a quantized GGUF in its own precision (models/quantize.py)
    quantization: str = "auto"
    device: str = "auto"  # cpu | cuda | auto
    # CPU kernels: auto = minisgl's C kernels where they build for this CPU, else torch's; c = the C
    # kernels or an error; torch; c:avx512 | c:avxvnni | c:avx2 = that build (kernels/native.py)
    kernels: str = "auto"
    max_running_req: int = 64
    num_page_override: int | None = None  # KV pool size in pages; else from the memory budget
    kv_memory_gb: float = 1.0  # memory budget for the KV pool when num_page_override is unset
    max_seq_len_override: int | None = None  # context length; else the model's
    page_size: int = 1
    # Models with sliding-window layers: window KV slots per full KV slot (the windowed layers' pool
    # beside the full-attention layers'); 1 keeps every cached token's window KV, as full attention would
    window_kv_ratio: float = WINDOW_KV_RATIO
    cache_type: str = "radix"  # naive | radix
    schedule_policy: str = "lpm"  # lpm | fcfs
    # Token budget of one prefill pass (longer prompts are chunked); None: MAX_PREFILL_TOKENS, or fewer
    # for a model whose hidden size would make such a pass's activations large (``default_prefill_tokens``)
    max_prefill_tokens: int | None = None
    attention_backend: str = "torch"
    num_threads: int | None = None  # torch intra-op threads on CPU (per rank); None = all cores / ranks per node
    seed: int = 0
    jump_forward: bool = True  # constrained requests append the text their grammar forces without sampling it
    # ngram | none: decoding requests propose tokens copied from their own context or the radix tree,
    # verified together in one pass (scheduler/speculative.py). On by default: a draft is only as long
    # as its tokens pay for their rows of the pass, so where drafts fail it falls to an occasional probe.
    speculative_algorithm: str = "ngram"
    speculative_max_draft: int = 8  # most tokens proposed for one request in one pass
    speculative_ngram_min: int = 2  # shortest suffix of a request's tokens looked up in its earlier tokens
    speculative_ngram_max: int = 4  # longest (tried first)
    tp_size: int = 1  # tensor-parallel ranks in all (1: no process group at all)
    nnodes: int = 1  # machines the ranks are spread over (tp_size / nnodes ranks each)
    node_rank: int = 0  # this machine's index; node 0 runs the scheduler
    dist_init_addr: str | None = None  # host:port of node 0's rendezvous (required with nnodes > 1)

    def __post_init__(self) -> None:
        if self.chat_template is not None:
            self.chat_template = _template_text(self.chat_template)
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.kv_dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"kv_dtype must be auto, float32, bfloat16 or float16, got {self.kv_dtype!r}")
        check_mode(self.quantization)
        check_kernel_choice(self.kernels)
        if self.device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"device must be cpu, cuda or auto, got {self.device!r}")
        if self.device == "cuda":
            import torch  # only here: a CPU config is checked without torch

            if not torch.cuda.is_available():
                raise ValueError("device='cuda' requested but CUDA is not available")
        for name in ("max_running_req", "page_size", "max_prefill_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.window_kv_ratio <= 1:
            raise ValueError(f"window_kv_ratio must be in (0, 1], got {self.window_kv_ratio}")
        if self.num_page_override is not None and self.num_page_override < 1:
            raise ValueError(f"num_page_override must be >= 1, got {self.num_page_override}")
        if self.schedule_policy not in ("lpm", "fcfs"):
            raise ValueError(f"schedule_policy must be lpm or fcfs, got {self.schedule_policy!r}")
        if self.speculative_algorithm not in ("none", "ngram"):
            raise ValueError(f"speculative_algorithm must be none or ngram, got {self.speculative_algorithm!r}")
        for name in ("speculative_max_draft", "speculative_ngram_min"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.speculative_ngram_max < self.speculative_ngram_min:
            raise ValueError(
                f"speculative_ngram_max ({self.speculative_ngram_max}) must be >= "
                f"speculative_ngram_min ({self.speculative_ngram_min})"
            )
        for name in ("tp_size", "nnodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.tp_size % self.nnodes:
            raise ValueError(f"tp_size ({self.tp_size}) must be a multiple of nnodes ({self.nnodes})")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, {self.nnodes}), got {self.node_rank}")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("nnodes > 1 needs dist_init_addr (host:port of node 0)")
        if self.dist_init_addr is not None:
            host, _, port = self.dist_init_addr.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"dist_init_addr must be host:port, got {self.dist_init_addr!r}")

    @property
    def torch_device(self) -> torch.device:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def max_draft(self) -> int:
        """Most draft tokens one request verifies in a pass (0 without speculative decoding)."""
        return self.speculative_max_draft if self.speculative_algorithm != "none" else 0

    @property
    def tp_per_node(self) -> int:
        return self.tp_size // self.nnodes

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)

    def kv_torch_dtype(self, quantized: bool) -> torch.dtype:
        """The KV pool's dtype, for a model that runs quantized weights or not."""
        import torch

        if self.kv_dtype != "auto":
            return getattr(torch, self.kv_dtype)
        return torch.bfloat16 if quantized else self.torch_dtype


def _template_text(template: str) -> str:
    """A chat template given as a file's path (its text) or as the text itself (Jinja's markers in it)."""
    path = Path(template)
    try:
        if path.is_file():
            return path.read_text()
    except (OSError, ValueError):  # a template's text that is no valid path (too long a name, a NUL)
        pass
    if "{{" in template or "{%" in template:
        return template
    raise ValueError(f"chat_template must be a Jinja template or a file holding one; no file {template!r}")
