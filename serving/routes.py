"""The proxy's HTTP surface: routes, client and admin auth, OpenAI-shaped errors for everything
(unknown routes, bad methods, bad path parameters, internal errors), ``/openapi.json``.

Objects are built in the lifespan and kept on ``app.state.proxy`` (:class:`~.proxy.Proxy`);
the upstream HTTP client is injected so tests can swap the transport.
"""

from __future__ import annotations

import hmac
import json
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from balanceroute.core.policies.base import Policy

from .config import ProxyConfig
from .logs import client_request_id, log_access
from .metrics import CONTENT_TYPE_LATEST
from .protocol import ApiError, error_body, request_schema, upstream_headers
from .proxy import Proxy, build_policy, error_response
from .upstream import UpstreamPool, connection_bounds
from .upstream_httpx import HttpxUpstream

__all__ = ["create_proxy_app", "router"]

log = logging.getLogger("balanceroute.serving.routes")

router = APIRouter()

_ERRORS = {"content": {"application/json": {"schema": {
    "type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type"],
        "properties": {k: {"type": ["string", "null"]} for k in ("message", "type", "param", "code")}}}}}}}


def _proxy(request: Request) -> Proxy:
    return request.app.state.proxy


def _check_client(request: Request) -> None:
    key = request.app.state.client_key
    if key is None:
        return
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
        raise ApiError(401, "invalid or missing API key (Authorization: Bearer ...)", kind="unauthorized",
                       code="invalid_api_key")


def _body_doc(chat: bool) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": request_schema(chat)}}},
            "responses": {str(s): {"description": d, **_ERRORS} for s, d in (
                (400, "invalid request"), (401, "missing or wrong API key"), (413, "body too large"),
                (429, "pool full (Retry-After)"), (502, "upstream failed"), (503, "no replica / KV lease expired"))}}


async def _generate(request: Request, chat: bool) -> Response:
    try:
        _check_client(request)
    except ApiError as err:
        log_access(request_id=client_request_id(request.headers.get("x-request-id")) or f"br-{uuid.uuid4().hex}",
                   endpoint="chat" if chat else "completions", status=err.status, outcome=err.kind,
                   duration_s=0.0)
        return error_response(err)
    return await _proxy(request).generate(request, chat=chat)


@router.post("/v1/completions", openapi_extra=_body_doc(chat=False))
async def completions(request: Request) -> Response:
    """OpenAI completions through prefill, the pool and the policy's decode replica."""
    return await _generate(request, chat=False)


