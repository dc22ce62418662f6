"""Session 49: whole offline bursts on the default model with prefill attention on the C kernels' body against
torch's SDPA strategies (``attention/prefill.py``), in one process, the attention backend's choice swapped before
each burst; everything else the same. Bursts of random ids, caches emptied before each: 16 prompts of 256 tokens;
4 system prompts of 512 with 8 questions of 32 each; one prompt of 2,000 tokens; 32 tokens out (1 for the long
prompt). ``--pairs`` pairs, alternating which goes first.

    PYTHONPATH=. python docs/benchmarks/session49-amd/prefill_attention_ab.py [--pairs 6]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from benchmarks.machine import load_average, machine_info
from minisgl.attention.torch_backend import TorchAttentionBackend
from minisgl.llm import LLM
from minisgl.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=6)
    pairs = parser.parse_args().pairs
    llm, rng = LLM(), random.Random(0)
    engine = llm.scheduler.runner.engine
    backend = engine.attention
    assert isinstance(backend, TorchAttentionBackend) and backend._prefill_kernels is not None, "no C prefill here"
    kernels = backend._prefill_kernels
    print(f"# {machine_info(torch.get_num_threads())['cpu']}; the {kernels.variant.name} build "
          f"({kernels.variant.description}); load average {load_average()}")  # fmt: skip
    choices = {"torch": None, "C": kernels}

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 49000) for _ in range(n)]

    def use(name: str) -> None:
        backend.__dict__["_prefill_kernels"] = choices[name]

    for name in choices:  # each one's warm-up
        use(name)
        llm.generate([ids(300)] * 2, SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    bursts = ("random", "shared prefix", "long prompt")
    walls: dict[tuple[str, str], list[float]] = {(b, name): [] for b in bursts for name in choices}
    for i in range(pairs):
        for burst in bursts:
            params = SamplingParams(max_tokens=1 if burst == "long prompt" else 32, ignore_eos=True)
            if burst == "random":
                prompts = [ids(256) for _ in range(16)]
            elif burst == "shared prefix":
                prompts = [system + ids(32) for system in (ids(512) for _ in range(4)) for _ in range(8)]
            else:
                prompts = [ids(2000)]
            for name in ("torch", "C") if i % 2 == 0 else ("C", "torch"):
                use(name)
                llm.flush_cache()
                start = time.perf_counter()
                llm.generate(prompts, params, use_tqdm=False)
                walls[burst, name].append(time.perf_counter() - start)
    print("| burst | torch's SDPA, median s | C body, median s | speed-up of the medians | median of the pairs' |")
    print("|---|---|---|---|---|")
    for burst in bursts:
        before, after = walls[burst, "torch"], walls[burst, "C"]
        paired = statistics.median(a / b for a, b in zip(before, after))
        print(f"| {burst} | {statistics.median(before):.3f} | {statistics.median(after):.3f} "
              f"| {statistics.median(before) / statistics.median(after):.3f}x | {paired:.3f}x |")  # fmt: skip
    print(f"# load average at end: {load_average()}")
    llm.shutdown()


if __name__ == "__main__":
    main()
