"""One decoder-only transformer for every supported family.

Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE and Gemma 3 differ in the switches of their class's
``DecoderStyle`` and in what their config sets, so they share this file instead of copying it:
``qkv_bias`` (Qwen2 adds a bias to the Q/K/V projections), ``qk_norm`` (Qwen3, Gemma 3
RMS-normalise each head of Q and K before RoPE), Gemma's norms (``gemma_norms``: a gain of
1 + weight, norms after attention and after the MLP too, embeddings scaled by sqrt(hidden)), sparse
MoE blocks in place of the dense MLP (Qwen3-MoE) and a per-layer sliding window (Mistral, Gemma 3),
which the attention backend applies (``ModelConfig.layer_windows``). From the config: the MLP's
activation, the query scale, the sliding layers' own RoPE base and the final logits' soft-capping.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from minisgl.batch import AttentionContext
from minisgl.distributed.sharding import HeadShard, even_range, shard_heads
from minisgl.kernels.native import CpuKernels, FusedDecoder, LayerWeights, RoundedRows
from minisgl.layers.embedding import VocabEmbedding
from minisgl.layers.linear import Linear, column, row
from minisgl.layers.mlp import GatedMLP
from minisgl.layers.moe import SparseMoE
from minisgl.layers.norm import RMSNorm
from minisgl.layers.quant import QuantizedWeight
from minisgl.layers.rotary import Rope, RotaryEmbedding, apply_rotary
from minisgl.models.config import ModelConfig
from minisgl.tuning import FUSED_DECODE_MAX_BATCH

if TYPE_CHECKING:
    from minisgl.distributed.group import TPGroup


@dataclass(frozen=True)
class DecoderStyle:
    """What a family changes in the shared decoder's layers (its config sets the rest)."""

    qkv_bias: bool = False  # Qwen2: a bias on the Q/K/V projections
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm on each head of Q and K before RoPE
    # Gemma: every RMSNorm's gain is 1 + weight; the attention and MLP outputs are normalised too
    # before they join the residual stream (the sandwich); embeddings are scaled by sqrt(hidden).
    gemma_norms: bool = False


def local_heads(cfg: ModelConfig, tp: TPGroup | None) -> HeadShard:
    """The query and KV heads this rank computes: all of them without tensor parallelism."""
    if tp is None:
        return HeadShard((0, cfg.num_heads), (0, cfg.num_kv_heads))
    return shard_heads(cfg.num_heads, cfg.num_kv_heads, tp.size, tp.rank)


class Attention(nn.Module):
    kernels: CpuKernels | None = None  # the engine's, for RoPE (``DecoderForCausalLM.use_kernels``); None: torch's

    def __init__(self, cfg: ModelConfig, layer_id: int, style: DecoderStyle, tp: TPGroup | None) -> None:
        super().__init__()
        self.layer_id = layer_id
        heads, d = local_heads(cfg, tp), cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = heads.num_q, heads.num_kv, d
        q_size, kv_size = self.num_heads * d, self.num_kv_heads * d
        self.split_sizes = [q_size, kv_size, kv_size]
        # Column-parallel QKV over this rank's heads, row-parallel output projection.
        q_rows, kv_rows = (heads.q[0] * d, heads.q[1] * d), (heads.kv[0] * d, heads.kv[1] * d)
        full_q, full_kv = cfg.num_heads * d, cfg.num_kv_heads * d
        bias = style.qkv_bias or cfg.attention_bias
        self.qkv_proj = Linear(cfg.hidden_size, full_q + 2 * full_kv, bias, column(tp, q_rows, kv_rows, kv_rows))
        self.o_proj = Linear(full_q, cfg.hidden_size, partition=row(tp, q_rows))
        offset = style.gemma_norms
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, offset) if style.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, offset) if style.qk_norm else None
        # The backends scale scores by head_dim ** -0.5: a config's other scale is folded into the queries.
        scalar = cfg.query_pre_attn_scalar
        self.q_scale = None if scalar is None or scalar == d else (d / scalar) ** 0.5

    def forward(
        self, x: torch.Tensor | RoundedRows, rope: Rope, ctx: AttentionContext, prefill_rows: int = 0
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x, prefill_rows)
        tokens, (q_size, kv_size, _) = qkv.shape[0], self.split_sizes
        if self.q_norm is None or self.k_norm is None:
            # Q and K lie side by side in the fused projection: one rotation for both heads.
            qk = apply_rotary(qkv[:, : q_size + kv_size].view(tokens, -1, self.head_dim), rope, self.kernels)
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        else:
            q = self.q_norm(qkv[:, :q_size].view(tokens, self.num_heads, self.head_dim))
            k = self.k_norm(qkv[:, q_size : q_size + kv_size].view(tokens, self.num_kv_heads, self.head_dim))
            q, k = apply_rotary(q, rope, self.kernels), apply_rotary(k, rope, self.kernels)
        if self.q_scale is not None:
            q = q * self.q_scale
        v = qkv[:, q_size + kv_size :].view(tokens, self.num_kv_heads, self.head_dim)
        return self.o_proj(ctx.attend(self.layer_id, q, k, v), prefill_rows)


