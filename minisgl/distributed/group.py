"""A rank's membership in the tensor-parallel group and the collectives the sharded model calls
(joining and leaving the group is ``minisgl.parallel.rendezvous``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from minisgl.distributed.sharding import even_range


@dataclass
class TPGroup:
    """One rank's membership in the tensor-parallel group.

    Model collectives (all-reduce, logits gather) and the batch payload go over the default group
    (gloo on CPU, NCCL on CUDA); the small step header goes over ``control``, a gloo group with no
    practical timeout, which is what idle ranks block on."""

    rank: int
    size: int
    local_rank: int
    device: torch.device
    control: dist.ProcessGroup

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        return x

    def gather_vocab(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Each rank's [rows, its vocab range] logits → [rows, vocab] on rank 0 (other ranks get
        their own shard back). Shards differ by at most one column: padded for the gather."""
        if logits.shape[0] == 0:  # a prefill chunk that samples nothing, the same on every rank
            return logits.new_empty(0, vocab_size)
        width = even_range(vocab_size, self.size, 0)[1]
        if logits.shape[1] < width:
            logits = torch.nn.functional.pad(logits, (0, width - logits.shape[1]))
        logits = logits.contiguous()
        if self.rank != 0:
            dist.gather(logits, None, dst=0)
            return logits
        parts = [torch.empty_like(logits) for _ in range(self.size)]
        dist.gather(logits, parts, dst=0)
        sizes = [end - start for start, end in (even_range(vocab_size, self.size, r) for r in range(self.size))]
        return torch.cat([p[:, :n] for p, n in zip(parts, sizes)], dim=1)
