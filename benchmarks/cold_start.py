"""Start to first token: a fresh Python process that imports minisgl, loads a model and generates one
token; with ``--server``, ``python -m minisgl serve`` from its start until ``/health`` answers 200.
*First ever*: with an empty cache folder (the GGUF's config and tokenizer written, the C kernels
compiled); *cached*: the best of a few runs after it. Also the peak resident memory (the server's:
of all its processes, summed), and what the cache folder holds afterwards (minisgl writes no weights).

Run: python -m benchmarks.cold_start [--model PATH | --model scale-1.7b] [--runs 3] [--kv-memory-gb 1] [--server]
(or another scale model's name: scale-1.7b-qwen3, scale-1.5b-qwen2, scale-7b; ``benchmarks/scale_model.py``)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from benchmarks.machine import code_path, first_writes, load_average, machine_info, tree_peak_rss
from benchmarks.scale_model import SCALE_MODELS, resolve_scale_model
from benchmarks.server import STARTUP_TIMEOUT_S, free_port

# The last line it prints is its own peak resident KiB (RUSAGE_CHILDREN would give the largest of every run).
SCRIPT = (
    "import resource, sys; from minisgl import LLM, SamplingParams; "
    "LLM(sys.argv[1] or None, kv_memory_gb=float(sys.argv[2])).generate(['Hello'], SamplingParams(max_tokens=1), use_tqdm=False); "
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
)


def start(model: str, kv_gb: float, cache: Path) -> tuple[float, int]:
    """Seconds to the first token, and the process's peak resident bytes."""
    begin = time.perf_counter()
    env = {**os.environ, "MINISGL_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, model, str(kv_gb)], check=True, capture_output=True, env=env)
    return time.perf_counter() - begin, int(done.stdout.split()[-1]) * 1024


def start_server(model: str, kv_gb: float, cache: Path) -> tuple[float, int]:
    """Seconds from ``python -m minisgl serve`` to a 200 from ``/health``, and the peak resident bytes
    of its processes until then."""
    port = free_port()
    command = [sys.executable, "-m", "minisgl", "serve", "--port", str(port), "--kv-memory-gb", str(kv_gb)]
    command += ["--model", model] if model else []
    env = {**os.environ, "MINISGL_CACHE_DIR": str(cache)}
    begin = time.perf_counter()
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - begin < STARTUP_TIMEOUT_S:
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with code {server.returncode} while starting")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                    if response.status == 200:
                        return time.perf_counter() - begin, tree_peak_rss(server.pid) or 0
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the server was not healthy after {STARTUP_TIMEOUT_S:.0f} s")
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        default="",
        help=f"GGUF file or folder (default: the default model), or one of {', '.join(SCALE_MODELS)}",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kv-memory-gb", type=float, default=1.0)
    parser.add_argument("--server", action="store_true", help="time the server to healthy instead")
    args = parser.parse_args()
    model = resolve_scale_model(args.model) or ""
    run = start_server if args.server else start
    what = "server to /health" if args.server else "offline to the first token"
    print(
        f"# {machine_info(os.cpu_count() or 1)['cpu']}; {code_path()}; {what}; model {model or 'default'}; load at start "
        f"{load_average()}; {first_writes()}"
    )
    with tempfile.TemporaryDirectory(prefix="minisgl-cold-") as folder:
        cache = Path(folder)
        first, first_peak = run(model, args.kv_memory_gb, cache)
        written = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file() and "kernels" not in p.parts)
        runs = [run(model, args.kv_memory_gb, cache) for _ in range(args.runs)]
    times = [t for t, _ in runs]
    peak = max(p for _, p in runs) / 2**30
    print(
        f"first ever {first:.2f} s; cached: best {min(times):.2f} s, runs {[round(t, 2) for t in times]}; "
        f"peak memory {first_peak / 2**30:.2f} GiB first ever, {peak:.2f} GiB cached (KV pool {args.kv_memory_gb} GiB); "
        "written to the cache besides the kernels "
        f"{written / 2**20:.1f} MiB; load at end {load_average()}; {first_writes()}"
    )


if __name__ == "__main__":
    main()