def mlp(cfg: ModelConfig, layer_id: int, tp: TPGroup | None) -> nn.Module:
    """A layer's feed-forward block: sparse MoE where the config makes the layer sparse, else dense."""
    moe = cfg.moe
    if moe is not None and moe.is_sparse(layer_id):
        part = intermediate_range(moe.intermediate_size, tp)
        return SparseMoE(
            cfg.hidden_size, moe.num_experts, moe.top_k, moe.intermediate_size, moe.norm_topk_prob, tp, part
        )
    part = intermediate_range(cfg.intermediate_size, tp)
    return GatedMLP(cfg.hidden_size, cfg.intermediate_size, tp, part, activation=cfg.hidden_act)


def intermediate_range(size: int, tp: TPGroup | None) -> tuple[int, int]:
    """The slice of an MLP's intermediate dimension this rank holds: all of it without TP."""
    return even_range(size, tp.size, tp.rank) if tp is not None else (0, size)


def normed(
    norm: RMSNorm, consumer: Linear | None, delta: torch.Tensor | None, residual: torch.Tensor, prefill_rows: int
) -> tuple[torch.Tensor | RoundedRows, torch.Tensor]:
    """(norm(residual + delta), residual + delta), or without ``delta`` (norm(residual), residual): the
    normed rows rounded by the norm itself where ``consumer``, the product they go to, takes them so
    (``Linear.takes_rounded``: the C kernels' integer products, which would round them first), else fp32."""
    if consumer is not None and consumer.takes_rounded(prefill_rows):
        rounded = norm.add_forward_rounded(delta, residual)
        if rounded is not None:
            return rounded
    return (norm(residual), residual) if delta is None else norm.add_forward(delta, residual)