@router.post("/v1/chat/completions", openapi_extra=_body_doc(chat=True))
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions, same path."""
    return await _generate(request, chat=True)


@router.get("/v1/models")
async def models(request: Request) -> Response:
    """The served model names of the first decode server that answers (id, object, created,
    owned_by: nothing else of the upstream's list, e.g. not vLLM's ``root`` path), else
    ``served_models``."""
    try:
        _check_client(request)
    except ApiError as err:
        return error_response(err)
    proxy = _proxy(request)
    for g, d in enumerate(proxy.config.decode):
        if not proxy.ledger.available[g]:
            continue
        try:
            resp = await proxy.client.get(d.url + "/v1/models", headers=upstream_headers("models", d.dp_rank, d.api_key()),
                                          timeout=proxy.config.health_timeout_s)
        except httpx.HTTPError:
            continue
        served = _model_list(resp.content) if resp.status_code == 200 else None
        if served is not None:
            return JSONResponse(served)
    if proxy.config.served_models:
        return JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "balanceroute"}
            for m in proxy.config.served_models]})
    return error_response(ApiError(503, "no decode server answered /v1/models", kind="no_replica"))


def _model_list(content: bytes) -> dict[str, Any] | None:
    """An upstream ``/v1/models`` body reduced to the model names clients may see."""
    try:
        data = json.loads(content)
    except (ValueError, UnicodeDecodeError):
        return None
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list):
        return None
    kept = [{"id": m["id"], "object": "model",
             "created": m["created"] if isinstance(m.get("created"), int) else 0,
             "owned_by": m["owned_by"] if isinstance(m.get("owned_by"), str) else "balanceroute"}
            for m in models if isinstance(m, dict) and isinstance(m.get("id"), str)]
    return {"object": "list", "data": kept}


@router.get("/health")
@router.get("/health/ready")
async def health(request: Request) -> Response:
    """Readiness: 200 ``{"status": "ok"}`` while the proxy can serve (not draining, the tick warm
    and running, a decode replica and — with a prefill stage — a prefill instance in service),
    else 503 ``{"status": "unavailable", "reason": ...}`` (docs/operator.md)."""
    reason = _proxy(request).unready_reason()
    if reason is None:
        return JSONResponse({"status": "ok"})
    return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503,
                        headers={"Cache-Control": "no-store"})


@router.get("/health/live")
async def live(request: Request) -> Response:
    """Liveness: 200 while the process's event loop answers and the scheduling tick runs (with
    the loop's latest timer lag), else 503 with the reason."""
    proxy = _proxy(request)
    lag = round(proxy.members.lag.last, 4)
    if proxy.dispatcher.stopped:
        return JSONResponse({"status": "dead", "reason": "the scheduling tick stopped", "loop_lag_s": lag},
                            status_code=503)
    return JSONResponse({"status": "alive", "loop_lag_s": lag})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus metrics (replicas by index; URLs only with ``metrics_urls``)."""
    return Response(_proxy(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/status")
async def status(request: Request) -> Response:
    """JSON status with replica loads (needs the admin token; off without one)."""
    proxy = _proxy(request)
    try:
        proxy.check_admin(request)
    except ApiError as err:
        return error_response(err)
    return JSONResponse(proxy.status())


@router.post("/admin/replicas/{replica}/{action}")
async def admin_replica(request: Request, replica: int, action: str) -> Response:
    """``action`` = ``drain`` (stop sending new requests) or ``undrain`` (admin token)."""
    proxy = _proxy(request)
    try:
        proxy.check_admin(request)
        if not 0 <= replica < proxy.config.num_replicas:
            raise ApiError(404, f"replica {replica} does not exist", kind="not_found")
        if action not in ("drain", "undrain"):
            raise ApiError(404, f"unknown action {action!r}; use drain or undrain", kind="not_found")
    except ApiError as err:
        return error_response(err)
    proxy.members.set_drained(replica, action == "drain")
    return JSONResponse(proxy.status()["replicas"][replica])


def create_proxy_app(config: ProxyConfig, *, client: httpx.AsyncClient | None = None,
                     policy: Policy | None = None) -> FastAPI:
    """The proxy as a FastAPI app. ``client`` replaces the upstream HTTP client (tests pass one
    with a mock transport, decode streams included; without one, decode streams go through
    :class:`~.upstream.UpstreamPool`); ``policy`` replaces the configured one. The lifespan warms the
    policy's tick before the server accepts connections."""
    if config.admin_token_env and not config.admin_token():
        raise ValueError(f"admin_token_env={config.admin_token_env!r} is set but that environment "
                         "variable is empty")
    if config.client_api_key_env and not config.client_key():
        raise ValueError(f"client_api_key_env={config.client_api_key_env!r} is set but that environment "
                         "variable is empty")
    chosen = policy if policy is not None else build_policy(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Bounded upstream connections (docs/operator.md, descriptors): prefill calls, probes and
        # reads share the HTTP client; decode streams, at most a host's slots (+ slack) each.
        bounds = connection_bounds(config)
        http = client or httpx.AsyncClient(
            limits=httpx.Limits(max_connections=bounds["client"], max_keepalive_connections=bounds["client"]),
            timeout=httpx.Timeout(config.decode_read_timeout_s, connect=config.connect_timeout_s))
        # Decode streams take the lean client unless a client (a test's transport) was injected.
        upstream = UpstreamPool(max_per_host=bounds["per_host"]) if client is None else HttpxUpstream(client)
        proxy = Proxy(config, http, chosen, upstream)
        app.state.proxy = proxy
        await proxy.start()
        try:
            yield
        finally:
            await proxy.stop()
            await upstream.aclose()
            if client is None:
                await http.aclose()

    app = FastAPI(title="BalanceRoute proxy", version="1", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url="/openapi.json")
    app.state.client_key = config.client_key()
    app.include_router(router)

    def direct(chat: bool) -> Any:
        async def endpoint(scope: dict[str, Any], receive: Any, send: Any) -> None:
            scope["app"] = app
            response = await _generate(Request(scope, receive), chat)
            await response(scope, receive, send)
        return endpoint

    # The native server calls these two routes directly, past FastAPI's routing and middleware
    # (same handler; neither takes FastAPI-validated parameters).
    app.state.native_routes = {("POST", "/v1/completions"): direct(False),
                               ("POST", "/v1/chat/completions"): direct(True)}

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return JSONResponse(error_body(str(exc.detail), status=exc.status_code),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _bad_parameter(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return JSONResponse(error_body(f"{param or 'request'}: {first.get('msg')}", status=400, param=param),
                            status_code=400)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse(error_body(f"internal proxy error: {type(exc).__name__}", status=500),
                            status_code=500)

    return app
