"""Quality of each quantization mode on the default GGUF: perplexity on the built-in corpus and greedy
agreement with the fp32 path, beside llama.cpp's perplexity on the same file and the same tokens.

Every layer's quantized products round x to one int8 digit per group of 32 (llama.cpp's rounding), the
LM head's to two (``QuantizedWeight.digits``). The `auto` row "two digits in every product" shows what
the second digit would buy in the layers too, at twice their dot products.

Run: python -m benchmarks.quality [--max-tokens 32] [--out docs/benchmarks/quality.md]
(quality figures, not timings: a busy machine gives the same numbers).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from unittest import mock

import numpy as np

from benchmarks.corpus import CHAT_MESSAGES, GUIDELINES, PERSONAS, QUESTIONS
from benchmarks.peers.amx import load_llama
from minisgl import LLM, SamplingParams
from minisgl.kernels.native import attention_products, cpu_paths
from minisgl.kernels.variants import KERNEL_CHOICES
from minisgl.layers.quant import QuantizedWeight
from minisgl.models.decoder import DecoderForCausalLM
from minisgl.models.gguf import default_model_path
from minisgl.models.perplexity import perplexity

TEXT = " ".join(PERSONAS + GUIDELINES[:10])
# Chat prompts, many: the agreement over 32 of them moved by several points between builds that differ
# only in the last bits.
PROMPTS = [
    *QUESTIONS,
    *(f"Answer briefly: {q}" for q in QUESTIONS),
    *CHAT_MESSAGES,
    *(
        f"{prefix}: {g}"
        for prefix in (
            "Explain this",
            "Rewrite this more simply",
            "Give an example of this rule",
            "Why does this matter?",
        )
        for g in GUIDELINES
    ),
    *(f"{prefix}: {p}" for prefix in ("Who might say this?", "Describe this person") for p in PERSONAS),
]
# (quantization, dtype, two digits in every product)
MODES = (
    ("none", "float32", False), ("auto", "float32", False), ("auto", "float32", True), ("int8", "float32", False),
    ("int4", "float32", False), ("none", "bfloat16", False),
)  # fmt: skip


@contextmanager
def two_digits_everywhere(model: DecoderForCausalLM) -> Iterator[None]:
    """While entered, every quantized product rounds x to two int8 digits, as the LM head's does; decode
    steps run layer by layer (the fused step's products take one), and no layer hands its products rows it
    rounded to one digit (``QuantizedWeight.takes_rounded`` reads ``digits``)."""
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(model, "_fused_decoder", None))
        for w in model.modules():
            if isinstance(w, QuantizedWeight) and w.kernels is not None:
                stack.enter_context(mock.patch.dict(w.__dict__, {"c_matmul": w.bind(w.kernels, 2), "digits": 2}))
        yield


def llama_cpp_perplexity(gguf: Path, token_ids: list[int]) -> float | None:
    """llama.cpp's perplexity of the same token ids, or None without llama-cpp-python."""
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    llm = load_llama(str(gguf), n_ctx=len(token_ids) + 8, logits_all=True, n_threads=2, verbose=False)
    llm.eval(token_ids)
    logits = np.asarray(llm.scores[: len(token_ids) - 1], dtype=np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    nll = -logp[np.arange(len(token_ids) - 1), token_ids[1:]].mean()
    return math.exp(nll)


def greedy(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]


def agreement(outs: list[list[int]], reference: list[list[int]]) -> tuple[float, float]:
    """Share of prompts with identical tokens, and mean share of tokens before the first difference."""
    same = sum(o == r for o, r in zip(outs, reference)) / len(reference)
    prefix = [
        next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), len(r)) / len(r) for o, r in zip(outs, reference)
    ]
    return same, sum(prefix) / len(prefix)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/quality.md"))
    parser.add_argument("--kernels", default="auto", choices=KERNEL_CHOICES)
    args = parser.parse_args()
    gguf = default_model_path()
    rows, reference, token_ids, paths = [], None, None, ""
    for mode, dtype, two_digits in MODES:
        llm = LLM(quantization=mode, dtype=dtype, num_page_override=4096, kernels=args.kernels)
        kernels = llm.scheduler.engine.kernels
        paths = "; ".join(f"{k}: {v}" for k, v in cpu_paths(kernels).items())
        paths += f". Attention's products over a bf16 KV pool: {attention_products(kernels)}"
        token_ids = llm.tokenizer.encode(TEXT)
        prompts = [llm.apply_chat_template([{"role": "user", "content": q}]) for q in PROMPTS]
        engine = llm.scheduler.engine  # scored through its own attention: its KV dtype and kernels
        with two_digits_everywhere(engine.model) if two_digits else nullcontext():
            ppl = perplexity(engine.model, token_ids, prepare=engine.scoring_attention(len(token_ids)).prepare)
            outs = greedy(llm, prompts, args.max_tokens)
        reference = reference or outs  # the first mode, fp32 dense, is the reference
        same, prefix = agreement(outs, reference)
        name = f"minisgl `{mode}`, {dtype}{', two digits in every product' if two_digits else ''}"
        rows.append(f"| {name} | {ppl:.3f} | {same:.0%} | {prefix:.0%} |")
        print(rows[-1], flush=True)
        llm.shutdown()
    assert token_ids is not None
    ref_ppl = llama_cpp_perplexity(gguf, token_ids)
    rows.append(
        f"| llama.cpp (llama-cpp-python), the GGUF as stored | {'n/a (not installed)' if ref_ppl is None else f'{ref_ppl:.3f}'} | | |"
    )
    table = "\n".join(
        [
            (
                f"Quality on {gguf.name}: perplexity of the built-in corpus text ({len(token_ids)} tokens, "
                f"`benchmarks/quality.py`), greedy agreement with fp32 `none` over {len(PROMPTS)} chat prompts "
                f"x {args.max_tokens} tokens. Quantized products: {paths}."
            ),
            "",
            "| weights | perplexity | prompts identical to fp32 | tokens before first difference |",
            "|---|---|---|---|",
            *rows,
        ]
    )
    print(table)
    args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
