"""Flags of ``python -m minisgl serve`` (kept import-light: parsing must not load the server stack)."""

from __future__ import annotations

import argparse

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: far more than the text of a full context, far less than abuse


def add_server_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind; 127.0.0.1 accepts local clients only")
    g.add_argument("--port", type=int, default=1919, help="TCP port to listen on")
    g.add_argument(
        "--api-key", default=None, help="require `Authorization: Bearer KEY` on every endpoint except /health"
    )
    g.add_argument(
        "--served-model-name", default=None,
        help="the model name clients send and /v1/models lists; None means the model's folder or file name",
    )  # fmt: skip
    g.add_argument(
        "--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
        help="request bodies larger than this many bytes get 413",
    )  # fmt: skip
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log verbosity")
