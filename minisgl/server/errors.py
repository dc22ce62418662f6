"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

from __future__ import annotations

import logging
import uuid

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("minisgl.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    503: "service_unavailable_error",
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, dict[str, str | None]]:
        error_type = _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": error_type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


class InternalErrors:
    """ASGI middleware: an exception that no handler took becomes an OpenAI-style 500, logged with
    a request id that the client sees too.

    It answers and returns normally. Starlette's own last-resort handler re-raises after answering,
    and uvicorn then closes the keep-alive connection, so the client's next request failed as well."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            request_id = f"req-{uuid.uuid4().hex[:16]}"
            logger.exception("unhandled error in request %s (%s %s)", request_id, scope["method"], scope["path"])
            if started:
                return  # mid-response: nothing well-formed can follow; the server closes the connection
            message = f"internal error ({type(exc).__name__}); request id {request_id}"
            await ApiError(500, message, code="internal_error").response()(scope, receive, send)
