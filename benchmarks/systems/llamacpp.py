"""llama.cpp through llama-cpp-python, on the GGUF file itself (its own quantized kernels).

llama-cpp-python keeps the KV of the previous prompt and reuses the prefix the next prompt shares
with it; it has no cache beyond that one sequence, and it serves one request at a time. On an AMX
CPU its model parameters turn llama.cpp's extra buffer types off (``benchmarks.peers.amx``).
``generate_in_child`` runs it in a child process, for callers that must outlive a llama.cpp that
crashes on this CPU (the setup's check, the tests).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from benchmarks.child import call_in_child
from benchmarks.metrics import common_prefix
from benchmarks.peers.amx import llama_model_params, load_llama
from benchmarks.systems.base import Completion, SystemOptions, Unavailable


class LlamaCppSystem:
    def __init__(self, name: str, opts: SystemOptions) -> None:
        # Before importing llama_cpp: a run that cannot use it never loads its native library.
        if opts.gguf is None:
            raise Unavailable("llama.cpp needs a GGUF model; --model is a Hugging Face folder")
        if opts.device not in ("cpu", "auto"):
            raise Unavailable("llama.cpp runs on the CPU here (the wheel is built without GPU support)")
        try:
            import llama_cpp
        except ImportError as e:
            raise Unavailable("llama-cpp-python is not installed (pip install llama-cpp-python)") from e
        self.name = name
        params = "".join(f", {k}={v}" for k, v in llama_model_params().items())
        self.description = (
            f"llama-cpp-python {llama_cpp.__version__}, {opts.gguf.name}, n_threads={opts.threads}{params}"
        )
        self.llm = load_llama(
            str(opts.gguf),
            n_ctx=opts.max_seq_len,
            n_threads=opts.threads,
            n_threads_batch=opts.threads,
            verbose=False,
        )

    def generate(self, prompts: list[list[int]], output_len: int) -> list[Completion]:
        completions = []
        for prompt in prompts:
            # Its reuse rule: the tokens it kept against the prompt minus its last token.
            kept = self.llm.input_ids[: self.llm.n_tokens].tolist()
            cached = common_prefix(kept, prompt[:-1])
            tokens = self.llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True)
            # generate never stops on its own at end of sequence; taking output_len tokens = ignore_eos.
            completions.append(Completion([int(t) for t in itertools.islice(tokens, output_len)], cached))
            tokens.close()
        return completions

    def reset(self) -> None:
        self.llm.reset()

    def close(self) -> None:
        self.llm.close()


def generate_rounds(
    gguf: str, rounds: list[list[list[int]]], output_len: int, threads: int
) -> list[list[dict[str, Any]]]:
    """Greedy completions of each round's prompts, the system reset before each round; the child's side
    of ``generate_in_child``."""
    longest = max(len(prompt) for prompts in rounds for prompt in prompts)
    opts = SystemOptions(
        model=None, hf_folder=Path("unused"), gguf=Path(gguf), threads=threads, max_seq_len=longest + output_len
    )
    system = LlamaCppSystem("llama.cpp", opts)
    completions = []
    try:
        for prompts in rounds:
            system.reset()
            completions.append(system.generate(prompts, output_len))
    finally:
        system.close()
    return [[{"output_ids": c.output_ids, "cached_tokens": c.cached_tokens} for c in cs] for cs in completions]


def generate_in_child(
    gguf: Path, rounds: list[list[list[int]]], output_len: int, threads: int, timeout_s: float = 600.0
) -> list[list[Completion]]:
    """``generate_rounds`` in a child process; raises ``benchmarks.child.ChildFailed`` naming how it
    ended (``killed by SIGILL``, say) with its output's tail, where llama.cpp fails here."""
    got = call_in_child(generate_rounds, str(gguf), rounds, output_len, threads, timeout_s=timeout_s)
    return [[Completion(c["output_ids"], c["cached_tokens"]) for c in cs] for cs in got]
