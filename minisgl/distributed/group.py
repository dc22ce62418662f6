"""Process groups and the collectives the sharded model calls."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from minisgl.config import EngineConfig
from minisgl.distributed.sharding import even_range

logger = logging.getLogger("minisgl.distributed")

# Longest wait for one collective inside a step (and for the rendezvous). A dead peer is noticed at
# once (its sockets close, or rank 0 sees its exit code); this only bounds a peer that is alive but
# stuck. MINISGL_TP_TIMEOUT_S overrides it.
COLLECTIVE_TIMEOUT_S = float(os.environ.get("MINISGL_TP_TIMEOUT_S", "300"))
# Ranks 1..N-1 wait for rank 0's next step header while it is idle, which may be for days.
IDLE_TIMEOUT = timedelta(days=3650)


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


def local_init_method() -> str:
    """A rendezvous address on this machine (single node): a free TCP port on the loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def rank_device(config: EngineConfig, local_rank: int) -> torch.device:
    device = config.torch_device
    if device.type == "cuda":
        return torch.device("cuda", local_rank)
    return device


def init_group(config: EngineConfig, rank: int, init_method: str) -> TPGroup:
    """Join the group (blocks until all ``config.tp_size`` ranks have joined)."""
    local_rank = rank % config.tp_per_node
    device = rank_device(config, local_rank)
    if dist.is_initialized():
        raise RuntimeError(
            "this process already belongs to a torch.distributed group: one tensor-parallel engine per process"
        )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=config.tp_size,
        timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    logger.info("tensor-parallel rank %d of %d joined (%s on %s)", rank, config.tp_size, backend, device)
    return TPGroup(rank, config.tp_size, local_rank, device, control)


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
