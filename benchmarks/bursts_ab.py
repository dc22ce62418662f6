"""Whole offline bursts of one engine under two setups, alternating in one process (the sessions' A/B scripts in
docs/benchmarks): a change to one part of the engine measured on what users run, with this VM's drift in speed
falling on both setups alike. Prompts are random ids; the caches are emptied before each burst."""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.machine import load_average
from benchmarks.many_rows import builds_to_compare
from minisgl.kernels.native import CpuKernels
from minisgl.layers.quant import QuantizedWeight
from minisgl.llm import LLM
from minisgl.models.decoder import DecoderForCausalLM
from minisgl.sampling import SamplingParams

Ids = Callable[[int], list[int]]  # n random ids


@dataclass(frozen=True)
class Burst:
    name: str
    prompts: Callable[[Ids], list[list[int]]]
    max_tokens: int = 32


def random_prompts(ids: Ids) -> list[list[int]]:
    """16 prompts of 256 ids."""
    return [ids(256) for _ in range(16)]


def shared_prefixes(ids: Ids) -> list[list[int]]:
    """4 system prompts of 512 ids, each with 8 questions of 32."""
    return [system + ids(32) for system in (ids(512) for _ in range(4)) for _ in range(8)]


def one_system_prompt(ids: Ids) -> list[list[int]]:
    """One system prompt of 512 ids with 16 questions of 32 (``benchmarks.paired --groups 1 --prompts-per-group 16``'s
    shape, the 1.7B runs')."""
    system = ids(512)
    return [system + ids(32) for _ in range(16)]


def long_prompt(ids: Ids) -> list[list[int]]:
    """One prompt of 2,000 ids."""
    return [ids(2000)]


def swap_kernels(model: DecoderForCausalLM, kernels: CpuKernels) -> None:
    """``kernels`` wherever the model runs them, its products' bindings and fused decoder made anew: a setup that
    puts one build of the kernels in place (prefill attention stays on the engine's build; the fused decode step's
    attention is the build's own)."""
    model.use_kernels(kernels)
    for module in model.modules():
        if isinstance(module, QuantizedWeight):
            module.__dict__.pop("c_matmul", None)
    model.__dict__.pop("_fused_decoder", None)


def compare_bursts(llm: LLM, setups: dict[str, Callable[[], None]], bursts: list[Burst], pairs: int) -> None:
    """Each burst under each of the two ``setups`` (name: what puts it in place; the first is the baseline)
    ``pairs`` times, the order alternating (after a warm-up of each); prints a markdown table of the medians, the
    speed-up of the medians and the median of the pairs' speed-ups, then the load average."""
    (base, new), rng = setups, random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 49000) for _ in range(n)]

    for setup in setups.values():
        setup()
        llm.generate([ids(64)] * 2, SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    walls: dict[tuple[str, str], list[float]] = {(b.name, name): [] for b in bursts for name in setups}
    for i in range(pairs):
        for burst in bursts:
            prompts, params = burst.prompts(ids), SamplingParams(max_tokens=burst.max_tokens, ignore_eos=True)
            for name in (base, new) if i % 2 == 0 else (new, base):
                setups[name]()
                llm.flush_cache()
                start = time.perf_counter()
                llm.generate(prompts, params, use_tqdm=False)
                walls[burst.name, name].append(time.perf_counter() - start)
    print(f"| burst | {base}, median s | {new}, median s | speed-up of the medians | median of the pairs' |")
    print("|---|---|---|---|---|")
    for burst in bursts:
        before, after = walls[burst.name, base], walls[burst.name, new]
        paired = statistics.median(a / b for a, b in zip(before, after))
        print(f"| {burst.name} | {statistics.median(before):.3f} | {statistics.median(after):.3f} "
              f"| {statistics.median(before) / statistics.median(after):.3f}x | {paired:.3f}x |")  # fmt: skip
    print(f"# load average at end: {load_average()}")


def pairs_from_argv(default: int) -> int:
    """``--pairs N`` taken out of ``sys.argv`` (what is left is ``builds_to_compare``'s), or ``default``."""
    if "--pairs" not in sys.argv:
        return default
    at = sys.argv.index("--pairs")
    pairs = int(sys.argv[at + 1])
    del sys.argv[at : at + 2]
    return pairs


def compare_builds(doc: str, bursts: list[Burst], model: str | None = None, pairs: int = 8) -> None:
    """A build A/B script's body (``doc``: its help): ``--pairs`` (``pairs`` by default) and ``builds_to_compare``'s
    arguments parsed, ``model`` loaded (None: the default), and ``bursts`` compared with the commit's kernel build and
    the working tree's, swapped in before each burst (``swap_kernels``)."""
    pairs = pairs_from_argv(pairs)
    base, new = builds_to_compare(doc)
    llm = LLM(model)
    decoder = llm.scheduler.runner.engine.model
    assert isinstance(decoder, DecoderForCausalLM)
    compare_bursts(
        llm, {"base": lambda: swap_kernels(decoder, base), "new": lambda: swap_kernels(decoder, new)}, bursts, pairs
    )
    llm.shutdown()
