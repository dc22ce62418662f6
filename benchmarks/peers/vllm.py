"""vLLM's CPU build, in its own virtualenv, on the Hugging Face folder of the same weights.

Configuration (vLLM's CPU documentation): ``VLLM_CPU_KVCACHE_SPACE`` GiB of KV cache,
``VLLM_CPU_OMP_THREADS_BIND`` pinning its threads to the run's first cores, prefix caching and
chunked prefill on (its V1 engine's defaults, also given explicitly), ``--enable-prompt-tokens-details``
so responses report cached prompt tokens, and ``VLLM_SERVER_DEV_MODE=1`` for ``/reset_prefix_cache``,
which empties the cache before each workload. bfloat16 where the CPU has AVX-512, which vLLM's CPU kernels are
written for, float32 elsewhere (``fastest_dtype``).
"""

from __future__ import annotations

from benchmarks.peers.paths import SETUP_COMMAND, VLLM_CPU_VERSION, vllm_python
from benchmarks.server import ServerProcess, WarmServer
from benchmarks.systems.base import SystemOptions, Unavailable
from minisgl.kernels.variants import cpu_flags

STARTUP_TIMEOUT_S = 1800.0  # it compiles (torch.compile) and warms up at start: over 15 min on 2 busy cores


def fastest_dtype(flags: frozenset[str] | None = None) -> str:
    """vLLM's fastest ``--dtype`` on a CPU with ``flags`` (this one's by default): bfloat16 with AVX-512, which
    its CPU kernels are written for; float32 without, where its bf16 bursts ran 5x slower than fp32's on the
    2-core Zen 3 VM (docs/benchmarks/session48-amd/notes.md)."""
    return "bfloat16" if "avx512f" in (cpu_flags() if flags is None else flags) else "float32"


class VllmServer(WarmServer):
    flush_path = "/reset_prefix_cache"

    def __init__(self, opts: SystemOptions, kv_cache_gib: float, dtype: str = "auto") -> None:
        if opts.device not in ("cpu", "auto"):
            raise Unavailable("the vLLM peer is its CPU build")
        if not vllm_python().is_file():
            raise Unavailable(f"{vllm_python()} is missing: run {SETUP_COMMAND}")
        self.name = "vllm"
        self.env = {
            "VLLM_CPU_KVCACHE_SPACE": f"{kv_cache_gib:g}",
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{opts.threads - 1}",
            "VLLM_SERVER_DEV_MODE": "1",
        }
        dtype = fastest_dtype() if dtype == "auto" else dtype
        self.flags = [
            "--model", str(opts.hf_folder), "--dtype", dtype, "--max-model-len", str(opts.max_seq_len),
            "--enable-prefix-caching", "--enable-chunked-prefill", "--enable-prompt-tokens-details",
        ]  # fmt: skip
        settings = " ".join(f"{k}={v}" for k, v in self.env.items())
        self.description = f"vllm-cpu {VLLM_CPU_VERSION}, {settings}, " + " ".join(self.flags[2:])
        self.server = ServerProcess(self._command, env=self.env, timeout_s=STARTUP_TIMEOUT_S)

    def _command(self, port: int) -> list[str]:
        module = "vllm.entrypoints.openai.api_server"  # the `vllm` command fails: the dist is named vllm-cpu
        return [str(vllm_python()), "-m", module, "--host", "127.0.0.1", "--port", str(port), *self.flags]

    def counters(self) -> dict[str, float]:
        return {}  # cached prompt tokens come with each response's usage
