"""Offline runner: each round of a workload goes to the system as one batch; the clock covers all rounds."""

from __future__ import annotations

import random
import time

from transformers import PreTrainedTokenizerBase

from benchmarks.hit_rate import reusable_tokens
from benchmarks.results import RunResult
from benchmarks.systems import OfflineSystem
from benchmarks.workloads import Conversations, Workload

WARMUP_PROMPTS, WARMUP_PROMPT_LEN, WARMUP_OUTPUT_LEN = 2, 24, 4


def warm_up(system: OfflineSystem, vocab_size: int) -> None:
    """First calls pay for lazy initialisation (allocator, kernels, thread pools); keep it off the clock."""
    rng = random.Random(0)
    prompts = [[rng.randrange(3, vocab_size) for _ in range(WARMUP_PROMPT_LEN)] for _ in range(WARMUP_PROMPTS)]
    system.generate(prompts, WARMUP_OUTPUT_LEN)
    system.reset()


def run_offline(system: OfflineSystem, workload: Workload, tokenizer: PreTrainedTokenizerBase) -> RunResult:
    system.reset()
    conversations = Conversations()
    sent: list[tuple[list[int], list[int]]] = []
    cached = 0
    start = time.perf_counter()
    for turns in workload.rounds:
        prompts = [conversations.prompt(t) for t in turns]
        completions = system.generate(prompts, workload.output_len)
        for turn, prompt, c in zip(turns, prompts, completions):
            if len(c.output_ids) != workload.output_len:
                raise RuntimeError(f"{system.name} returned {len(c.output_ids)} tokens, expected {workload.output_len}")
            conversations.record(turn, prompt, c.output_ids)
            sent.append((prompt, c.output_ids))
            cached += c.cached_tokens
    duration = time.perf_counter() - start
    best, total = reusable_tokens(sent)
    return RunResult(
        system=system.name,
        mode="offline",
        workload=workload.name,
        description=system.description,
        requests=len(sent),
        prompt_tokens=total,
        output_tokens=sum(len(o) for _, o in sent),
        cached_tokens=cached,
        best_cached_tokens=best,
        duration_s=duration,
        texts=[str(tokenizer.decode(o, skip_special_tokens=True)) for _, o in sent],
    )
