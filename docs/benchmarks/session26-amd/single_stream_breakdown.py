"""The harness's single-stream workload (4 prompts one after another, 128 tokens out each) offline and through
the server, alternating for 4 rounds: each round's walls, their ratio, and the server's time to first
token per request and mean time per output token after it.

Run from the repository root: PYTHONPATH=. python docs/benchmarks/session26-amd/single_stream_breakdown.py"""

import argparse

from transformers import AutoTokenizer

from benchmarks.cli import add_size_arguments, sizes_of
from benchmarks.machine import wait_for_quiet
from benchmarks.offline import run_offline, warm_up
from benchmarks.online import run_online
from benchmarks.online_systems import minisgl_variant
from benchmarks.scale_model import gguf_of, resolve_scale_model
from benchmarks.systems import SystemOptions, make_system
from benchmarks.workloads import build
from minisgl.models.source import resolve_model_path

parser = argparse.ArgumentParser()
add_size_arguments(parser)
args = parser.parse_args([])
model = resolve_scale_model(None)
folder = resolve_model_path(model)
tokenizer = AutoTokenizer.from_pretrained(str(folder))
workload = build(["single-stream"], tokenizer, sizes_of(args), 0, "text")[0]
opts = SystemOptions(
    model=model, gguf=gguf_of(model), threads=2, hf_folder=folder, max_seq_len=workload.max_seq_len() + 64
)
offline = make_system("minisgl", opts)
warm_up(offline, len(tokenizer))
served = argparse.Namespace(model=model, dtype="float32", device="auto", threads=2)
with minisgl_variant("minisgl", served)() as server:
    for _ in range(4):
        wait_for_quiet()
        o = run_offline(offline, workload, tokenizer)
        url = server.fresh()
        wait_for_quiet()
        s = run_online(server, url, workload, tokenizer)
        print(
            f"offline {o.duration_s:.3f} s, server {s.duration_s:.3f} s ({o.duration_s / s.duration_s:.3f}); "
            f"server TTFT {[round(x * 1e3) for x in s.ttft_s]} ms, "
            f"time per output token {s.latency['tpot_s']['mean'] * 1e3:.2f} ms",
            flush=True,
        )
offline.close()
