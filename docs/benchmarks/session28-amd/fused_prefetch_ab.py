"""Session 28: quant_gemm.c's PREFETCH distance in the real decode step (the 1.7B scale model by
default). One LLM per distance (each built from a copy of the sources with that distance), all loaded
at once; per round, a streaming read of memory, then each LLM in turn (order rotated) decodes one
request, and the fused layers' C call (every layer's products, attention and norms) is timed per step.
Prints per round the read and, per distance, the layers' weight bytes over the call's median time, so
that rounds in this VM's fast read mode (55-65 GB/s) and its slow one (25-35 GB/s) can be told apart.

    PYTHONPATH=. python docs/benchmarks/session28-amd/fused_prefetch_ab.py [--rounds 12] [--model scale-1.7b]
        [--distances 2048 4096]
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.hardware_peak import memory_bandwidth
from benchmarks.machine import machine_info
from benchmarks.scale_model import resolve_scale_model
from minisgl import LLM, SamplingParams
from minisgl.kernels import native


def patched_sources(root: Path, name: str, patch: Callable[[str], str]) -> Path:
    """A copy of the kernels' sources in ``root / name`` with quant_gemm.c's text passed through ``patch``."""
    source = root / name
    shutil.copytree(native.SOURCE_DIR, source)
    path = source / "quant_gemm.c"
    path.write_text(patch(path.read_text()))
    return source


def sources_with_prefetch(distance: int, root: Path) -> Path:
    def patch(text: str) -> str:
        patched, found = re.subn(r"#define PREFETCH \d+", f"#define PREFETCH {distance}", text)
        if found != 1:
            raise ValueError("quant_gemm.c has no single #define PREFETCH")
        return patched

    return patched_sources(root, f"prefetch{distance}", patch)


def llm_from(model: str | None, source: Path) -> LLM:
    """One request at a time, speculation off, its C kernels built from ``source``."""
    original = native.SOURCE_DIR
    native.SOURCE_DIR = source
    native.load_variant.cache_clear()
    try:
        return LLM(resolve_scale_model(model), max_running_req=1, cache_type="naive", num_page_override=300,
                   speculative_algorithm="none")  # fmt: skip
    finally:
        native.SOURCE_DIR = original
        native.load_variant.cache_clear()


def timed_calls(llm: LLM) -> list[float]:
    fused = llm.scheduler.engine.model._fused_decoder
    run = fused.run
    calls: list[float] = []

    def timed(*args: Any) -> Any:
        start = time.perf_counter()
        result = run(*args)
        calls.append(time.perf_counter() - start)
        return result

    fused.run = timed
    return calls


def kernels_of(llm: LLM) -> str:
    kernels = llm.scheduler.engine.kernels
    return f"C kernels {kernels.variant.description}" if kernels is not None else "torch's kernels (no C kernels)"


def layer_bytes(llm: LLM) -> int:
    """The quantized buffers of the decoder layers: what the fused call streams per step."""
    layers = llm.scheduler.engine.model.model.layers
    return sum(b.numel() * b.element_size() for layer in layers for name, b in layer.named_buffers()
               if name.rsplit(".", 1)[-1] in ("codes", "scale", "minimum"))  # fmt: skip


def race(llms: dict[str, LLM], rounds: int) -> None:
    """Per round a streaming read, then each LLM (order rotated) decodes one request; prints the layers'
    GB/s per LLM over its fused call's median time. Shuts the LLMs down at the end."""
    names = list(llms)
    calls = {n: timed_calls(llm) for n, llm in llms.items()}
    nbytes = layer_bytes(llms[names[0]])
    print(f"# {machine_info(torch.get_num_threads())['cpu']}, {torch.get_num_threads()} threads; "
          f"{nbytes / 1e6:.0f} MB of layer weights per step; {kernels_of(llms[names[0]])}")  # fmt: skip
    prompt = list(range(100, 164))
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    for llm in llms.values():
        llm.generate([prompt], params, use_tqdm=False)  # warm-up
    print("| round | read GB/s | " + " | ".join(f"{n}: layers GB/s" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for r in range(rounds):
        read = memory_bandwidth(0.5) / 1e9
        rates = {}
        for n in names[r % len(names) :] + names[: r % len(names)]:
            llms[n].flush_cache()
            calls[n].clear()
            llms[n].generate([prompt], params, use_tqdm=False)
            rates[n] = nbytes / statistics.median(calls[n]) / 1e9
        print(f"| {r} | {read:.1f} | " + " | ".join(f"{rates[n]:.1f}" for n in names) + " |", flush=True)
    for llm in llms.values():
        llm.shutdown()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--model", default="scale-1.7b", help="a scale model's name, or none for the default model")
    p.add_argument("--distances", type=int, nargs="+", default=[2048, 4096])
    args = p.parse_args()
    model = None if args.model == "none" else args.model
    with tempfile.TemporaryDirectory() as tmp:
        race(
            {f"PREFETCH {d}": llm_from(model, sources_with_prefetch(d, Path(tmp))) for d in args.distances}, args.rounds
        )


if __name__ == "__main__":
    main()
