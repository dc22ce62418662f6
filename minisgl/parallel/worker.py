"""Ranks 1..N-1 of a node: join the group, load their shard, then run whatever batch rank 0 broadcasts."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from minisgl.config import EngineConfig
from minisgl.engine.engine import Engine
from minisgl.parallel.rendezvous import init_group, leave_group
from minisgl.parallel.sync import BatchSync

logger = logging.getLogger("minisgl.parallel")


def _exit_with_parent(parent_pid: int) -> None:
    """A rank whose parent is gone exits, even from inside a blocking collective."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            sys.stderr.write(f"minisgl: tensor-parallel rank {os.getpid()}'s parent {parent_pid} is gone; exiting\n")
            os._exit(1)


def run_worker(rank: int, config: EngineConfig, model_path: str, parent_pid: int, log_level: int) -> None:
    """Entry point of a spawned rank process."""
    # Ctrl-C reaches the whole process group; rank 0 decides when the ranks stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format=f"%(asctime)s rank{rank} %(name)s: %(message)s")
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    try:
        tp = init_group(config, rank, f"tcp://{config.dist_init_addr}")
        sync = BatchSync(tp, Engine(config, Path(model_path), tp))
        sync.ready()
        sync.serve()
    except Exception:
        logger.exception("tensor-parallel rank %d failed", rank)
        sys.exit(1)
    finally:
        leave_group()
    logger.info("tensor-parallel rank %d stopped", rank)
