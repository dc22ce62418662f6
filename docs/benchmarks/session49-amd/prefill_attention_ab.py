"""Session 49: whole offline bursts on the default model with prefill attention on the C kernels' body against
torch's SDPA strategies (``attention/prefill.py``), in one process, the attention backend's choice swapped before
each burst; everything else the same. Bursts of random ids, caches emptied before each: 16 prompts of 256 tokens;
4 system prompts of 512 with 8 questions of 32 each; one prompt of 2,000 tokens; 32 tokens out (1 for the long
prompt). ``--pairs`` pairs, alternating which goes first.

    PYTHONPATH=. python docs/benchmarks/session49-amd/prefill_attention_ab.py [--pairs 6]
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.bursts_ab import Burst, compare_bursts, long_prompt, random_prompts, shared_prefixes
from benchmarks.machine import load_average, machine_info
from minisgl.attention.torch_backend import TorchAttentionBackend
from minisgl.llm import LLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=6)
    pairs = parser.parse_args().pairs
    llm = LLM()
    backend = llm.scheduler.runner.engine.attention
    assert isinstance(backend, TorchAttentionBackend) and backend._prefill_kernels is not None, "no C prefill here"
    kernels = backend._prefill_kernels
    print(f"# {machine_info(torch.get_num_threads())['cpu']}; the {kernels.variant.name} build "
          f"({kernels.variant.description}); load average {load_average()}")  # fmt: skip

    def use(choice: object) -> None:
        backend.__dict__["_prefill_kernels"] = choice

    setups = {"torch's SDPA": lambda: use(None), "C body": lambda: use(kernels)}
    bursts = [Burst("random", random_prompts), Burst("shared prefix", shared_prefixes),
              Burst("long prompt", long_prompt, max_tokens=1)]  # fmt: skip
    compare_bursts(llm, setups, bursts, pairs)
    llm.shutdown()


if __name__ == "__main__":
    main()
