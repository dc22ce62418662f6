"""Start to first token: a fresh Python process that imports minisgl, loads a model and generates one
token. *First ever*: with an empty cache folder (the GGUF's config and tokenizer written, the C
kernels compiled); *cached*: the best of a few runs after it. Also the peak resident memory of the
process, and what the cache folder holds afterwards (minisgl writes no weights).

Run: python -m benchmarks.cold_start [--model PATH | --model scale-1.7b] [--runs 3] [--kv-memory-gb 1]
(or another scale model's name: scale-1.7b-qwen3, scale-1.5b-qwen2; ``benchmarks/scale_model.py``)
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import load_average, machine_info
from benchmarks.scale_model import SCALE_MODELS, resolve_scale_model

SCRIPT = (
    "import sys; from minisgl import LLM, SamplingParams; "
    "LLM(sys.argv[1] or None, kv_memory_gb=float(sys.argv[2])).generate(['Hello'], SamplingParams(max_tokens=1), use_tqdm=False)"
)


def start(model: str, kv_gb: float, cache: Path) -> float:
    begin = time.perf_counter()
    env = {**os.environ, "MINISGL_CACHE_DIR": str(cache)}
    subprocess.run([sys.executable, "-c", SCRIPT, model, str(kv_gb)], check=True, capture_output=True, env=env)
    return time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        default="",
        help=f"GGUF file or folder (default: the default model), or one of {', '.join(SCALE_MODELS)}",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kv-memory-gb", type=float, default=1.0)
    args = parser.parse_args()
    model = resolve_scale_model(args.model) or ""
    print(f"# {machine_info(os.cpu_count() or 1)['cpu']}; model {model or 'default'}; load at start {load_average()}")
    with tempfile.TemporaryDirectory(prefix="minisgl-cold-") as folder:
        cache = Path(folder)
        first = start(model, args.kv_memory_gb, cache)
        written = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file() and "kernels" not in p.parts)
        times = [start(model, args.kv_memory_gb, cache) for _ in range(args.runs)]
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
    print(
        f"first ever {first:.2f} s; cached: best {min(times):.2f} s, runs {[round(t, 2) for t in times]}; "
        f"peak memory {peak:.2f} GiB (KV pool {args.kv_memory_gb} GiB); written to the cache besides the kernels "
        f"{written / 2**20:.1f} MiB; load at end {load_average()}"
    )


if __name__ == "__main__":
    main()
