"""Quantized weights: each GGUF format's matmul against its dequantized reference, the default model
end to end (perplexity against fp32, batch against alone), and bad modes."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from torch import nn

from benchmarks.corpus import GUIDELINES
from minisgl import LLM, SamplingParams
from minisgl.batch import AttentionKind, Batch
from minisgl.config import EngineConfig
from minisgl.heap import HugePageArena
from minisgl.kernels.native import PrefillMlp, resolve_kernels
from minisgl.kernels.variants import VARIANTS, cpu_flags, host_variants
from minisgl.layers.linear import Linear
from minisgl.layers.quant import INT4_GROUP, DequantBuffer, Int4Weight, Int8Weight, QuantizedWeight
from minisgl.models.gguf import default_model_path
from minisgl.models.gguf_tensors import INT4_EXACT, GGUFTensors, int4_from_blocks
from minisgl.models.loader import memory_bytes
from minisgl.models.perplexity import perplexity, sequence_logits
from tests.conftest import c_kernels_or_skip
from tests.tiny_models import WINDOW, build_tiny_model

OUT, IN = 96, 256  # one Q4_K / Q6_K super-block of 256 weights per row
# The C kernels (15-bit activations: ~1e-4 here) and torch's fallback kernels (bf16 activations:
# 8 significant bits, each product within ~0.4%; summed over 256 terms well under 1%) alike.
MATMUL_TOLERANCE = 0.01
# Sizes of the blocks built by hand (formats gguf cannot quantize): bytes per 256 weights, and the
# offsets of their fp16 super-block scales.
HAND_BUILT = {"Q4_K": (144, (0, 2)), "Q5_K": (176, (0, 2)), "Q6_K": (210, (208,))}


def gguf_blocks(kind: str, seed: int = 0) -> np.ndarray:
    """A [OUT, IN] tensor's raw bytes in ``kind``: quantized by gguf, or random blocks with sane scales."""
    rng = np.random.default_rng(seed)
    qtype = GGMLQuantizationType[kind]
    if kind not in HAND_BUILT:
        return quantize(rng.standard_normal((OUT, IN), dtype=np.float32), qtype)
    size, scale_offsets = HAND_BUILT[kind]
    blocks = rng.integers(0, 256, (OUT * IN // 256, size), dtype=np.uint8)
    for offset in scale_offsets:
        blocks[:, offset : offset + 2] = rng.uniform(0.001, 0.01, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(OUT, -1)


def dense_of(kind: str, blocks: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(dequantize(blocks, GGMLQuantizationType[kind]).reshape(OUT, IN).astype(np.float32))


def assert_matmul_close(weight: QuantizedWeight, dense: torch.Tensor) -> None:
    """The weight's product against fp64 x W^T at row counts on both sides of ``max_kernel_rows``:
    with the C kernels, their one path; without them, torch's kernel and past it bf16 GEMM on the
    expanded weight, in one band and in several."""
    torch.manual_seed(0)
    for rows in (1, 3, 7, weight.max_kernel_rows, weight.max_kernel_rows + 1, 70):
        for buffer in (None, DequantBuffer(IN * 40)):  # the whole weight at once; bands of 40 rows
            weight.buffer = buffer
            x = torch.randn(rows, IN)
            ref = x.double() @ dense.double().T
            err = (weight(x).double() - ref).abs().max() / ref.abs().max()
            assert err < MATMUL_TOLERANCE, (rows, buffer, err.item())
    weight.buffer = None


@pytest.mark.parametrize("kind", INT4_EXACT)
def test_int4_formats_keep_the_file_codes(kind: str) -> None:
    blocks = gguf_blocks(kind)
    dense = dense_of(kind, blocks)
    weight = int4_from_blocks(kind, blocks, IN)  # straight from the blocks, never through fp32
    # The codes are the file's, with fp16 scale and minimum (Q4_0/Q4_1 store fp16: exact; Q4_K's
    # products of two scales round): each weight is off by at most 2^-11 of 15 |scale| + |minimum|.
    scale, minimum = (t.float().repeat_interleave(INT4_GROUP, dim=1) for t in weight.group_scales())
    bound = 2**-10 * (15 * scale.abs() + minimum.abs()) + 1e-7
    assert ((weight.dequantize() - dense).abs() <= bound).all()
    if kind != "Q4_K":
        assert torch.equal(weight.dequantize(), dense)
    assert_matmul_close(weight, dense)


def test_q4_1_codes_match_the_nibbles_in_the_file() -> None:
    blocks = gguf_blocks("Q4_1").reshape(-1, 20)  # fp16 d, fp16 m, 16 bytes: low nibbles then high nibbles
    packed = blocks[:, 4:]
    codes = torch.from_numpy(np.concatenate([packed & 0xF, packed >> 4], axis=1).reshape(OUT, IN))
    direct = int4_from_blocks("Q4_1", blocks.reshape(OUT, -1), IN)
    assert torch.equal(direct.unpacked_codes(), codes)
    # The same layout as the one built from the codes by the general path.
    via_codes = Int4Weight.from_codes(codes, *direct.group_scales())
    assert torch.equal(direct.codes, via_codes.codes)


@pytest.mark.parametrize("kind", ["Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0"])
def test_int8_formats_round_to_nearest_per_row(kind: str) -> None:
    dense = dense_of(kind, gguf_blocks(kind))
    weight = Int8Weight.quantize(dense)
    step = dense.abs().amax(dim=1, keepdim=True) / 127  # one code's width in each row
    # Half a step of rounding (and fp32's own rounding of code * scale).
    assert ((weight.dequantize() - dense).abs() <= step * (0.5 + 1e-5)).all()
    assert_matmul_close(weight, weight.dequantize())


# fp16 scales at fp16's edges for Q4_0's minimum (-8 d): subnormals (some become normal), the
# largest whose product fits, the smallest whose product overflows, negatives, zero, infinity, a NaN.
EDGE_FP16_SCALES = [0x0001, 0x0080, 0x03FF, 0x0400, 0x6BFF, 0x6C00, 0x7BFF, 0x8001, 0x8000, 0x7C00, 0xFC00, 0x7E01]


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("rows", [OUT, OUT - 6])  # whole tiles; the last tile's rows past the weight's
def test_c_loader_writes_the_numpy_paths_tiles(kind: str, rows: int) -> None:
    """The loader's C path (``kernels/cpu/gguf_tiles.c``) gives the bytes of the numpy path, written
    in two calls that split a tile (a fused projection's parts)."""
    kernels = c_kernels_or_skip()
    blocks = gguf_blocks(kind)[:rows].copy()
    if kind == "Q4_0":  # each block: fp16 d, 16 code bytes
        by_block = blocks.reshape(-1, 18)
        edges = np.array(EDGE_FP16_SCALES, dtype=np.uint16).view(np.uint8)
        by_block[: len(EDGE_FP16_SCALES), :2] = edges.reshape(-1, 2)
    with np.errstate(over="ignore"):  # -8 d past fp16's range: infinity, on both paths
        expected = int4_from_blocks(kind, blocks, IN)
    weight = Int4Weight.empty(rows, IN)
    buffers = (weight.codes, weight.scale, weight.minimum)
    for start, end in ((0, 37), (37, rows)):
        kernels.int4_from_gguf(torch.from_numpy(blocks[start:end]), kind == "Q4_1", start, buffers, rows)
    for name in ("codes", "scale", "minimum"):
        assert getattr(weight, name).view(torch.uint8).equal(getattr(expected, name).view(torch.uint8)), name


def test_c_loader_rounds_q8_0_per_row_as_torch_does() -> None:
    kernels = c_kernels_or_skip()
    blocks = gguf_blocks("Q8_0").copy()
    blocks.reshape(-1, 34)[: IN // 32] = 0  # row 0 all zeros: its scale is the smallest normal's / 127
    expected = Int8Weight.quantize(dense_of("Q8_0", blocks))
    weight = Int8Weight.empty(OUT, IN)
    kernels.int8_from_q8_0(torch.from_numpy(blocks), 0, (weight.codes, weight.scale), OUT)
    assert torch.equal(weight.codes, expected.codes) and torch.equal(weight.scale, expected.scale)
    with pytest.raises(ValueError, match="blocks must have shape"):
        kernels.int8_from_q8_0(torch.from_numpy(blocks[:, :-1].copy()), 0, (weight.codes, weight.scale), OUT)
    with pytest.raises(ValueError, match="rows 1..97 outside the weight's 96"):
        kernels.int8_from_q8_0(torch.from_numpy(blocks), 1, (weight.codes, weight.scale), OUT)


def test_int4_round_to_nearest_error_is_half_a_step() -> None:
    dense = torch.randn(OUT, IN)
    weight = Int4Weight.quantize(dense)
    groups = dense.view(OUT, -1, INT4_GROUP)
    step = ((groups.amax(-1) - groups.amin(-1)) / 15).repeat_interleave(INT4_GROUP, dim=1)
    assert ((weight.dequantize() - dense).abs() <= step / 2 + 2**-8 * (8 * step + dense.abs())).all()
    assert_matmul_close(weight, weight.dequantize())


def mapping_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds ``address`` (``/proc/self/smaps``)."""
    holds = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        field = line.split()[0]
        if "-" in field and not field.endswith(":"):
            start, end = (int(x, 16) for x in field.split("-"))
            holds = start <= address < end
        elif field == "VmFlags:" and holds:
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_weights_moved_into_an_arena_keep_their_values_one_after_another() -> None:
    """What the loader does with each weight the C kernels run: its buffers copied into a huge-page
    arena, one after another, values unchanged; a tensor past half a chunk gets a buffer of its own.
    The model's memory counts the bytes the weights hold, not the arena's chunk."""
    arena = HugePageArena(chunk_bytes=1 << 20)
    first, second = Int4Weight.quantize(torch.randn(48, 96)), Int8Weight.quantize(torch.randn(20, 70))
    large = Int8Weight.quantize(torch.randn(1024, 1024))  # 1 MiB of codes
    dense = [w.dequantize() for w in (first, second, large)]
    for weight in (first, second, large):
        weight.move_into(arena)
    small = [*first.buffers(), *second.buffers()]
    assert len({t.untyped_storage().data_ptr() for t in small}) == 1
    starts = [t.data_ptr() for t in small]
    assert starts == sorted(starts) and all(start % 64 == 0 for start in starts)
    assert starts[-1] - starts[0] < sum(t.nbytes + 64 for t in small[:-1])  # one after another
    assert large.codes.untyped_storage().data_ptr() not in {t.untyped_storage().data_ptr() for t in small}
    assert all(torch.equal(w.dequantize(), d) for w, d in zip((first, second, large), dense))
    weights = [*small, *large.buffers()]
    assert memory_bytes(nn.ModuleList([first, second, large]))["weights"] == sum(t.nbytes for t in weights)
    with pytest.raises(ValueError, match="CPU tensors"):
        arena.place(torch.empty(4, device="meta"))


@pytest.mark.skipif(
    not Path("/sys/kernel/mm/transparent_hugepage/enabled").exists(), reason="no transparent huge pages (Linux)"
)
def test_the_loaded_weights_ask_for_huge_pages(auto_llm: LLM) -> None:
    """Decode streams every weight whole each step, faster from 2 MiB pages: the C kernels' weights lie
    in huge-page buffers advised MADV_HUGEPAGE ("hg") before they were written, the LM head's too."""
    c_kernels_or_skip()  # without them torch's kernels run, on copies of their own
    model = auto_llm.scheduler.engine.model
    weights = {id(m): m for m in model.modules() if isinstance(m, QuantizedWeight)}.values()
    assert len({w.codes.untyped_storage().data_ptr() for w in weights}) < len(weights) / 10  # shared chunks
    assert all("hg" in mapping_flags(w.codes.data_ptr()) for w in weights)


def c_kernels_expected() -> bool:
    """The C kernels build wherever there is a compiler and a CPU with AVX2 + FMA + F16C at least."""
    has_compiler = shutil.which("cc") is not None or shutil.which("gcc") is not None
    return has_compiler and bool(host_variants(cpu_flags()))


@pytest.mark.parametrize("path", ["c", "torch"])
def test_both_kernel_paths_match_the_dequantized_weight(path: str) -> None:
    """The C kernels, and torch's where they cannot be built; rows past the C kernels' four per
    pass included."""
    kernels = c_kernels_or_skip() if path == "c" else None
    dense = torch.randn(OUT, IN)
    for weight in (Int4Weight.quantize(dense), Int8Weight.quantize(dense)):
        weight.kernels = kernels
        assert_matmul_close(weight, weight.dequantize())


def test_c_kernels_build_where_the_host_allows() -> None:
    assert (resolve_kernels("auto") is not None) == c_kernels_expected()


def test_int4_from_the_file_is_its_dequantized_weight() -> None:
    """The default file's int4 weights, read from its blocks in HF row order (q/k un-permuted),
    are exactly its dequantized values; so are tensor-parallel slices of them."""
    tensors = GGUFTensors(default_model_path())
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.3.self_attn.k_proj.weight",
                 "model.layers.5.mlp.down_proj.weight"):  # fmt: skip
        weight, dense = tensors.int4(name), tensors.dense(name)
        assert torch.equal(weight.dequantize(), dense), name
        assert torch.equal(weight.rows(3, 40).dequantize(), dense[3:40])
        assert torch.equal(weight.columns(64, 192).dequantize(), dense[:, 64:192])
    with pytest.raises(ValueError, match="split a group"):
        weight.columns(16, 128)
    with pytest.raises(ValueError, match="Q8_0 .*not int4-exact"):
        tensors.int4("model.embed_tokens.weight")
    # A fused projection: the tensors' rows one after another, written in place.
    names = [f"model.layers.2.self_attn.{p}_proj.weight" for p in "qkv"]
    fused = tensors.int4(*names)
    assert torch.equal(fused.dequantize(), torch.cat([tensors.dense(n) for n in names]))
    with pytest.raises(ValueError, match="differ in columns"):
        tensors.int4(names[0], "model.layers.2.mlp.down_proj.weight")


def test_the_file_read_through_the_c_kernels_gives_the_same_weights() -> None:
    """Q4_1 layers and the Q8_0 embedding of the default file, with the C kernels and without, and
    with the C kernels built straight into a huge-page arena (the loader's way: the weights' memory
    written once), where moving them in then copies nothing."""
    kernels = c_kernels_or_skip()
    plain, through_c = GGUFTensors(default_model_path()), GGUFTensors(default_model_path(), kernels)
    arena = HugePageArena(chunk_bytes=4 << 20)
    names = [f"model.layers.2.self_attn.{p}_proj.weight" for p in "qkv"]
    a, b, c = plain.int4(*names), through_c.int4(*names), through_c.int4(*names, arena=arena)
    for n in ("codes", "scale", "minimum"):
        assert torch.equal(getattr(a, n), getattr(b, n)) and torch.equal(getattr(a, n), getattr(c, n))
    a, b = plain.int8("model.embed_tokens.weight"), through_c.int8("model.embed_tokens.weight")
    c = through_c.int8("model.embed_tokens.weight", arena=arena)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scale, b.scale)
    assert torch.equal(a.codes, c.codes) and torch.equal(a.scale, c.scale)
    built = [t.data_ptr() for t in c.buffers()]
    assert all(arena.holds(t) for t in c.buffers()) and not any(arena.holds(t) for t in b.buffers())
    c.move_into(arena)
    assert [t.data_ptr() for t in c.buffers()] == built  # already there: not copied


# -- the default model end to end ----------------------------------------------------------------
TEXT = " ".join(GUIDELINES[:8])
# Measured on this text: auto (the file's own codes, bf16 activations) within 0.1% of fp32.
AUTO_PPL_BOUND = 0.02


@pytest.fixture(scope="module")
def auto_llm() -> Iterator[LLM]:
    llm = LLM(num_page_override=2048, max_running_req=8)  # quantization="auto", the default
    yield llm
    llm.shutdown()


def test_auto_runs_the_q4_1_file_in_int4(auto_llm: LLM) -> None:
    model = auto_llm.scheduler.engine.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert all(isinstance(m.quantized, Int4Weight) for m in linears if m is not model.lm_head)
    assert isinstance(model.lm_head.quantized, Int8Weight)  # the tied Q8_0 embedding
    assert model.model.embed_tokens.quantized is model.lm_head.quantized  # lookups read the same codes
    # No dense copy of anything quantized: only the norms' fp32 vectors are parameters.
    assert all(m.weight is None for m in linears) and model.model.embed_tokens.weight is None
    assert {name.rpartition(".")[2] for name, _ in model.named_parameters()} == {"weight"}
    assert all(p.dim() == 1 for p in model.parameters())


def test_auto_perplexity_close_to_fp32(auto_llm: LLM, smollm: LLM) -> None:
    ids = smollm.tokenizer.encode(TEXT)
    fp32 = perplexity(smollm.scheduler.engine.model, ids, chunk=32)
    engine = auto_llm.scheduler.engine  # its own attention: the bf16 pool, the C prefill kernel where it runs
    quantized = perplexity(engine.model, ids, chunk=32, prepare=engine.scoring_attention(len(ids)).prepare)
    assert abs(quantized / fp32 - 1) < AUTO_PPL_BOUND, (quantized, fp32)


def test_layer_products_take_one_digit_and_the_lm_head_two(auto_llm: LLM) -> None:
    """x is rounded to one int8 digit in every layer's products, prefill and decode alike (llama.cpp's
    rounding), and to two in the LM head's, whose logits are what is sampled."""
    model = auto_llm.scheduler.engine.model
    if model.kernels is None:
        pytest.skip("no C kernels here")
    head = model.lm_head.quantized
    assert head is not None and head.digits == 2
    layers = [m for m in model.model.layers.modules() if isinstance(m, QuantizedWeight)]
    assert layers and {w.digits for w in layers} == {1}
    x = torch.randn(3, head.in_features)
    assert not torch.equal(head.forward(x), head.bind(model.kernels, 1)(x))  # its product took the two


def test_auto_greedy_same_in_a_batch_as_alone(auto_llm: LLM) -> None:
    prompts = [auto_llm.tokenizer.encode(p) for p in ("The capital of France is", "def add(a, b):", "1, 2, 3,")]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    alone = [auto_llm.generate([p], params, use_tqdm=False)[0]["token_ids"] for p in prompts]
    auto_llm.flush_cache()
    batch = [o["token_ids"] for o in auto_llm.generate(prompts, params, use_tqdm=False)]
    assert batch == alone
    auto_llm.scheduler.check_accounting()


def test_every_layer_product_knows_the_prefill_rows_of_its_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass's prefill rows (``Batch.prefill_tokens``, its first rows) reach every layer product, the MLP's
    bands and a pass that mixes a prompt's chunk with a decoding request included: where the C kernels have
    the tile unit's MLP (``CpuKernels.prefill_mlp``) it takes those rows and the MLP's products the others.
    The LM head's rows are sampled ones, all on the decode products."""
    llm = LLM(num_page_override=2048, max_prefill_tokens=16, speculative_algorithm="none")
    engine, head = llm.scheduler.engine, llm.scheduler.engine.model.lm_head.quantized
    run_model, forward = engine.run_model, QuantizedWeight.forward
    passes: list[tuple[int, int, list[int | str]]] = []  # (rows, prefill tokens, what the layers' products saw)

    def recording(batch: Batch) -> torch.Tensor:
        passes.append((batch.input_ids.numel(), batch.prefill_tokens, []))
        return run_model(batch)

    def spy(
        self: QuantizedWeight, x: torch.Tensor, prefill_rows: int = 0, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self is not head:
            passes[-1][2].append(prefill_rows)
        return forward(self, x, prefill_rows, out)

    def mlp_spy(mlp: PrefillMlp) -> PrefillMlp:
        def call(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
            passes[-1][2].append(f"mlp of {len(x)}")
            return mlp(x, out)

        return call

    layers = [layer.mlp for layer in engine.model.model.layers]
    fused = [module._prefill_mlp for module in layers]
    for module, prefill_mlp in zip(layers, fused):
        if prefill_mlp is not None:
            monkeypatch.setitem(module.__dict__, "_prefill_mlp", mlp_spy(prefill_mlp))
    monkeypatch.setattr(engine, "run_model", recording)
    monkeypatch.setattr(QuantizedWeight, "forward", spy)
    llm.generate([list(range(100, 106)), list(range(200, 240))], SamplingParams(max_tokens=4, ignore_eos=True))
    llm.shutdown()
    tile_unit = engine.kernels is not None and engine.kernels.bf16_prefill
    assert [f is not None for f in fused] == [tile_unit] * len(layers)
    mixed = [(rows, prefill) for rows, prefill, _ in passes if 0 < prefill < rows]
    assert mixed, passes  # the long prompt's chunks ride with the short one's decoding
    for rows, prefill, seen in passes:
        if not prefill:  # a decode pass runs the fused step (none) or products told of none
            assert seen == [0] * len(seen), rows
            continue
        in_mlp: list[int | str] = [prefill, prefill]  # gate/up, down
        if fused[0] is not None:
            in_mlp = [f"mlp of {prefill}"] + ([0, 0] if prefill < rows else [])
        assert seen == ([prefill, prefill] + in_mlp) * len(layers), (rows, prefill)  # qkv, o, the MLP's


def test_fused_decode_step_matches_the_layer_by_layer_one(auto_llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default model decodes through decode_layer.c in one call; the same steps through the
    modules (the same kernels one by one, SiLU and RoPE in torch) give logits within 0.2% of the
    largest: SiLU's last bits differ, which can move a product's input by one step of its int8
    rounding. Its KV pool is bf16, where such a difference can round a stored key to the next bf16
    value and grow from step to step, so only the first step (the same inputs) is compared."""
    assert auto_llm.scheduler.engine.pool.k.dtype == torch.bfloat16
    assert_fused_matches_layers(auto_llm, monkeypatch, steps=1)


def passes_logits(
    llm: LLM, monkeypatch: pytest.MonkeyPatch, prompts: list[list[int]], max_tokens: int = 1
) -> Callable[[], list[torch.Tensor]]:
    """A call that runs ``prompts`` for ``max_tokens`` tokens each from an emptied cache, without drafts, and
    gives each pass's logits: the prefill pass first, then the decode steps."""
    engine = llm.scheduler.engine
    run_model, logits = engine.run_model, []

    def recording(batch: Batch) -> torch.Tensor:
        out = run_model(batch)
        logits.append(out.clone())
        return out

    def run() -> list[torch.Tensor]:
        logits.clear()
        llm.flush_cache()
        llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True), use_tqdm=False)
        return list(logits)

    monkeypatch.setattr(llm.scheduler, "drafter", None)
    monkeypatch.setattr(engine, "run_model", recording)
    return run


def test_norms_and_swiglu_hand_their_rows_rounded_to_the_products(
    auto_llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the tile unit's prefill path, a prefill pass's norms and SwiGLU round their rows for the
    integer products themselves (``RoundedRows``), and its logits are the bits of the same pass with fp32 rows
    that each product rounds."""
    engine, kernels = auto_llm.scheduler.engine, auto_llm.scheduler.engine.model.kernels
    if kernels is None or kernels.bf16_prefill:
        pytest.skip("prefill rows take the tile unit's bf16 path here, from fp32 rows")
    passes = passes_logits(auto_llm, monkeypatch, [[5, 9, 200, 17, 33] * 20, [7, 7, 81, 4] * 30])
    norm = mock.patch.object(kernels, "rms_norm_rounded", wraps=kernels.rms_norm_rounded)
    swiglu = mock.patch.object(kernels, "silu_and_mul_rounded", wraps=kernels.silu_and_mul_rounded)
    with norm as norms, swiglu as swiglus:
        rounded = passes()[0]
    layers = len(engine.model.model.layers)
    assert (norms.call_count, swiglus.call_count) == (2 * layers, layers)
    monkeypatch.setattr(QuantizedWeight, "takes_rounded", lambda self, prefill_rows: False)
    assert torch.equal(passes()[0], rounded)


def test_fused_decode_rounds_every_projection_to_one_digit(auto_llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused step rounds x to one digit in every projection, as the layers' products do: its first
    decode step is far closer to the layer-by-layer one (the same bits here) than to that one with
    two-digit products."""
    model, engine = auto_llm.scheduler.engine.model, auto_llm.scheduler.engine
    if model._fused_decoder is None:
        pytest.skip("no C kernels here")
    monkeypatch.setattr(auto_llm.scheduler, "drafter", None)
    run_model, forward = engine.run_model, QuantizedWeight.forward
    decoding = False
    first_steps: list[torch.Tensor] = []

    def recording(batch: Batch) -> torch.Tensor:
        nonlocal decoding
        decoding = batch.attention is AttentionKind.DECODE
        logits = run_model(batch)
        if decoding:
            first_steps.append(logits.clone())
        return logits

    def first_step() -> torch.Tensor:
        first_steps.clear()
        auto_llm.flush_cache()
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        auto_llm.generate([[5, 9, 200, 17, 33], [7, 7, 81, 4]], params, use_tqdm=False)
        return first_steps[0]

    monkeypatch.setattr(engine, "run_model", recording)
    fused = first_step()
    monkeypatch.setitem(model.__dict__, "_fused_decoder", None)
    layers = first_step()
    kernels = model.kernels
    two_digits = {id(w): w.bind(kernels, 2) for w in model.model.layers.modules() if isinstance(w, QuantizedWeight)}

    def decode_at_two_digits(self: QuantizedWeight, x: torch.Tensor, prefill_rows: int = 0) -> torch.Tensor:
        product = two_digits.get(id(self)) if decoding else None
        return forward(self, x, prefill_rows) if product is None else product(x.contiguous())

    monkeypatch.setattr(QuantizedWeight, "forward", decode_at_two_digits)
    monkeypatch.setattr(QuantizedWeight, "takes_rounded", lambda self, prefill_rows: False)  # fp32 rows to round twice
    two_digit = first_step()
    assert (fused - layers).abs().max() * 10 < (fused - two_digit).abs().max()
    auto_llm.scheduler.check_accounting()


def test_quality_benchmarks_two_digit_products_run_every_pass(auto_llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """``benchmarks.quality``'s "two digits in every product" row: inside it no layer hands its products rows
    rounded to one digit, so every pass whose products round x has logits other than the one-digit pass's: the
    decode steps, and the prefill pass but where prefill rows take the tile unit's bf16 path (which rounds x to
    bf16, not to digits). After it the layers take one digit again."""
    from benchmarks.quality import two_digits_everywhere

    model = auto_llm.scheduler.engine.model
    if model.kernels is None:
        pytest.skip("no C kernels here")
    passes = passes_logits(auto_llm, monkeypatch, [[5, 9, 200, 17, 33] * 20], max_tokens=2)
    layers = [w for w in model.model.layers.modules() if isinstance(w, QuantizedWeight)]
    one_digit = passes()
    with two_digits_everywhere(model):
        assert {w.digits for w in layers} == {2} and not any(w.takes_rounded(0) for w in layers)
        two_digit = passes()
    assert {w.digits for w in layers} == {1}
    prefill_rounds = not model.kernels.bf16_prefill
    assert [not torch.equal(a, b) for a, b in zip(two_digit, one_digit, strict=True)] == [prefill_rounds, True]
    assert all(torch.equal(a, b) for a, b in zip(passes(), one_digit, strict=True))
    auto_llm.scheduler.check_accounting()


@pytest.mark.parametrize(
    "kind, mode, variant",
    [
        *(("llama", "int4", v.name) for v in VARIANTS), ("qwen2", "int4", "avx512"), ("qwen3", "int4", "avx512"),
        ("qwen3", "int4", "avx2"), ("llama", "int8", "avx512"), ("llama", "int8", "avx2"),
    ],
)  # fmt: skip
def test_fused_decode_of_a_gqa_model_quantized_at_load(
    kind: str, mode: str, variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an fp32 pool, whole greedy sequences agree, on every build of the kernels this CPU runs;
    Qwen2's QKV bias, Qwen3's Q/K head norms and int8 layers run in the same single call."""
    c_kernels_or_skip(f"c:{variant}")
    folder = build_tiny_model(kind, tmp_path / kind)
    llm = LLM(str(folder), quantization=mode, kv_dtype="float32", num_page_override=512, kernels=f"c:{variant}")
    try:
        assert_fused_matches_layers(llm, monkeypatch)
    finally:
        llm.shutdown()


def assert_fused_matches_layers(
    llm: LLM, monkeypatch: pytest.MonkeyPatch, steps: int | None = None, max_tokens: int = 16
) -> None:
    """The fused and the layer-by-layer decode agree on greedy tokens and logits over ``steps``
    decode steps (None: all of the ``max_tokens``)."""
    model = llm.scheduler.engine.model
    if model.kernels is None:
        assert model._fused_decoder is None
        pytest.skip("no C kernels here")
    fused_decoder = model._fused_decoder
    assert fused_decoder is not None
    fused_steps: list[int] = []
    monkeypatch.setattr(llm.scheduler, "drafter", None)  # one token a step: the two runs' steps pair up
    monkeypatch.setattr(fused_decoder, "run", lambda *args, run=fused_decoder.run: fused_steps.append(1) or run(*args))
    prompts = [[5, 9, 200, 17, 33], [7, 7, 81, 4], [100, 3]]
    params = SamplingParams(max_tokens=max_tokens if steps is None else steps + 1, ignore_eos=True)
    engine = llm.scheduler.engine
    run_model = engine.run_model
    captured: dict[str, list[torch.Tensor]] = {"fused": [], "layers": []}
    outputs = {}
    for key in ("fused", "layers"):
        if key == "layers":
            monkeypatch.setitem(model.__dict__, "_fused_decoder", None)

        def recording(batch: Batch, key: str = key) -> torch.Tensor:
            logits = run_model(batch)
            if batch.attention is AttentionKind.DECODE:
                captured[key].append(logits.clone())
            return logits

        monkeypatch.setattr(engine, "run_model", recording)
        llm.flush_cache()
        outputs[key] = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert outputs["fused"] == outputs["layers"]
    assert len(captured["fused"]) == len(captured["layers"]) == len(fused_steps) > 0  # every decode step fused
    for fused, layers in zip(captured["fused"], captured["layers"]):
        assert torch.equal(fused.argmax(-1), layers.argmax(-1))
        assert (fused - layers).abs().max() <= 2e-3 * layers.abs().max()
    llm.scheduler.check_accounting()


def test_c_and_torch_kernels_give_the_same_greedy_tokens(smollm: LLM) -> None:
    """The default model in fp32 (the shared fixture runs ``kernels="auto"``: the C kernels here)
    against the same model on torch's kernels only."""
    if smollm.scheduler.engine.kernels is None:
        pytest.skip("the C kernels do not build here: auto ran torch's")
    torch_llm = LLM(num_page_override=512, max_running_req=4, quantization="none", kernels="torch")
    try:
        assert torch_llm.scheduler.engine.kernels is None
        prompts = ["The capital of France is", "def add(a, b):", "1, 2, 3,"]
        params = SamplingParams(max_tokens=10, ignore_eos=True)
        tokens = {}
        for name, llm in (("c", smollm), ("torch", torch_llm)):
            llm.flush_cache()
            tokens[name] = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
        assert tokens["c"] == tokens["torch"]
    finally:
        torch_llm.shutdown()


def test_fused_decode_of_a_model_with_one_sliding_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mistral with a window on every layer: the single call reads each request's last ``WINDOW``
    keys, as the layers do; the sequences run past the window."""
    c_kernels_or_skip()
    folder = build_tiny_model("mistral_window", tmp_path / "mistral")
    llm = LLM(str(folder), quantization="int4", kv_dtype="float32", num_page_override=512)
    try:
        assert_fused_matches_layers(llm, monkeypatch, max_tokens=2 * WINDOW)
    finally:
        llm.shutdown()


# -- bad input -----------------------------------------------------------------------------------
def test_unknown_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="int3"):
        EngineConfig(quantization="int3")


def test_int4_rejects_a_model_its_groups_do_not_fit(tmp_path: Path) -> None:
    folder = build_tiny_model("llama", tmp_path / "odd", hidden_size=48, intermediate_size=96, head_dim=12)
    with pytest.raises(ValueError, match="int4.*48"):
        LLM(str(folder), quantization="int4", num_page_override=64)
    LLM(str(folder), quantization="int8", num_page_override=64).shutdown()  # int8 has no groups


def test_rtn_modes_on_a_hf_folder_track_fp32(tmp_path: Path) -> None:
    folder = build_tiny_model("qwen3", tmp_path / "qwen3")
    ids = list(range(3, 60))
    logits = {}
    for mode in ("none", "int8", "int4"):
        llm = LLM(str(folder), quantization=mode, num_page_override=256)
        logits[mode] = sequence_logits(llm.scheduler.engine.model, ids)
        llm.shutdown()
    spread = logits["none"].std()
    # Relative to the spread of the fp32 logits (unrelated logits would be ~1.4): int8's 255 levels
    # per row, int4's 16 per group of 32 (random weights: measured 0.34, compounding over the layers).
    for mode, bound in (("int8", 0.05), ("int4", 0.6)):
        err = ((logits[mode] - logits["none"]).std() / spread).item()
        assert err < bound, (mode, err)
