"""The contract between the scheduler and the engine: one forward pass as tensors, and the
attention context the model's layers call.

A ``Batch`` is self-contained: the engine, the attention backends and the tensor-parallel ranks read
nothing else (no request objects), so a backend can be driven with a hand-built batch. Requests are
laid out one after another in the token dimension; request ``i`` owns ``extend_lens[i]`` tokens at
positions ``prefix_lens[i] ..`` whose KV the page table's row ``table_rows[i]`` maps to slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Protocol

import torch

from minisgl.sampling import SamplingParams

if TYPE_CHECKING:
    from minisgl.constrained.matcher import Grammar


class AttentionKind(Enum):
    """The shape of a pass's attention, from which a backend picks its strategy. It says nothing of
    what the pass is booked as: a decode pass after a jump-forward is ``EXTEND``."""

    EXTEND = 0  # some request adds several tokens, or is not sampled: causal attention over them
    DECODE = 1  # every request adds one token and is sampled: one query row per request


@dataclass
class SamplingRows:
    """Per sampled row of a batch: its parameters and generator (None: greedy or unseeded)."""

    params: list[SamplingParams] = field(default_factory=list)
    generators: list[torch.Generator | None] = field(default_factory=list)
    grammars: list[Grammar | None] = field(default_factory=list)  # constrained rows' matchers
    # A penalized row's request's output before the token it samples (its draft's tokens before it included);
    # None for the other rows (``SamplingParams.penalized``).
    outputs: list[list[int] | None] = field(default_factory=list)


@dataclass
class ScoringRows:
    """Per scored row of a batch (a prompt token's, of a request with ``SamplingParams.prompt_logprobs``):
    the prompt token after it, whose log-probability its logits give."""

    next_ids: list[int] = field(default_factory=list)
    top: int = 0  # the most likely tokens reported per row: the most that any of their requests asks for


@dataclass(frozen=True)
class Batch:
    attention: AttentionKind
    input_ids: torch.Tensor  # [tokens] on the device
    positions: torch.Tensor  # [tokens] on the device
    out_slots: torch.Tensor  # [tokens] KV slots the new tokens' K/V are written to, on the device
    table_rows: torch.Tensor  # [requests] page-table row of each request (CPU int64)
    prefix_lens: torch.Tensor  # [requests] tokens whose KV is in the pool before this pass (CPU int64)
    extend_lens: torch.Tensor  # [requests] new tokens this pass (CPU int64)
    sample_rows: torch.Tensor  # [sampled] rows of the token dimension whose logits are sampled, on the device
    sampling: SamplingRows = field(default_factory=SamplingRows)  # one entry per sampled row (rank 0 only)
    # [scored] rows of the token dimension whose logits score the prompt token after them (CPU int64), and
    # what they score (rank 0 only); none but in prefill passes of requests that ask for prompt log-probabilities
    score_rows: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    scoring: ScoringRows = field(default_factory=ScoringRows)
    # The first rows of the token dimension that are prefill (prompt or extension) tokens; the rest decode a
    # token each (with its drafts). Where the products have a path for prefill rows (the C kernels' amx
    # build), each row takes its kind's, so that a row's arithmetic never depends on what shares its pass.
    prefill_tokens: int = 0

    @property
    def num_reqs(self) -> int:
        return self.table_rows.numel()

    @property
    def logit_rows(self) -> torch.Tensor:
        """The rows whose logits a pass computes: the sampled ones, then the scored ones (on the device)."""
        if not self.score_rows.numel():
            return self.sample_rows
        return torch.cat([self.sample_rows, self.score_rows.to(self.sample_rows.device)])

    @property
    def kv_lens(self) -> torch.Tensor:
        """[requests] KV length of each request once this pass has run (CPU int64)."""
        return self.prefix_lens + self.extend_lens


@dataclass(frozen=True)
class PagedKV:
    """A decode batch whose keys and values are read in place from the paged pool: what a model
    that runs its whole decode step as one kernel call needs instead of ``attend``."""

    k_pool: torch.Tensor  # [layers, slots, kv_heads, dim]
    v_pool: torch.Tensor
    out_slots: torch.Tensor  # [requests] the slot each new token's K/V goes to
    kv_slots: torch.Tensor  # [requests, n] the slots of each request's keys ...
    kv_lens: torch.Tensor  # [requests] ... of which the first kv_lens[b] are attended


class AttentionContext(Protocol):
    """What a layer needs from the attention backend for the current batch."""

    # Set where decode reads the pool in place (fp32 on the CPU with the C kernels), else None.
    paged: PagedKV | None

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q``: [tokens, heads, dim], ``k``/``v``: [tokens, kv_heads, dim] of the new tokens
        (stored into the KV pool by the backend) → [tokens, heads * dim]."""
        ...
