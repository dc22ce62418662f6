"""minisgl through its offline API, in any cache / scheduling configuration."""

from __future__ import annotations

from benchmarks.systems import MINISGL_VARIANTS
from benchmarks.systems.base import Completion, SystemOptions
from minisgl.llm import LLM
from minisgl.sampling import SamplingParams


class MinisglSystem:
    def __init__(self, name: str, opts: SystemOptions) -> None:
        self.name = name
        options = MINISGL_VARIANTS[name]
        self.description = "minisgl LLM.generate, " + ", ".join(f"{k}={v}" for k, v in options.items())
        self.llm = LLM(
            opts.model, **{"dtype": opts.dtype, "device": opts.device, "num_threads": opts.threads, **options}
        )

    def generate(self, prompts: list[list[int]], output_len: int) -> list[Completion]:
        params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        return [Completion(list(o["token_ids"]), o["meta"]["cached_tokens"]) for o in outs]

    def reset(self) -> None:
        self.llm.flush_cache()

    def close(self) -> None:
        self.llm.shutdown()
