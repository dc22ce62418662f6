"""Session 42: the single-call decode step (``decode_layer.c``) of a commit's build against the working tree's, in
one process on the default model, offline bursts alternating between the two (``--pairs`` pairs): the model's
fused decoder is built once from each build's kernels and swapped in before each burst; everything else (prefill,
sampling) runs the working tree's kernels in both. Bursts (random ids, caches emptied before each): 16 prompts
of 256 tokens; 4 system prompts of 512 with 8 questions of 32 each, 32 tokens out and 128.

    PYTHONPATH=. python docs/benchmarks/session42-amd/decode_step_ab.py --base 45de7d3 [--pairs 8]
"""

from __future__ import annotations

from benchmarks.bursts_ab import Burst, compare_bursts, pairs_from_argv, random_prompts, shared_prefixes
from benchmarks.many_rows import builds_to_compare
from minisgl.llm import LLM


def main() -> None:
    pairs = pairs_from_argv(8)
    base, new = builds_to_compare(__doc__)
    llm = LLM()
    model = llm.scheduler.runner.engine.model
    layers = [layer.fused_weights() for layer in model.model.layers]
    decoders = {"base": base.fused_decoder(layers), "new": new.fused_decoder(layers)}

    def use(build: str) -> None:
        model.__dict__["_fused_decoder"] = decoders[build]

    bursts = [Burst("random, 32 out", random_prompts), Burst("shared prefix, 32 out", shared_prefixes),
              Burst("shared prefix, 128 out", shared_prefixes, max_tokens=128)]  # fmt: skip
    compare_bursts(llm, {"base": lambda: use("base"), "new": lambda: use("new")}, bursts, pairs)
    llm.shutdown()


if __name__ == "__main__":
    main()
