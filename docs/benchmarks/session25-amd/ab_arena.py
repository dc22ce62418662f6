# One process, two engines on the same model, alternating: the quantized weights as session 24 loaded
# them (each buffer of 4 MiB or more advised MADV_HUGEPAGE on its own) and moved into a huge-page arena
# as they are built (minisgl.heap.HugePageArena, the loader's).
# python ab_arena.py MODEL ROUNDS: one user's decode (128 tokens after a 64-token prompt), 16 users' (16
# random 64-token prompts, 32 tokens each, their prefill's time taken out), and the prefill of those 16 prompts.
# python ab_arena.py MODEL ROUNDS walls: the paired benchmark's random workload, offline (16 random 256-token
# prompts, 32 tokens each): its wall.
import ctypes
import mmap
import random
import statistics
import sys
import time

import torch

from benchmarks.scale_model import resolve_scale_model
from minisgl import LLM, SamplingParams
from minisgl.layers.quant import INT4_GROUP, QUANT_TILE, Int4Weight, Int8Weight
from minisgl.models import loader

libc = ctypes.CDLL("libc.so.6")
def advise(t):  # session 24's minisgl.heap.advise_huge_pages
    n = t.numel() * t.element_size()
    if n >= 4 << 20:
        start = t.data_ptr() // 4096 * 4096
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(t.data_ptr() + n - start), mmap.MADV_HUGEPAGE)
    return t
def empty4(cls, out_features, in_features):  # session 24's Int4Weight.empty
    tiles = -(-out_features // QUANT_TILE)
    codes = advise(torch.empty(tiles, in_features * 8, dtype=torch.uint8))
    scale, minimum = (advise(torch.empty(tiles, in_features // 2, dtype=torch.float16)) for _ in range(2))
    for b in (codes, scale, minimum): b[-1:].zero_()
    return cls(codes, scale, minimum, out_features)
def empty8(cls, out_features, in_features):  # session 24's Int8Weight.empty
    tiles, padded_in = -(-out_features // QUANT_TILE), -(-in_features // INT4_GROUP) * INT4_GROUP
    codes = advise(torch.empty(tiles, QUANT_TILE * padded_in, dtype=torch.int8)).zero_()
    return cls(codes, torch.zeros(tiles * QUANT_TILE), out_features, in_features)

model = sys.argv[1]
kwargs = {"speculative_algorithm": "none"}
def load():
    return LLM(**kwargs) if model == "default" else LLM(resolve_scale_model(model), **kwargs)
arena, e4, e8 = loader.HugePageArena, Int4Weight.__dict__["empty"], Int8Weight.__dict__["empty"]
loader.HugePageArena, Int4Weight.empty, Int8Weight.empty = lambda: None, classmethod(empty4), classmethod(empty8)
engines = {"per buffer": load()}
loader.HugePageArena, Int4Weight.empty, Int8Weight.empty = arena, e4, e8
engines["arena"] = load()
with open("/proc/self/smaps_rollup") as smaps:
    print("AnonHugePages of the process:", next(l.split()[1] for l in smaps if "AnonHuge" in l), "kB")
rng = random.Random(0)
one = [rng.randrange(1000, 40000) for _ in range(64)]
many = [[rng.randrange(1000, 40000) for _ in range(64)] for _ in range(16)]
def run(llm):
    llm.flush_cache(); t = time.perf_counter()
    llm.generate([one], SamplingParams(max_tokens=129, ignore_eos=True), use_tqdm=False)
    single = 128 / (time.perf_counter() - t)
    llm.flush_cache(); t = time.perf_counter(); llm.generate(many, SamplingParams(max_tokens=1), use_tqdm=False); pre = time.perf_counter() - t
    llm.flush_cache(); t = time.perf_counter(); llm.generate(many, SamplingParams(max_tokens=33, ignore_eos=True), use_tqdm=False)
    return single, 16 * 32 / (time.perf_counter() - t - pre), 16 * 64 / pre
for llm in engines.values():
    llm.generate([one], SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
results = {name: [] for name in engines}
walls = sys.argv[3:] == ["walls"]
def wall(llm):
    llm.flush_cache(); t = time.perf_counter()
    prompts = [[rng.randrange(1000, 40000) for _ in range(256)] for _ in range(16)]
    llm.generate(prompts, SamplingParams(max_tokens=32, ignore_eos=True), use_tqdm=False)
    return (time.perf_counter() - t,)
if walls:
    for llm in engines.values():
        wall(llm)
for r in range(int(sys.argv[2])):
    for name in list(engines) if r % 2 == 0 else list(engines)[::-1]:
        results[name].append(wall(engines[name]) if walls else run(engines[name]))
        if walls:
            print(f"round {r + 1} {name:10s} wall {results[name][-1][0]:.2f} s", flush=True)
        else:
            s, m, p = results[name][-1]
            print(f"round {r + 1} {name:10s} one user {s:.1f} tok/s, 16 users {m:.1f} tok/s, prefill {p:.0f} tok/s", flush=True)
for i, what in enumerate(["random workload wall"] if walls else ["one user", "16 users", "prefill"]):
    ratios = [n[i] / b[i] for b, n in zip(results["per buffer"], results["arena"])]
    print(f"{what}: arena over per buffer, per round {' '.join(f'{x:.2f}' for x in ratios)}, median {statistics.median(ratios):.2f}")
