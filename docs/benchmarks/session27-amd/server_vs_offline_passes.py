"""The harness's single-stream workload offline and through the server, alternating: each run's wall, its
decode steps and their seconds (the engine's own counters: LLM.stats() offline, /debug/radix's stats through
the server), prefill seconds, passes, drafted and accepted tokens, and the wall outside the passes.

Run from the repository root: PYTHONPATH=. python docs/benchmarks/session27-amd/server_vs_offline_passes.py minisgl 4
(or minisgl-nospec)."""

import argparse
import sys

import httpx
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

variant = sys.argv[1]
rounds = int(sys.argv[2])
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
offline = make_system(variant, opts)
warm_up(offline, len(tokenizer))
served = argparse.Namespace(model=model, dtype="float32", device="auto", threads=2)
K = [
    "decode_steps",
    "decode_seconds",
    "prefill_seconds",
    "forward_passes",
    "draft_tokens",
    "accepted_draft_tokens",
    "generated_tokens",
]


def show(name, r, a, b):
    d = {k: b[k] - a[k] for k in K}
    print(
        f"{name:8s} wall {r.duration_s:.3f} steps {d['decode_steps']} dec {d['decode_seconds']:.3f}s ({d['decode_seconds'] / max(1, d['decode_steps']) * 1e3:.2f} ms/step) pre {d['prefill_seconds']:.3f} passes {d['forward_passes']} draft {d['draft_tokens']} acc {d['accepted_draft_tokens']} gen {d['generated_tokens']} outside {r.duration_s - d['decode_seconds'] - d['prefill_seconds']:.3f}",
        flush=True,
    )


with minisgl_variant(variant, served)() as server:
    stats = lambda: httpx.get(server.url + "/debug/radix", timeout=10).json()["stats"]
    for _ in range(rounds):
        wait_for_quiet()
        a = offline.llm.stats()
        o = run_offline(offline, workload, tokenizer)
        show("offline", o, a, offline.llm.stats())
        url = server.fresh()
        wait_for_quiet()
        a = stats()
        s = run_online(server, url, workload, tokenizer)
        show("server", s, a, stats())
offline.close()
