"""The built-in web page (``GET /``: chat, and the radix cache drawn live) and the JSON it reads.

The page is three static files shipped in the package (``static/``): no build step, no CDN, so it
works offline. It is served without the API key (it holds no data) and asks for the key when the
server has one; ``GET /debug/radix`` is behind the key like every other endpoint.

Text never crosses the ZeroMQ channel: the scheduler sends token ids of the namespaces the caller
may see (the shared one and its own ``cache_salt``'s) and this front end decodes them. Other
namespaces arrive as a keyed hash and counts only.
"""

from __future__ import annotations

import asyncio
from importlib.resources import files
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from minisgl.kvcache.snapshot import TreeSnapshot
from minisgl.server.context import ServerContext
from minisgl.server.engine_client import EngineDead
from minisgl.server.errors import ApiError

_ASSETS = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
# What one /debug/radix call may ask for: enough for the page's 10,000-node view, and a bounded
# amount of scheduler time (the snapshot is taken between forward passes).
MAX_NODES_LIMIT = 20_000
HEAD_TOKENS_LIMIT = 256
SALT_HEADER = "x-cache-salt"


def page_router(api_key_required: bool) -> APIRouter:
    router = APIRouter()
    static = files("minisgl.server") / "static"
    index = (static / "index.html").read_text(encoding="utf-8")
    index = index.replace("{{API_KEY_REQUIRED}}", "true" if api_key_required else "false")
    assets = {name: (static / name).read_bytes() for name in _ASSETS}

    @router.get("/")
    async def page() -> Response:
        return HTMLResponse(index)

    @router.get("/static/{name}")
    async def asset(name: str) -> Response:
        if name not in assets:
            raise ApiError(404, f"no static file {name!r}")
        return Response(assets[name], media_type=_ASSETS[name])

    return router


def debug_router(ctx: ServerContext) -> APIRouter:
    router = APIRouter()

    @router.get("/debug/radix")
    async def debug_radix(request: Request) -> Response:
        """The prefix cache's tree (at most ``max_nodes`` nodes, ``head_tokens`` of text each), the
        running and waiting requests, the counters and the KV pool, all read in one scheduler step."""
        max_nodes = _int_param(request, "max_nodes", 1000, 1, MAX_NODES_LIMIT)
        head_tokens = _int_param(request, "head_tokens", 32, 0, HEAD_TOKENS_LIMIT)
        try:
            report = await ctx.client.cache_report(max_nodes, head_tokens, request.headers.get(SALT_HEADER))
        except EngineDead as e:
            raise ApiError(503, str(e)) from None
        tree = None if report.tree is None else await asyncio.to_thread(_tree_json, ctx, report.tree)
        body = {
            "tree": tree,
            "requests": [msgspec.structs.asdict(r) for r in report.requests],
            "stats": report.stats.as_dict(),
        }
        return JSONResponse(body)

    return router


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name} must be an integer, got {raw!r}", param=name) from None
    if not low <= value <= high:
        raise ApiError(400, f"{name} must be in [{low}, {high}], got {value}", param=name)
    return value


def _tree_json(ctx: ServerContext, tree: TreeSnapshot) -> dict[str, Any]:
    shown = {ns.root for ns in tree.namespaces if ns.tokens_shown}
    root_of: dict[int, int] = {ns.root: ns.root for ns in tree.namespaces}
    for node in tree.nodes:  # parents first
        root_of[node.id] = root_of[node.parent]
    texts = iter(ctx.tokenizer.batch_decode([n.head for n in tree.nodes if root_of[n.id] in shown]))
    nodes = [
        {
            "id": n.id,
            "parent": n.parent,
            "length": n.length,
            "text": next(texts) if root_of[n.id] in shown else None,  # None: another tenant's
            "locks": n.locks,
            "age": n.age,
            "subtree_tokens": n.subtree_tokens,
            "subtree_nodes": n.subtree_nodes,
        }
        for n in tree.nodes
    ]
    return {
        "namespaces": [msgspec.structs.asdict(ns) for ns in tree.namespaces],
        "nodes": nodes,
        "total_nodes": tree.total_nodes,
        "eviction_path": tree.eviction_path,
    }
