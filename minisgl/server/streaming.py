"""Server-sent events, and a streaming response that always releases its engine requests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from minisgl.server.generation import Generation

SSE_DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


class GenerationStream(StreamingResponse):
    """A client that disconnects cancels the response task, possibly before the body iterator ever
    ran (so a ``finally`` inside it would not); closing here aborts the unfinished samples either way."""

    def __init__(self, content: AsyncIterator[bytes], generation: Generation) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.generation = generation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.generation.close()