class DecoderLayer(nn.Module):
    """Llama's layer: the norm before attention, and ``post_attention_layernorm`` before the MLP.
    With Gemma's norms, ``post_attention_layernorm`` normalises the attention's output and
    ``pre_feedforward_layernorm`` / ``post_feedforward_layernorm`` come before and after the MLP."""

    def __init__(self, cfg: ModelConfig, layer_id: int, style: DecoderStyle, tp: TPGroup | None) -> None:
        super().__init__()
        hidden, eps, offset = cfg.hidden_size, cfg.rms_norm_eps, style.gemma_norms
        self.input_layernorm = RMSNorm(hidden, eps, offset)
        self.self_attn = Attention(cfg, layer_id, style, tp)
        self.post_attention_layernorm = RMSNorm(hidden, eps, offset)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps, offset) if style.gemma_norms else None
        self.post_feedforward_layernorm = RMSNorm(hidden, eps, offset) if style.gemma_norms else None
        self.mlp = mlp(cfg, layer_id, tp)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, rope: Rope, ctx: AttentionContext, prefill_rows: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it): the caller adds the two, in
        the next layer's norm, so that each add and norm is one call. ``residual`` is None for the
        first layer, whose input is the residual stream itself. The first ``prefill_rows`` rows are
        prefill tokens (``Batch.prefill_tokens``)."""
        if residual is None:
            h, residual = normed(self.input_layernorm, self.self_attn.qkv_proj, None, x, prefill_rows)
        else:
            h, residual = normed(self.input_layernorm, self.self_attn.qkv_proj, x, residual, prefill_rows)
        attn = self.self_attn(h, rope, ctx, prefill_rows)
        if self.pre_feedforward_layernorm is None or self.post_feedforward_layernorm is None:
            gate_up = self.mlp.gate_up_proj if isinstance(self.mlp, GatedMLP) else None
            h, residual = normed(self.post_attention_layernorm, gate_up, attn, residual, prefill_rows)
            return self.mlp(h, prefill_rows), residual
        h, residual = self.pre_feedforward_layernorm.add_forward(self.post_attention_layernorm(attn), residual)
        return self.post_feedforward_layernorm(self.mlp(h, prefill_rows)), residual

    def fused_weights(self) -> LayerWeights | None:
        """This layer for ``decode_layer.c``, if it is a kind it runs: a dense SwiGLU MLP, Llama's two
        norms, the default query scale, no sharding, every projection int4 or int8 (a multiple of 32
        input columns), fp32 norms of one eps; a bias on the QKV projection only (Qwen2), Q/K head
        norms or none (Qwen3)."""
        attn, mlp = self.self_attn, self.mlp
        if not isinstance(mlp, GatedMLP) or mlp.activation != "silu":
            return None
        if self.pre_feedforward_layernorm is not None or self.input_layernorm.unit_offset or attn.q_scale is not None:
            return None
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        weights = [m.quantized for m in linears]
        if any(m.partition is not None for m in linears) or any(m.bias is not None for m in linears[1:]):
            return None
        head_norms = (attn.q_norm, attn.k_norm) if attn.q_norm is not None and attn.k_norm is not None else ()
        norms = (self.input_layernorm, self.post_attention_layernorm, *head_norms)
        fp32 = all(n.weight.dtype == torch.float32 and n.weight.is_cpu for n in norms)
        if len({n.eps for n in norms}) != 1 or not fp32:
            return None
        bias = attn.qkv_proj.bias
        if bias is not None and (bias.dtype != torch.float32 or not bias.is_cpu):
            return None
        buffers = [b for w in weights if w is not None and (b := w.kernel_buffers()) is not None]
        if len(buffers) != len(linears):
            return None
        down = weights[3]
        assert down is not None
        q_norm, k_norm = (n.weight.detach() for n in head_norms) if head_norms else (None, None)
        return LayerWeights(
            down.out_features, attn.num_heads, attn.num_kv_heads, attn.head_dim, down.in_features, norms[0].eps,
            norms[0].weight.detach(), norms[1].weight.detach(), *buffers,
            qkv_bias=None if bias is None else bias.detach(), q_norm=q_norm, k_norm=k_norm,
        )  # fmt: skip


def vocab_range(cfg: ModelConfig, tp: TPGroup) -> tuple[int, int]:
    return even_range(cfg.vocab_size, tp.size, tp.rank)


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int, style: DecoderStyle, tp: TPGroup | None) -> None:
        super().__init__()
        vocab = column(tp, vocab_range(cfg, tp)) if tp is not None else None
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, vocab)
        # Gemma multiplies the embeddings by sqrt(hidden) rounded to the model's dtype.
        self.embed_scale = cfg.hidden_size**0.5 if style.gemma_norms else None
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        # Gemma 3's sliding-window layers rotate with their own base, unscaled.
        windowed = [w is not None for w in cfg.layer_windows]
        self.local_rotary = (
            RotaryEmbedding(cfg.head_dim, max_positions, cfg.local_rope_theta, None)
            if cfg.local_rope_theta is not None and any(windowed)
            else None
        )
        self.local_rope_layers = windowed
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, style, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, style.gemma_norms)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        return x if self.embed_scale is None else x * torch.tensor(self.embed_scale, dtype=x.dtype)

    def ropes(self, positions: torch.Tensor, dtype: torch.dtype) -> list[Rope]:
        """Each layer's cos/sin for ``positions``: looked up once per pass for each base."""
        full = self.rotary.table(positions, dtype)
        if self.local_rotary is None:
            return [full] * len(self.layers)
        local = self.local_rotary.table(positions, dtype)
        return [local if is_local else full for is_local in self.local_rope_layers]


