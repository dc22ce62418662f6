"""The engine's tuning constants, one home for all: figures chosen from a measurement (or, where the
comment says so, by design with no script that re-measures them). Each names the benchmark script
that measures it; re-run that script on a new kind of machine before changing one.

Layer 0: every unit that uses one (layers, attention, models, config, scheduler) can import it.
"""

from __future__ import annotations

# -- quantized products (``layers/quant.py``) ------------------------------------------------------
# The C kernels (``kernels/cpu/quant_gemm.c``) take every row count. Without them (no compiler, or a CPU
# without AVX2), rows up to which torch's weight-only kernels beat expanding the weight to bf16 and
# torch's bf16 GEMM: ``python -m benchmarks.many_rows --kernels torch`` (its "torch faster" column).
# The values are the C kernels' former crossovers, not yet re-measured for torch's kernels.
INT4_MAX_KERNEL_ROWS = 16
INT8_MAX_KERNEL_ROWS = 32
# The bf16 buffer those many-row products expand their weight into (64 MiB): a 1.7B model's largest
# projection (gate/up, 16384 x 2048) in one band, a larger weight band by band. A size by design;
# ``benchmarks.many_rows --kernels torch`` runs the 1.7B shapes with it.
DEQUANT_BUFFER_ELEMENTS = 1 << 25

# -- the MLP (``layers/mlp.py``) ----------------------------------------------------------------------
# Rows of a pass an MLP computes at a time: a prefill pass of MAX_PREFILL_TOKENS rows would otherwise hold
# its gate/up activations (2 x intermediate fp32 per row, and SwiGLU's where it is written out) at once, the
# largest temporaries of a 1-8B model's pass. At least MLP_BAND_ROWS; a narrow MLP takes more, while a band's
# gate/up stays within MLP_BAND_BYTES (fewer passes over its weights): bands of 256 against 512 rows at 135M
# and 1.7B, ``docs/benchmarks/session36-spr/band_rows_ab.py``. Prefill speed and the memory a long prompt
# adds: ``python -m benchmarks.prefill_speed`` (its "peak over loaded" column).
MLP_BAND_ROWS = 256
MLP_BAND_BYTES = 6 << 20


