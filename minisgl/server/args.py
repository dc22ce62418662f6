"""Flags of ``python -m minisgl serve`` (kept import-light: parsing must not load the server stack)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from minisgl.tuning import STREAM_INTERVAL_MS

API_KEY_ENV = "MINISGL_API_KEY"
DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: far more than the text of a full context, far less than abuse


def add_server_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind; 127.0.0.1 accepts local clients only")
    g.add_argument("--port", type=int, default=1919, help="TCP port to listen on")
    keys = g.add_mutually_exclusive_group()
    keys.add_argument(
        "--api-key", default=None,
        help=f"require `Authorization: Bearer KEY` on every endpoint except /health (visible in `ps`: prefer "
        f"--api-key-file or the {API_KEY_ENV} environment variable, used when neither flag is given)",
    )  # fmt: skip
    keys.add_argument("--api-key-file", type=Path, default=None, help="read the API key from this file")
    g.add_argument(
        "--served-model-name", default=None,
        help="the model name clients send and /v1/models lists; None means the model's folder or file name",
    )  # fmt: skip
    g.add_argument(
        "--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
        help="request bodies larger than this many bytes get 413",
    )  # fmt: skip
    g.add_argument(
        "--stream-interval-ms", type=_non_negative, default=STREAM_INTERVAL_MS,
        help="decode tokens wait up to this long to stream with the next ones (a request's first and last "
        "tokens never wait); 0 streams every token as it comes",
    )  # fmt: skip
    g.add_argument(
        "--reasoning-parser", default="auto", choices=["auto", "none"],
        help="auto: a thinking model's reasoning (between <think> and </think>, where its vocabulary has both "
        "tags) goes to a chat answer's reasoning_content, the rest to its content; none: all of it to content",
    )  # fmt: skip
    g.add_argument(
        "--generation-config", default="auto", choices=["auto", "none"],
        help="auto: a request that leaves temperature, top_p, top_k or min_p unset gets the model's value where "
        "it states one (a folder's generation_config.json, a GGUF's general.sampling.* keys); none: OpenAI's defaults",
    )  # fmt: skip
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log verbosity")


def _non_negative(value: str) -> float:
    number = float(value)
    if not number >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be a number of milliseconds >= 0, got {value}")
    return number


def api_key_from(args: argparse.Namespace) -> str | None:
    """The key from --api-key, --api-key-file or the environment, in that order; None if none is set.
    Raises ``ValueError`` for a key file that cannot be read or holds no key."""
    if args.api_key is not None:
        return str(args.api_key)
    if args.api_key_file is not None:
        try:
            key = args.api_key_file.read_text().strip()
        except OSError as e:
            raise ValueError(f"cannot read --api-key-file {args.api_key_file}: {e.strerror}") from None
        if not key:
            raise ValueError(f"--api-key-file {args.api_key_file} is empty")
        return key
    return os.environ.get(API_KEY_ENV) or None