class DecoderForCausalLM(nn.Module):
    """Hidden states for every new token; logits only for the rows that are sampled.

    With a tensor-parallel group ``tp`` the model holds one rank's shard (Megatron-style): heads and
    MLP columns split, vocabulary split for the embedding and the LM head, whose logits are gathered
    on rank 0 (other ranks get their own shard back)."""

    style: ClassVar[DecoderStyle] = DecoderStyle()
    kernels: CpuKernels | None = None  # the engine's C kernels (``use_kernels``); None: torch's

    def __init__(self, cfg: ModelConfig, max_positions: int, tp: TPGroup | None = None) -> None:
        super().__init__()
        self.config, self.tp = cfg, tp
        self.model = DecoderModel(cfg, max_positions, self.style, tp)
        vocab = column(tp, vocab_range(cfg, tp)) if tp is not None else None
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, partition=vocab)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def device(self) -> torch.device:
        """Where the model runs: its final norm's weight's device (no quantization replaces a norm)."""
        return self.model.norm.weight.device

    def use_kernels(self, kernels: CpuKernels | None) -> None:
        """Run the C kernels ``kernels`` (None: torch's) wherever this model has a choice: its norms,
        its quantized weights, its RoPE and its fused decode step. Called once by the loader, before any pass."""
        self.kernels = kernels
        for module in self.modules():
            if isinstance(module, (RMSNorm, QuantizedWeight, Attention)):
                module.kernels = kernels
        if self.lm_head.quantized is not None:
            # Its logits are what is sampled, and it is one product of a pass against every layer's
            # several: x keeps two int8 digits there.
            self.lm_head.quantized.digits = 2

    @cached_property
    def _fused_decoder(self) -> FusedDecoder | None:
        """The decode step as one C call, where every layer can run in ``decode_layer.c``: decided
        at the first forward pass, once the loader has installed the quantized weights."""
        kernels = self.kernels
        if kernels is None or self.tp is not None or self.model.local_rotary is not None:
            return None
        layers = [layer.fused_weights() for layer in self.model.layers]
        if any(w is None for w in layers):
            return None
        return kernels.fused_decoder([w for w in layers if w is not None])

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        logit_rows: torch.Tensor,
        prefill_rows: int = 0,
    ) -> torch.Tensor:
        """Logits of ``logit_rows``; the first ``prefill_rows`` tokens are prefill tokens (``Batch.prefill_tokens``)."""
        x = self.model.embed(input_ids)
        ropes = self.model.ropes(positions, x.dtype)
        fused, paged = self._fused_decoder, ctx.paged
        if fused is not None and paged is not None and x.dtype == torch.float32 and len(x) <= FUSED_DECODE_MAX_BATCH:
            # The same layers in one C call (decode_layer.c): at one request the Python and small
            # ops between the kernels were a third of the step. Every layer has the same rope then.
            cos, sin = (t.reshape(len(x), -1) for t in ropes[0])  # [tokens, 1, d] broadcast rows → [tokens, d]
            pools = (paged.k_pool, paged.v_pool)
            x, residual = fused.run(x, cos, sin, *pools, paged.out_slots, paged.kv_slots, paged.kv_lens)
        else:
            residual = None
            for layer, rope in zip(self.model.layers, ropes):
                x, residual = layer(x, residual, rope, ctx, prefill_rows)
        # The final norm and LM head are per row: compute them only where a token is sampled.
        assert residual is not None, "a model has at least one layer"
        logits = self.lm_head(self.model.norm.add_forward(x[logit_rows], residual[logit_rows])[0])
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits if self.tp is None else self.tp.gather_vocab(logits, self.config.vocab_size)
