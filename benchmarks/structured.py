"""Constrained decoding cost: N concurrent JSON-schema requests against the same requests unconstrained,
and jump-forward on / off.

Each request asks for a different small JSON document. The constrained runs go first (jump-forward
off, then on); the unconstrained run then generates, per request, exactly as many tokens as the
constrained run without jump-forward did (``ignore_eos``), so every mode produces the same amount of
output and *generated tok/s* compares like with like. Grammars are compiled in a warm-up run (the
compile cache then serves them), so the figures are the per-step cost: mask fill + apply, matcher
advance, and for jump-forward the forced tokens appended in one extend pass.

Run: python -m benchmarks.structured [--requests 16] [--max-tokens 96]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from benchmarks.machine import load_average, machine_info
from minisgl import LLM, SamplingParams

TEXT = {"type": "string", "maxLength": 16}
SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("a person", {"name": TEXT, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    ("a city", {"city": TEXT, "country": TEXT, "population": {"type": "integer", "minimum": 0}}),
    ("a book", {"title": TEXT, "author": TEXT, "year": {"type": "integer", "minimum": 1000, "maximum": 2030}}),
    ("a product", {"name": TEXT, "price": {"type": "number", "minimum": 0}, "in_stock": {"type": "boolean"}}),
    ("a pet", {"kind": {"enum": ["cat", "dog", "fish"]}, "name": TEXT}),
    ("a movie", {"title": TEXT, "rating": {"type": "integer", "minimum": 1, "maximum": 10}}),
    ("a color", {"name": TEXT, "hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}}),
    ("a date", {"day": {"type": "integer", "minimum": 1, "maximum": 31}, "month": TEXT}),
]


def requests(n: int) -> list[tuple[str, dict[str, Any]]]:
    """n (question, schema) pairs, cycling through the schemas."""
    out = []
    for i in range(n):
        what, props = SCHEMAS[i % len(SCHEMAS)]
        schema = {"type": "object", "properties": props, "required": list(props)}
        out.append((f"Give me {what} as JSON (example {i}).", schema))
    return out


def run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[float, list[dict[str, Any]], int]:
    """Seconds, results and forward passes of one ``generate`` over all prompts at once."""
    stats = llm.scheduler.stats
    passes_before = stats.forward_passes
    start = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, results, stats.forward_passes - passes_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder or GGUF (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()

    print(machine_info(torch.get_num_threads()))
    print(f"load average before: {load_average()}")
    llm = LLM(args.model, max_running_req=args.requests, num_page_override=args.requests * 1024)
    reqs = requests(args.requests)
    prompts = [llm.apply_chat_template([{"role": "user", "content": q}]) for q, _ in reqs]
    constrained = [SamplingParams(max_tokens=args.max_tokens, json_schema=s) for _, s in reqs]
    llm.generate(prompts, constrained, use_tqdm=False)  # warm-up: compiles every grammar, fills the cache

    rows = []
    llm.scheduler.jump_forward = False
    seconds, plain_results, passes = run(llm, prompts, constrained)
    lengths = [len(r["token_ids"]) for r in plain_results]
    valid = sum(_is_json(r["text"]) for r in plain_results)
    rows.append(("constrained, jump-forward off", seconds, sum(lengths), passes, valid))
    llm.scheduler.jump_forward = True
    seconds, jump_results, passes = run(llm, prompts, constrained)
    valid = sum(_is_json(r["text"]) for r in jump_results)
    rows.append(("constrained, jump-forward on", seconds, sum(len(r["token_ids"]) for r in jump_results), passes, valid))
    free = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    seconds, _, passes = run(llm, prompts, free)
    rows.append(("unconstrained, same token counts", seconds, sum(lengths), passes, None))
    llm.shutdown()

    base = rows[-1][2] / rows[-1][1]
    print(f"\n{args.requests} concurrent requests, greedy, prompts cached after the warm-up")
    print(f"{'mode':<34} {'seconds':>8} {'tokens':>7} {'passes':>7} {'gen tok/s':>10} {'vs free':>8} {'valid JSON':>11}")
    for name, secs, tokens, n_passes, ok in rows:
        rate = tokens / secs
        valid_text = "-" if ok is None else f"{ok}/{args.requests}"
        print(f"{name:<34} {secs:>8.2f} {tokens:>7} {n_passes:>7} {rate:>10.1f} {rate / base:>7.2f}x {valid_text:>11}")
    print(f"load average after: {load_average()}")


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


if __name__ == "__main__":
    main()
