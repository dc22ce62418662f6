"""llama.cpp through llama-cpp-python, on the GGUF file itself (its own quantized kernels).

llama-cpp-python keeps the KV of the previous prompt and reuses the prefix the next prompt shares
with it; it has no cache beyond that one sequence, and it serves one request at a time.
"""

from __future__ import annotations

import itertools

from benchmarks.metrics import common_prefix
from benchmarks.systems.base import Completion, SystemOptions, Unavailable


class LlamaCppSystem:
    def __init__(self, name: str, opts: SystemOptions) -> None:
        try:
            import llama_cpp
        except ImportError as e:
            raise Unavailable("llama-cpp-python is not installed (pip install llama-cpp-python)") from e
        if opts.gguf is None:
            raise Unavailable("llama.cpp needs a GGUF model; --model is a Hugging Face folder")
        if opts.device not in ("cpu", "auto"):
            raise Unavailable("llama.cpp runs on the CPU here (the wheel is built without GPU support)")
        self.name = name
        self.description = f"llama-cpp-python {llama_cpp.__version__}, {opts.gguf.name}, n_threads={opts.threads}"
        self.llm = llama_cpp.Llama(
            model_path=str(opts.gguf),
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
