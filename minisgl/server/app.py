"""The FastAPI application: lifecycle of the scheduler process, auth, errors, and the small endpoints."""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from minisgl.server.context import ServerContext
from minisgl.server.engine_client import EngineDead
from minisgl.server.errors import ApiError, InternalErrors
from minisgl.server.native_api import native_router
from minisgl.server.openai_api import openai_router
from minisgl.server.protocol import ControlOp, ControlReply
from minisgl.server.web import debug_router, page_router

logger = logging.getLogger("minisgl.server")


def create_app(ctx: ServerContext, address: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        ready = await ctx.client.start()
        logger.info(
            "serving %s on %s: KV pool %d tokens (page size %d), context %d tokens, scheduler pid %d%s",
            ctx.model_name, address, ready.kv_capacity, ready.page_size, ready.max_seq_len, ready.pid,
            ", API key required" if ctx.api_key else "",
        )  # fmt: skip
        logger.info("web page (chat, and the radix cache drawn live): %s/", address)
        try:
            yield
        finally:
            await ctx.client.close()

    app = FastAPI(title="minisgl", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_middleware(InternalErrors)

    async def require_key(request: Request) -> None:
        if ctx.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), ctx.api_key.encode()):
            raise ApiError(
                401, "invalid or missing API key: send `Authorization: Bearer <key>`", code="invalid_api_key"
            )

    @app.get("/health")  # open without a key: load balancers and probes must reach it
    async def health() -> Response:
        if ctx.client.dead:
            return JSONResponse({"status": "unavailable", "message": "the engine process died"}, status_code=503)
        return JSONResponse({"status": "ok"})

    guarded = [Depends(require_key)]

    @app.get("/v1/models", dependencies=guarded)
    async def models() -> dict[str, Any]:
        card = {
            "id": ctx.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "minisgl",
            "max_model_len": ctx.context_len,
        }
        return {"object": "list", "data": [card]}

    @app.get("/metrics", dependencies=guarded)
    async def metrics() -> Response:
        return Response(ctx.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/flush_cache", dependencies=guarded)
    async def flush_cache() -> Response:
        reply = await _control(ctx, ControlOp.FLUSH_CACHE)
        if not reply.ok:
            raise ApiError(409, reply.message)
        return JSONResponse({"message": reply.message})

    @app.get("/debug/kv", dependencies=guarded)
    async def debug_kv() -> Response:
        """Runs the KV accounting check in the scheduler process and returns the pool usage."""
        reply = await _control(ctx, ControlOp.DEBUG_KV)
        body = {"ok": reply.ok, "message": reply.message, **reply.data}
        return JSONResponse(body, status_code=200 if reply.ok else 500)

    app.include_router(page_router(api_key_required=ctx.api_key is not None))  # no data in it: open
    app.include_router(debug_router(ctx), dependencies=guarded)
    app.include_router(openai_router(ctx), dependencies=guarded)
    app.include_router(native_router(ctx), dependencies=guarded)
    return app


async def _control(ctx: ServerContext, op: ControlOp) -> ControlReply:
    try:
        return await ctx.client.control(op)
    except EngineDead as e:
        raise ApiError(503, str(e)) from None


async def _api_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _http_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return ApiError(exc.status_code, str(exc.detail)).response()
