"""The engine's tuning constants, one home for all: figures chosen from a measurement (or, where the
comment says so, by design with no script that re-measures them). Each names the benchmark script
that measures it; re-run that script on a new kind of machine before changing one.

Layer 0: every unit that uses one (layers, attention, models, config, scheduler) can import it.
"""

from __future__ import annotations

import logging
import time
from functools import cache

import torch

logger = logging.getLogger("minisgl.tuning")

# -- quantized products (``layers/quant.py``) ------------------------------------------------------
# Rows up to which the integer kernels (``kernels/cpu/quant_gemm.c``, the weight streamed once per 4
# rows) beat expanding the weight to bf16 and torch's bf16 GEMM: ``python -m benchmarks.many_rows``
# (its "faster" column, at the 135M and 1.7B shapes; ``--kernels c:avx2`` for the AVX2 build).
INT4_MAX_KERNEL_ROWS = 16
INT8_MAX_KERNEL_ROWS = 32
# The buffer the many-row products expand their weight into (64 MiB): a 1.7B model's largest
# projection (gate/up, 16384 x 2048) in one band in bf16, two in fp32; a larger weight band by band.
# A size by design; ``benchmarks.many_rows`` runs the 1.7B shapes with it.
DEQUANT_BUFFER_BYTES = 1 << 26
# The many-row products' GEMM runs in bf16 unless fp32 takes at most this fraction of bf16's time on
# the host (``many_row_gemm_dtype``). Where oneDNN has AMX-BF16, or 512-bit bf16 dot products that
# do twice the work of its fp32 FMAs (AMD Zen 4), bf16 wins; an Intel CPU without AMX does no more
# bf16 than fp32 work per cycle and pays the casts, so fp32 wins there. The margin keeps a host
# whose two are close on bf16 from run to run. ``python -m benchmarks.many_rows`` prints both.
FP32_GEMM_MARGIN = 0.8
# The shape it is measured on, rows x in -> out: a prefill chunk through a mid-sized projection.
GEMM_PROBE_SHAPE = (256, 1024, 1024)

# -- the single-call decode step (``models/decoder.py``, ``kernels/cpu/decode_layer.c``) -----------
# Most requests one fused decode step takes: its products are the int4 kernels, so past their
# crossover (``INT4_MAX_KERNEL_ROWS``, ``benchmarks.many_rows``) the layer-by-layer path, whose
# products switch to bf16 GEMM, is faster.
FUSED_DECODE_MAX_BATCH = INT4_MAX_KERNEL_ROWS

# -- attention (``attention/``) ----------------------------------------------------------------------
# A KV run shared by at least this many slots is attended once for its group (``CascadeDecode``);
# a shorter one is cheaper to gather per request. By design; no script re-measures it.
MIN_SHARED_PREFIX = 64
# Prefix-extending prefills are padded to a common shape per call; a bucket may cost at most this
# many times its unpadded work (query-key pairs) before the next request starts a new bucket. By
# design; no script re-measures it.
MAX_PADDING_COST = 1.5

# -- prefill planning (``scheduler/prefill.py``, ``config.py``) --------------------------------------
# Token budget of one prefill pass (``EngineConfig.max_prefill_tokens``'s default): longer prompts are
# chunked. Time to first token under load by prompt length: ``python -m benchmarks.mixed_load``;
# throughput: ``python -m benchmarks.throughput_sweep``.
MAX_PREFILL_TOKENS = 2048
# Fairness under mixed load: waiting prompts of at most 1/SHORT_PROMPT_DIVISOR of the token budget
# are admitted first, in arrival order, with up to 1/SHORT_LANE_DIVISOR of each pass's budget. A
# short prompt then waits about one pass, not behind every long prompt (and chunk) queued before it;
# long prompts keep the rest of every pass, and all of it while no short prompt waits.
# ``python -m benchmarks.mixed_load`` (p50 / p99 TTFT, in passes, by prompt-length bucket).
SHORT_PROMPT_DIVISOR = 8
SHORT_LANE_DIVISOR = 4
# Past this many waiting requests LPM's per-request prefix match would dominate: fall back to FCFS.
# By design; no script re-measures it.
LPM_MAX_QUEUE = 128
# A waiting request that shares at least this many uncached tokens with one being prefilled now
# waits one round and then reuses that request's KV instead of computing the same prefix again.
# By design; no script re-measures it.
SHARED_PREFIX_MIN = 32


def faster_gemm_dtype(bf16_seconds: float, fp32_seconds: float) -> torch.dtype:
    """The many-row GEMM's dtype given the two measured times (see ``FP32_GEMM_MARGIN``)."""
    return torch.float32 if fp32_seconds <= FP32_GEMM_MARGIN * bf16_seconds else torch.bfloat16


@cache
def many_row_gemm_dtype() -> torch.dtype:
    """bf16 or fp32 for the quantized many-row products, measured once per process on torch's GEMM
    at ``GEMM_PROBE_SHAPE`` (tens of milliseconds) with this process's threads."""
    rows, k, n = GEMM_PROBE_SHAPE
    seconds = {}
    for dtype in (torch.bfloat16, torch.float32):
        x, w = torch.randn(rows, k).to(dtype), torch.randn(n, k).to(dtype)
        torch.nn.functional.linear(x, w)  # warm-up: oneDNN builds its kernel
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            torch.nn.functional.linear(x, w)
            best = min(best, time.perf_counter() - start)
        seconds[dtype] = best
    chosen = faster_gemm_dtype(seconds[torch.bfloat16], seconds[torch.float32])
    flops = 2 * rows * k * n
    logger.info(
        "many-row GEMM in %s (measured %.0f GFLOP/s bf16, %.0f fp32)",
        "fp32" if chosen == torch.float32 else "bf16",
        flops / seconds[torch.bfloat16] / 1e9,
        flops / seconds[torch.float32] / 1e9,
    )
    return chosen