def mlp_band_rows(intermediate: int) -> int:
    """The rows of a band of an MLP whose intermediate size (this rank's part) is ``intermediate``: the
    most whole blocks of 32 rows whose gate/up activations fit MLP_BAND_BYTES, at least MLP_BAND_ROWS."""
    return max(MLP_BAND_ROWS, MLP_BAND_BYTES // (2 * 4 * intermediate) // 32 * 32)


# -- the single-call decode step (``models/decoder.py``, ``kernels/cpu/decode_layer.c``) -----------
# Most requests one fused decode step takes. Its products are the same C kernels as the
# layer-by-layer path's at every row count. By design (64: the largest batch the decode target
# names); decode tok/s by batch: ``python -m benchmarks.throughput_sweep --batch-sizes 16 32 64``.
FUSED_DECODE_MAX_BATCH = 64
# Speculative decoding drafts only while a pass keeps at most this many tokens (its decoding requests
# and their drafts): the harness's copy, multi-turn and shared-prefix workloads with ``minisgl`` against
# ``minisgl-nospec`` (``python -m benchmarks --online minisgl,minisgl-nospec``).
DRAFT_MAX_PASS_ROWS = 16
# Each decode pass's weight in the drafter's fit of pass time against rows (``PassCost``) decays by this
# factor per later pass: the fit follows about the last 1 / (1 - 0.97) = 33 passes, long enough for the row
# counts to vary, short enough to follow a machine whose speed drifts. By design; the harness's copy and
# multi-turn workloads with ``minisgl`` against ``minisgl-nospec`` show its effect.
PASS_COST_DECAY = 0.97

# -- attention (``attention/``) ----------------------------------------------------------------------
# A KV run shared by at least this many slots is attended once for its group (``CascadeDecode``);
# a shorter one is cheaper to gather per request. By design; no script re-measures it.
MIN_SHARED_PREFIX = 64
# Prefix-extending prefills are padded to a common shape per call; a bucket may cost at most this
# many times its unpadded work (query-key pairs) before the next request starts a new bucket. By
# design; no script re-measures it.
MAX_PADDING_COST = 1.5

# -- KV memory (``engine/engine.py``, ``kvcache/window.py``) ---------------------------------------------
# Sliding-window layers' KV slots per full KV slot (``EngineConfig.window_kv_ratio``'s default). A
# running request holds at most about two windows of them; the rest keep the window KV of cached
# prefixes, evicted least recently used first. Tokens that fit against full attention in every layer,
# and the shared-prefix hit rate against a ratio of 1: ``python -m benchmarks.window_memory``.
WINDOW_KV_RATIO = 0.15

# A decoding request that needs a KV slot gets this many positions' slots at once (``CacheManager``),
# so that its keys lie in runs of the pool: decode attention reads consecutive slots faster than
# scattered ones. Measured with 16 requests at 135M, runs of 1 against 32 alternating in one process
# (``docs/benchmarks/session18-amd/kernels.md``); decode tok/s by batch after a change:
# ``python -m benchmarks.throughput_sweep --batch-sizes 16 32``.
DECODE_RUN = 32

# -- prefill planning (``scheduler/prefill.py``, ``config.py``) --------------------------------------
# Token budget of one prefill pass (``EngineConfig.max_prefill_tokens``'s default): longer prompts are
# chunked. Time to first token under load by prompt length: ``python -m benchmarks.mixed_load``;
# throughput: ``python -m benchmarks.throughput_sweep``.
MAX_PREFILL_TOKENS = 2048
# ... but a pass's hidden states (tokens x hidden size) stay within this many values: a model with a
# hidden size over 1,024 gets a smaller default budget (1,024 tokens at 2,048, 512 at 4,096, like
# llama.cpp's micro-batch), because a pass's temporaries grow with both and are what a long prompt
# adds to the server's memory; the GEMMs run as fast at those row counts. Prefill time and that
# memory: ``python -m benchmarks.prefill_speed`` (its "peak over loaded" column).
MAX_PREFILL_ACTIVATIONS = 1 << 21
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
# The logits a pass keeps for requests that score their prompt (``SamplingParams.prompt_logprobs``: every
# prompt token's): at most this many values (128 MiB of fp32), so at most this many over the vocabulary size
# of such tokens per pass (682 at SmolLM2's 49,152). By design; no script re-measures it.
MAX_SCORED_LOGITS = 1 << 25
# A waiting request that shares at least this many uncached tokens with one being prefilled now
# waits one round and then reuses that request's KV instead of computing the same prefix again.
# By design; no script re-measures it.
SHARED_PREFIX_MIN = 32

# -- streaming (``server/scheduler_process.py``) -------------------------------------------------------
# A decode step's tokens wait up to this long for the next steps' and go to the front end in one message
# (a request's first and last tokens, and tokens before a prefill or an idle loop, go at once): each
# message wakes the front end and the client, which on a 2-core CPU share the cores with the model's
# threads, and a thread of the model that loses its core stalls the other at the next barrier, so each
# message costs the model about twice the CPU it takes. 50 ms: 20 updates a second, about three frames of a
# 60 Hz screen; a model that decodes fewer than 20 tokens a second still sends every token as it comes. One
# user of the default model keeps 0.97-0.98 of its offline speed through the server on the Intel VM, against
# 0.92-0.95 with 20 ms (session 38's Benchmarks entry).
# ``--stream-interval-ms`` overrides it (0: every token as it comes). One user through the server against
# offline, with and without: ``python -m benchmarks.paired --systems offline:minisgl,minisgl --serve
# 'i20=--stream-interval-ms 20' --serve 'per-token=--stream-interval-ms 0' --workloads single-stream``.
STREAM_INTERVAL_MS = 50
