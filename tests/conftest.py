"""Shared fixtures: the default model (ours and transformers' reference) loaded once per session."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tiny_models import build_tiny_model
from transformers import AutoModelForCausalLM, PreTrainedModel

from minisgl import LLM
from minisgl.kernels.build import c_compiler
from minisgl.kernels.native import CpuKernels, attention_products, cpu_paths, load_variant, resolve_kernels
from minisgl.kernels.variants import VARIANTS, cpu_flags, host_variants
from minisgl.models.gguf import default_model_path


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def hf_smollm(gguf_path: Path) -> PreTrainedModel:
    """transformers' own GGUF loader: an independent dequantization of the same file."""
    return AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="session")
def smollm() -> Iterator[LLM]:
    llm = LLM(num_page_override=16384, max_running_req=32, quantization="none")  # fp32: token-exact with transformers
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama", tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def plain(tiny_llama: Path) -> LLM:
    """The tiny Llama without speculative decoding."""
    return LLM(str(tiny_llama), num_page_override=4096, max_seq_len_override=512, speculative_algorithm="none")


@pytest.fixture(scope="module")
def spec(tiny_llama: Path) -> LLM:
    """The tiny Llama with n-gram drafts (the default), drafting whatever a row costs: tests must not depend
    on timing."""
    llm = LLM(str(tiny_llama), num_page_override=4096, max_seq_len_override=512)
    assert llm.scheduler.drafter is not None and llm.scheduler.drafter.cost is not None
    llm.scheduler.drafter.cost = None
    return llm


@pytest.fixture
def fresh_smollm(smollm: LLM) -> Iterator[LLM]:
    """The shared engine with an empty cache; the test must leave the KV accounting balanced."""
    smollm.flush_cache()
    yield smollm
    assert_idle_balanced(smollm)


def assert_idle_balanced(llm: LLM) -> None:
    llm.scheduler.check_accounting()
    usage = llm.scheduler.kv_usage()
    assert usage["in_use"] == 0 and usage["protected"] == 0, usage
    assert usage["free"] + usage["evictable"] == usage["capacity"], usage


@torch.inference_mode()
def hf_greedy(model: PreTrainedModel, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy tokens for one prompt (no padding), never stopping early: EOS may be
    generated but does not end the sequence, like ``ignore_eos`` (``min_new_tokens`` would instead
    forbid EOS and change the tokens)."""
    model.generation_config.eos_token_id = None
    out = model.generate(
        torch.tensor([prompt_ids]),
        attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.int64),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return out[0, len(prompt_ids) :].tolist()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "emulated(*builds): test_kernel_variants.py's kernels on the emulated CPU too")
    config.addinivalue_line(
        "markers", "not_emulated: a shape test_kernel_variants.py leaves to the CPUs that run a build"
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Which CPU paths this host ran (the C kernels, oneDNN's bf16 instructions): the tests of each
    path run where the host can execute it and skip, saying why, where it cannot."""
    kernels = resolve_kernels("auto")
    for path, code in cpu_paths(kernels).items():
        terminalreporter.write_line(f"minisgl quantized products, {path}: {code}")
    for kind, products in attention_products(kernels).items():
        terminalreporter.write_line(f"minisgl {kind} attention's products over a bf16 KV pool: {products}")
    runnable = ", ".join(v.name for v in host_variants(cpu_flags())) or "none"
    passed = [report.nodeid for report in terminalreporter.stats.get("passed", [])]
    tested = [v.name for v in VARIANTS if any(re.search(rf"[\[-]{v.name}[\]-]", nodeid) for nodeid in passed)]
    emulated = [v.name for v in VARIANTS if any(re.search(rf"[\[-]{v.name}_emulated[\]-]", n) for n in passed)]
    built = [v.name for v in VARIANTS if any(f"[{v.name}_build]" in nodeid for nodeid in passed)]
    terminalreporter.write_line(
        f"minisgl C kernel variants: this CPU runs {runnable}; tests passed on {', '.join(tested) or 'none'}"
        + (f"; on the emulated CPU: {', '.join(emulated)}" if emulated else "")
        + (f"; built without running: {', '.join(built)}" if built else "")
    )


def c_kernels_or_skip(choice: str = "c") -> CpuKernels:
    """The C kernels ``choice`` names (``c``: the best build this CPU runs; ``c:<variant>``), or a skip
    where this CPU cannot run that build or there is no compiler. A build the CPU runs that does not
    compile fails the test (``OSError``) instead: where ``resolve_kernels`` falls back to the next build,
    a compile error in one build would pass as skipped tests, the others' passing."""
    runnable = [v.name for v in host_variants(cpu_flags())]
    name = choice.removeprefix("c:") if choice.startswith("c:") else (runnable or ["any"])[0]
    if name not in runnable:
        pytest.skip(f"kernels={choice!r}: this CPU cannot run {name} of the C kernel builds")
    if c_compiler() is None:
        pytest.skip("no C compiler (cc, gcc or $CC)")
    return load_variant(name)


def llama_cpp_and_default_gguf() -> Path:
    """The default GGUF, for a test that runs llama-cpp-python on it; skips without either."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    try:
        return default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
