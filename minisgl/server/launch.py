"""``python -m minisgl serve``: the HTTP front end in this process, the scheduler in a child process.

The front end never loads torch (only the scheduler process runs the model), and it starts the
scheduler process first: loading the model then overlaps the front end's own imports and tokenizer."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from minisgl.config import EngineConfig
from minisgl.kernels.build import start_build
from minisgl.models.gguf import DEFAULT_FILE
from minisgl.models.source import generation_defaults, load_tokenizer, resolve_model_path
from minisgl.server.args import api_key_from
from minisgl.server.engine_client import EngineClient

logger = logging.getLogger("minisgl.server")


def model_name(model: str | None) -> str:
    if model is None:
        return DEFAULT_FILE.split(".")[0]  # "SmolLM2-135M-Instruct", without the quantization suffix
    path = Path(model)
    return path.stem if path.suffix == ".gguf" else path.name


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def _stops_deferred() -> Iterator[None]:
    """A SIGINT or SIGTERM during the block is remembered and raised as a KeyboardInterrupt once the block
    is done. Raised inside an import, it would leave half-imported modules behind (anyio's, seen), which can
    break the interpreter's exit; the block's imports take seconds at most. (A signal mask would not do:
    the kernel hands the signal to another thread, zmq's, and Python still runs its handler.)"""
    requested: list[int] = []
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: requested.append(signum)) for s in stops}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if requested:
        raise KeyboardInterrupt


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    return sock


def serve(args: argparse.Namespace, config: EngineConfig) -> int:
    """Run until SIGINT/SIGTERM (exit 0) or until the scheduler process dies (exit 1)."""
    level = getattr(logging, args.log_level.upper())
    logging.getLogger("minisgl").setLevel(level)
    api_key = api_key_from(args)  # a bad key file fails before anything starts
    sock = _bind(args.host, args.port)  # before the model loads: a busy port fails in a second, not after it
    if config.device != "cuda":  # a first start compiles the C kernels meanwhile; the scheduler process waits for them
        start_build(config.kernels)
    # Resolve (and for GGUF, convert) once here, so the scheduler process finds the converted folder
    # cached; it keeps the GGUF file itself as the model, since quantization="auto" reads its blocks.
    path = resolve_model_path(config.model)
    logger.info("model %s -> %s", config.model or DEFAULT_FILE, path)
    defaults = generation_defaults(config.model) if args.generation_config == "auto" else {}
    if defaults:
        logger.info("sampling defaults from the model: %s", defaults)

    def on_engine_death() -> None:
        server.should_exit = True

    # uvicorn handles SIGINT/SIGTERM (graceful shutdown), then raises the signal again once done; both
    # end here as KeyboardInterrupt, as they do while starting, so a requested stop exits 0 and the
    # scheduler process started below is stopped either way.
    signal.signal(signal.SIGTERM, _interrupt)
    client = EngineClient(config, on_engine_death, args.stream_interval_ms / 1000, level)
    try:
        with _stops_deferred():  # a stop requested meanwhile lands once this is done, as a KeyboardInterrupt
            client.spawn()
            # Imported once the scheduler process is loading the model: the HTTP stack and the tokenizer
            # (transformers) take seconds to import, on the other core.
            import uvicorn

            from minisgl.server.app import create_app
            from minisgl.server.context import SamplingDefaults, ServerContext
            from minisgl.server.metrics import ServerMetrics

            ctx = ServerContext(
                client=client,
                tokenizer=load_tokenizer(config.model, config.chat_template),
                metrics=ServerMetrics(lambda: client.stats),
                model_name=args.served_model_name or model_name(args.model),
                api_key=api_key,
                max_body_bytes=args.max_body_bytes,
                separate_reasoning=args.reasoning_parser == "auto",
                sampling_defaults=SamplingDefaults(**defaults),
            )
            app = create_app(ctx, f"http://{args.host}:{args.port}")
            http_config = uvicorn.Config(
                app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5
            )
            server = uvicorn.Server(http_config)
        try:
            server.run(sockets=[sock])
        except SystemExit:  # uvicorn's exit when start-up failed (the model did not load); the log says why
            return 1
    except KeyboardInterrupt:
        pass
    finally:
        client.abandon()  # a no-op after the server's own shutdown closed it
    if client.dead:
        logger.error("exiting because the scheduler process died")
        return 1
    return 0
