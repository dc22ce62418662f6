"""Ranks 1..N-1: join the group, load their shard, then run whatever batch rank 0 broadcasts."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from minisgl.config import EngineConfig

if TYPE_CHECKING:
    from minisgl.engine.engine import Engine

logger = logging.getLogger("minisgl.distributed")


def _exit_with_parent(parent_pid: int) -> None:
    """A rank whose parent is gone exits, even from inside a blocking collective."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            sys.stderr.write(f"minisgl: tensor-parallel rank {os.getpid()}'s parent {parent_pid} is gone; exiting\n")
            os._exit(1)


def serve_batches(engine: Engine) -> None:
    """The rank loop: receive a batch, run the model (its collectives pair with rank 0's), repeat
    until rank 0 sends the shutdown message."""
    assert engine.sync is not None
    with torch.inference_mode():
        while (batch := engine.sync.recv()) is not None:
            engine.run_model(batch)


def run_worker(rank: int, config: EngineConfig, model_path: str, parent_pid: int, log_level: int) -> None:
    """Entry point of a spawned rank process."""
    from minisgl.distributed.group import leave_group
    from minisgl.engine.engine import Engine

    # Ctrl-C reaches the whole process group; rank 0 decides when the ranks stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format=f"%(asctime)s rank{rank} %(name)s: %(message)s")
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    engine = None
    try:
        engine = Engine(config, Path(model_path), rank=rank)
        serve_batches(engine)
    except Exception:
        logger.exception("tensor-parallel rank %d failed", rank)
        sys.exit(1)
    finally:
        if engine is not None:
            engine.shutdown()
        leave_group()
    logger.info("tensor-parallel rank %d stopped", rank)


def run_node(config: EngineConfig) -> None:
    """A node other than node 0 (``--node-rank`` > 0): its ranks only, no scheduler, no front end.
    The process runs the node's first rank itself and spawns the others."""
    from minisgl.engine.engine import Engine
    from minisgl.models.loader import resolve_model_path

    path = resolve_model_path(config.model)
    rank = config.node_rank * config.tp_per_node
    engine = Engine(config, path, rank=rank)
    logger.info("node %d: ranks %d..%d serving", config.node_rank, rank, rank + config.tp_per_node - 1)
    try:
        serve_batches(engine)
    finally:
        engine.shutdown()
