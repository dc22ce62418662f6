"""``python -m minisgl serve``: the HTTP front end in this process, the scheduler in a child process."""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from pathlib import Path

import uvicorn
from transformers import AutoTokenizer

from minisgl.config import EngineConfig
from minisgl.models.gguf import DEFAULT_FILE
from minisgl.models.loader import resolve_model_path
from minisgl.server.app import create_app
from minisgl.server.context import ServerContext
from minisgl.server.engine_client import EngineClient
from minisgl.server.metrics import ServerMetrics

logger = logging.getLogger("minisgl.server")


def model_name(model: str | None) -> str:
    if model is None:
        return DEFAULT_FILE.split(".")[0]  # "SmolLM2-135M-Instruct", without the quantization suffix
    path = Path(model)
    return path.stem if path.suffix == ".gguf" else path.name


def serve(args: argparse.Namespace, config: EngineConfig) -> int:
    """Run until SIGINT/SIGTERM (exit 0) or until the scheduler process dies (exit 1)."""
    # Resolve (and for GGUF, convert) once here, so the scheduler process finds a plain folder.
    path = resolve_model_path(config.model)
    logger.info("model %s -> %s", config.model or DEFAULT_FILE, path)
    config = replace(config, model=str(path))
    tokenizer = AutoTokenizer.from_pretrained(str(path))

    def on_engine_death() -> None:
        server.should_exit = True

    level = getattr(logging, args.log_level.upper())
    client = EngineClient(config, on_engine_death, level)
    ctx = ServerContext(
        client=client,
        tokenizer=tokenizer,
        metrics=ServerMetrics(lambda: client.stats),
        model_name=args.served_model_name or model_name(args.model),
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
    )
    app = create_app(ctx, f"http://{args.host}:{args.port}")
    server = uvicorn.Server(
        uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    )
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled, after a clean shutdown
        pass
    if client.dead:
        logger.error("exiting because the scheduler process died")
        return 1
    if not server.started:
        return 1  # start-up failed (port in use, model failed to load); uvicorn logged why
    return 0
