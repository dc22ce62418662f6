"""Joining and leaving the tensor-parallel process group (rendezvous over TCP)."""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from minisgl.config import EngineConfig
from minisgl.distributed.group import TPGroup

logger = logging.getLogger("minisgl.parallel")

# Longest wait for one collective inside a step (and for the rendezvous). A dead peer is noticed at
# once (its sockets close, or rank 0 sees its exit code); this only bounds a peer that is alive but
# stuck. MINISGL_TP_TIMEOUT_S overrides it.
COLLECTIVE_TIMEOUT_S = float(os.environ.get("MINISGL_TP_TIMEOUT_S", "300"))
# Ranks 1..N-1 wait for rank 0's next step header while it is idle, which may be for days.
IDLE_TIMEOUT = timedelta(days=3650)


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
