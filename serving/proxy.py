"""The stateful BalanceRoute proxy for vLLM / vllm-ascend prefill–decode deployments.

Request path (DESIGN §4): client → prefill (``max_tokens=1``, ``kv_transfer_params``) → s_i and
the KV handle → the pool → a scheduling tick of the configured policy picks the decode replica
→ decode (streamed with per-chunk usage) → relayed to the client while ``completion_tokens``
updates a_i and the loads; the end of the stream frees the slot. The proxy decides nothing
itself: the policy object (the same one the simulator runs) does, via :mod:`.dispatch`.

Faults: upstream errors before the first token are retried (another prefill instance; for
decode the request goes back to the pool and the tick picks again), up to ``max_attempts``,
then 502; after the first token the stream ends with an error event; a client disconnect
closes the upstream stream (vLLM aborts the request) and frees the load; a request whose KV
lease expires in the pool gets 503. Replicas failing health probes get 0 free slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import inspect
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from balanceroute.core.policies.base import Policy

from .config import ProxyConfig
from .dispatch import Dispatcher, LeaseExpired
from .ledger import Ledger, NoReplica, PoolFull, Ticket
from .metrics import CONTENT_TYPE_LATEST, ProxyMetrics
from .protocol import (
    NIXL_PREFILL_PARAMS,
    SSE_DONE,
    ApiError,
    ClientRequest,
    approx_prompt_tokens,
    decode_body,
    error_body,
    iter_sse,
    prefill_body,
    sse,
    validate_request,
)

__all__ = ["Proxy", "build_policy", "create_proxy_app"]

log = logging.getLogger("balanceroute.serving.proxy")

_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def build_policy(config: ProxyConfig) -> Policy:
    """The configured policy; ``deadline_s`` defaults to ``kv_lease_s − lease_margin_s`` for
    policies that take one, so requests near the end of their KV lease are dispatched first."""
    from balanceroute.core.policies import POLICIES, get_policy

    params = dict(config.policy_params)
    factory = POLICIES.get(config.policy)
    if factory is not None and "deadline_s" not in params:
        with contextlib.suppress(TypeError, ValueError):
            if "deadline_s" in inspect.signature(factory).parameters:
                params["deadline_s"] = config.kv_lease_s - config.lease_margin_s
    return get_policy(config.policy, **params)


class _Retryable(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _StreamBroken(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(slots=True, eq=False)
class _PrefillTarget:
    index: int
    url: str
    dp_rank: int | None
    in_flight: int = 0


@dataclass(slots=True)
class _PrefillState:
    """Prefill instances, their health and (Mooncake) DP engine ids."""

    config: ProxyConfig
    healthy: list[bool] = field(default_factory=list)
    engine_ids: list[dict[int, str] | None] = field(default_factory=list)
    targets: list[_PrefillTarget] = field(default_factory=list)
    cursor: int = 0

    def __post_init__(self) -> None:
        n = len(self.config.prefill)
        mooncake = self.config.kv_dialect == "mooncake"
        self.healthy = [True] * n
        self.engine_ids = [None] * n
        if not mooncake:
            self.targets = [_PrefillTarget(i, p.url, None) for i, p in enumerate(self.config.prefill)]

    def set_engine_ids(self, index: int, ids: dict[int, str]) -> None:
        self.engine_ids[index] = ids
        self.targets = [t for t in self.targets if t.index != index] + [
            _PrefillTarget(index, self.config.prefill[index].url, rank) for rank in sorted(ids)]
        self.targets.sort(key=lambda t: (t.index, t.dp_rank or 0))

    def usable(self, t: _PrefillTarget) -> bool:
        return self.healthy[t.index]

    def pick(self, exclude: list[_PrefillTarget]) -> _PrefillTarget | None:
        """Round robin (or least in-flight prompt tokens) over healthy targets not yet tried;
        targets on an instance that already failed this request come last."""
        tried = {t.index for t in exclude}
        pool = [t for t in self.targets if self.usable(t) and t not in exclude]
        fresh = [t for t in pool if t.index not in tried] or pool
        if not fresh:
            return None
        if self.config.prefill_balance == "least_loaded":
            return min(fresh, key=lambda t: t.in_flight)
        n = len(self.targets)
        for step in range(n):
            t = self.targets[(self.cursor + step) % n]
            if t in fresh:
                self.cursor = (self.cursor + step + 1) % n
                return t
        return fresh[0]

    @property
    def ready(self) -> bool:
        return any(self.usable(t) for t in self.targets)


class RelayResponse(StreamingResponse):
    """A streaming response that always runs ``on_close`` (close upstream, end the ticket)
    however the client goes away — even if the body generator never started."""

    def __init__(self, content: AsyncIterator[bytes], *, on_close: Callable[[], Awaitable[None]],
                 headers: dict[str, str]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._on_close = on_close

    async def discard(self) -> None:
        """Release everything without sending."""
        with anyio.CancelScope(shield=True):
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
            await self._on_close()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.discard()


class _DecodeStream:
    """An open decode response: SSE events, the ones read before the client was answered,
    and whether a choice has finished."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._events = iter_sse(response.aiter_bytes())
        self.buffered: list[tuple[bytes, dict | None]] = []
        self.finished = False

    async def next(self) -> tuple[bytes, dict | None] | None:
        """The next event as (raw data, parsed object or ``None`` for ``[DONE]``), ``None``
        at the end of the stream."""
        try:
            raw = await self._events.__anext__()
        except StopAsyncIteration:
            return None
        if raw.strip() == b"[DONE]":
            return raw, None
        try:
            obj = json.loads(raw)
        except ValueError:
            raise _StreamBroken("decode_protocol", f"decode sent a non-JSON event: {raw[:80]!r}") from None
        if not isinstance(obj, dict):
            raise _StreamBroken("decode_protocol", "decode sent a non-object event")
        for choice in obj.get("choices") or ():
            if isinstance(choice, dict) and choice.get("finish_reason") is not None:
                self.finished = True
        return raw, obj

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(Exception):
                await self._events.aclose()  # type: ignore[attr-defined]
            with contextlib.suppress(Exception):
                await self.response.aclose()


def _event_error(obj: dict) -> str | None:
    """The message of an in-stream error event, if ``obj`` is one."""
    err = obj.get("error")
    if isinstance(err, dict):
        return str(err.get("message", err))
    if err is not None:
        return str(err)
    if obj.get("object") == "error":
        return str(obj.get("message", "error"))
    for choice in obj.get("choices") or ():
        if isinstance(choice, dict) and choice.get("stop_reason") == "recomputed":
            return "decode replica preempted the request (stop_reason=recomputed)"
    return None


def _has_token(obj: dict) -> bool:
    usage = obj.get("usage")
    if isinstance(usage, dict) and (usage.get("completion_tokens") or 0) >= 1:
        return True
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("finish_reason") is not None or choice.get("text"):
            return True
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
            return True
    return False


class _Assembler:
    """Builds a non-streaming (chat) completion from decode's chunks: text or message content,
    reasoning content, tool calls (merged by index), finish reason and the final usage."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.meta: dict[str, Any] = {}
        self.finish_reason: Any = None
        self.stop_reason: Any = None
        self.usage: Any = None

    def add(self, obj: dict) -> None:
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in obj and key not in self.meta:
                self.meta[key] = obj[key]
        if obj.get("usage"):
            self.usage = obj["usage"]
        for choice in obj.get("choices") or ():
            if self.chat:
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    self.text.append(delta["content"])
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if reasoning:
                    self.reasoning.append(reasoning)
                for call in delta.get("tool_calls") or ():
                    slot = self.tool_calls.setdefault(call.get("index", 0), {
                        "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                    if call.get("id"):
                        slot["id"] = call["id"]
                    fn = call.get("function") or {}
                    slot["function"]["name"] += fn.get("name") or ""
                    slot["function"]["arguments"] += fn.get("arguments") or ""
            elif choice.get("text"):
                self.text.append(choice["text"])
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
                self.stop_reason = choice.get("stop_reason")

    def result(self) -> dict[str, Any]:
        text = "".join(self.text)
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if self.reasoning:
                message["reasoning_content"] = "".join(self.reasoning)
            if self.tool_calls:
                message["tool_calls"] = [self.tool_calls[k] for k in sorted(self.tool_calls)]
            choice: dict[str, Any] = {"index": 0, "message": message}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text}
            obj = "text_completion"
        choice.update(logprobs=None, finish_reason=self.finish_reason, stop_reason=self.stop_reason)
        return {"id": self.meta.get("id", ""), "object": obj,
                "created": self.meta.get("created", int(time.time())),
                "model": self.meta.get("model", ""), "choices": [choice], "usage": self.usage}


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    too_big = ApiError(413, f"request body exceeds {limit} bytes", kind="body_too_large",
                       code="request_too_large")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body, status_code=err.status, headers=err.headers)


class Proxy:
    """The proxy's state and request path; built in the app's lifespan, kept on
    ``app.state.proxy``. Upstream calls go through ``client`` (injected, so tests can swap the
    transport)."""

    def __init__(self, config: ProxyConfig, client: httpx.AsyncClient, policy: Policy) -> None:
        self.config = config
        self.client = client
        self.policy = policy
        self.ledger = Ledger(config.replica_slots(), pool_capacity=config.pool_capacity)
        self.dispatcher = Dispatcher(self.ledger, policy, tick_interval_s=config.tick_interval_s,
                                     on_tick=self._on_tick)
        self.prefills = _PrefillState(config)
        self.healthy = [True] * config.num_replicas
        self.drained = [False] * config.num_replicas
        self.admin_token = config.admin_token()
        self._api_key = config.upstream_api_key()
        self._health_task: asyncio.Task | None = None
        self._started = time.monotonic()
        self.metrics = ProxyMetrics(self.ledger, [d.label for d in config.decode], self._extra_gauges)

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Start the tick loop and the health/bootstrap loop."""
        self.dispatcher.start()
        self._health_task = asyncio.get_running_loop().create_task(self._health_loop())

    async def stop(self) -> None:
        """Stop background tasks (open streams end with their clients)."""
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        await self.dispatcher.stop()

    # --------------------------------------------------------------- the request path
    async def generate(self, request: Request, *, chat: bool) -> Response:
        """Serve one ``/v1/completions`` or ``/v1/chat/completions`` request."""
        endpoint = "chat" if chat else "completions"
        try:
            body = await _read_body(request, self.config.max_body_bytes)
            try:
                payload = json.loads(body)
            except (ValueError, UnicodeDecodeError) as exc:
                raise ApiError(400, f"invalid JSON body: {exc}", kind="bad_request") from None
            creq = validate_request(payload, chat=chat)
            request_id = f"br-{uuid.uuid4().hex}"
            try:
                ticket = self.ledger.admit(request_id, endpoint=endpoint, now=time.monotonic())
            except PoolFull as exc:
                raise ApiError(429, f"the request pool is full ({exc}); retry later", kind="pool_full",
                               code="pool_full",
                               headers={"Retry-After": str(self.config.retry_after_s)}) from None
            except NoReplica:
                raise ApiError(503, "no decode replica is in service", kind="no_replica",
                               code="no_decode_replica",
                               headers={"Retry-After": str(self.config.retry_after_s)}) from None
        except ApiError as err:
            self.metrics.errors.labels(err.kind).inc()
            self.metrics.requests.labels(endpoint, err.kind).inc()
            return _error_response(err)
        self.metrics.accepted.labels(endpoint).inc()

        work = asyncio.ensure_future(self._serve(ticket, creq))
        watch = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            watch.cancel()
            raise
        if work.done():
            watch.cancel()
            return work.result()
        # The client left before it was answered: abort whatever is in progress.
        work.cancel()
        result = None
        with contextlib.suppress(asyncio.CancelledError):
            result = await work
        if isinstance(result, RelayResponse):
            await result.discard()
        self._end(ticket, "client_disconnect")
        return Response(status_code=499)

    async def _serve(self, ticket: Ticket, creq: ClientRequest) -> Response:
        stream: _DecodeStream | None = None
        try:
            if self.config.kv_dialect == "none":
                prompt_len, kv = approx_prompt_tokens(creq.payload), None
            else:
                prompt_len, kv = await self._prefill(ticket, creq)
            stream = await self._decode(ticket, creq, prompt_len, kv)
            headers = {"X-Request-Id": ticket.request_id}
            if creq.stream:
                owned, stream = stream, None
                return RelayResponse(self._relay(ticket, owned, creq), headers={
                    **headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                    on_close=lambda: self._abandon(ticket, owned))
            result = await self._assemble(ticket, stream, creq)
            self._end(ticket, "ok")
            return JSONResponse(result, headers=headers)
        except ApiError as err:
            self.metrics.errors.labels(err.kind).inc()
            self._end(ticket, err.kind)
            return _error_response(err)
        except asyncio.CancelledError:
            self._end(ticket, "client_disconnect")
            raise
        except Exception as exc:  # a bug: answer it and keep the accounting right
            log.exception("request %s failed", ticket.request_id)
            self.metrics.errors.labels("internal").inc()
            self._end(ticket, "internal")
            return _error_response(ApiError(500, f"internal proxy error: {exc!r}", kind="internal"))
        finally:
            if stream is not None:
                await stream.aclose()

    def _headers(self, request_id: str, dp_rank: int | None) -> dict[str, str]:
        headers = {"X-Request-Id": request_id}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        if dp_rank is not None:
            headers["X-data-parallel-rank"] = str(dp_rank)
        return headers

    async def _prefill(self, ticket: Ticket, creq: ClientRequest) -> tuple[int, dict | None]:
        """Prefill on a healthy instance (retrying on others); returns (s_i, decode's
        ``kv_transfer_params``). The ticket then joins the pool."""
        cfg = self.config
        tried: list[_PrefillTarget] = []
        last = "no prefill instance is in service"
        weight = approx_prompt_tokens(creq.payload)
        transfer_id = f"xfer-{ticket.request_id}"
        for attempt in range(cfg.max_attempts):
            target = self.prefills.pick(tried)
            if target is None:
                break
            if attempt:
                self.metrics.retries.labels("prefill").inc()
            tried.append(target)
            params = (dict(NIXL_PREFILL_PARAMS) if cfg.kv_dialect == "nixl" else
                      {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id})
            target.in_flight += weight
            try:
                resp = await self.client.post(
                    target.url + creq.path, json=prefill_body(creq.payload, params),
                    headers=self._headers(ticket.request_id, target.dp_rank),
                    timeout=httpx.Timeout(cfg.prefill_timeout_s, connect=cfg.connect_timeout_s))
            except httpx.HTTPError as exc:
                last = f"prefill {target.url}: {type(exc).__name__}: {exc}"
                self.metrics.errors.labels("prefill_connect").inc()
                self._prefill_failed(target.index)
                continue
            finally:
                target.in_flight -= weight
            if resp.status_code != 200:
                if resp.status_code not in _RETRYABLE_STATUS:
                    raise ApiError.from_upstream(resp.status_code, resp.content, kind="prefill_rejected")
                last = f"prefill {target.url}: HTTP {resp.status_code}: {resp.text[:200]}"
                self.metrics.errors.labels("prefill_http").inc()
                continue
            try:
                data = resp.json()
                usage = data.get("usage") or {}
            except (ValueError, AttributeError):
                last = f"prefill {target.url}: the reply is not a JSON object"
                self.metrics.errors.labels("prefill_protocol").inc()
                continue
            prompt_len = usage.get("prompt_tokens")
            if not isinstance(prompt_len, int) or prompt_len < 1:
                prompt_len = weight
            if cfg.kv_dialect == "nixl":
                kv = data.get("kv_transfer_params")
                if not isinstance(kv, dict):
                    self.metrics.errors.labels("prefill_no_kv_params").inc()
                    kv = None
            else:
                ids = self.prefills.engine_ids[target.index] or {}
                kv = {"do_remote_decode": False, "do_remote_prefill": True,
                      "remote_bootstrap_addr": cfg.bootstrap_addr(target.index),
                      "remote_engine_id": ids.get(target.dp_rank or 0), "transfer_id": transfer_id}
            return prompt_len, kv
        raise ApiError(502, f"prefill failed after {len(tried)} attempt(s): {last}",
                       kind="prefill_failed", code="prefill_failed")

    async def _decode(self, ticket: Ticket, creq: ClientRequest, prompt_len: int,
                      kv: dict | None) -> _DecodeStream:
        """Pool the ticket, wait for the tick's replica and open the decode stream up to the
        first token; before it, failures send the ticket back to the pool (bounded)."""
        cfg = self.config
        body = decode_body(creq.payload, kv)
        pooled_at = time.monotonic()
        first = True
        while True:
            try:
                g = await self.dispatcher.wait_for_slot(ticket, prompt_len if first else None, cfg.kv_lease_s)
            except LeaseExpired as exc:
                raise ApiError(503, str(exc), kind="lease_expired", code="kv_lease_expired") from None
            if first:
                self.metrics.pool_wait.observe(time.monotonic() - pooled_at)
            first = False
            ticket.decode_attempts += 1
            try:
                return await self._open_decode(ticket, g, creq, body)
            except _Retryable as exc:
                self.metrics.errors.labels(exc.kind).inc()
                self._decode_failed(g)
                if ticket.decode_attempts >= cfg.max_attempts:
                    raise ApiError(502, f"decode failed after {ticket.decode_attempts} attempt(s): {exc}",
                                   kind="decode_failed", code="decode_failed") from None
                self.metrics.retries.labels("decode").inc()
                self.ledger.requeue(ticket)

    async def _open_decode(self, ticket: Ticket, g: int, creq: ClientRequest, body: dict) -> _DecodeStream:
        cfg = self.config
        rep = cfg.decode[g]
        request = self.client.build_request(
            "POST", rep.url + creq.path, json=body, headers=self._headers(ticket.request_id, rep.dp_rank),
            timeout=httpx.Timeout(cfg.decode_read_timeout_s, connect=cfg.connect_timeout_s))
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise _Retryable("decode_connect", f"decode {rep.label}: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            try:
                content = await response.aread()
            except httpx.HTTPError:
                content = b""
            finally:
                await response.aclose()
            if response.status_code not in _RETRYABLE_STATUS:
                raise ApiError.from_upstream(response.status_code, content, kind="decode_rejected")
            raise _Retryable("decode_http", f"decode {rep.label}: HTTP {response.status_code}: "
                             f"{content[:200].decode('utf-8', 'replace')}")
        stream = _DecodeStream(response)
        try:
            while True:
                event = await stream.next()
                if event is None or event[1] is None:
                    raise _Retryable("decode_stream", f"decode {rep.label}: stream ended before the first token")
                message = _event_error(event[1])
                if message is not None:
                    raise _Retryable("decode_error_event", f"decode {rep.label}: {message}")
                stream.buffered.append(event)
                self._observe(ticket, event[1])
                if _has_token(event[1]):
                    return stream
        except _StreamBroken as exc:
            await stream.aclose()
            raise _Retryable(exc.kind, str(exc)) from None
        except httpx.HTTPError as exc:
            await stream.aclose()
            raise _Retryable("decode_stream", f"decode {rep.label}: {type(exc).__name__}: {exc}") from None
        except BaseException:
            await stream.aclose()
            raise

    def _observe(self, ticket: Ticket, obj: dict) -> None:
        """Per-chunk progress: a_i from ``usage.completion_tokens`` (and, without a prefill
        stage, s_i from ``usage.prompt_tokens``)."""
        usage = obj.get("usage")
        if isinstance(usage, dict):
            done = usage.get("completion_tokens")
            if isinstance(done, int) and done > ticket.age:
                self.metrics.tokens.inc(done - ticket.age)
                self.ledger.progress(ticket, done)
            if not ticket.prompt_checked:
                ticket.prompt_checked = True
                prompt = usage.get("prompt_tokens")
                if self.config.kv_dialect == "none" and isinstance(prompt, int) and prompt > 0:
                    self.ledger.set_prompt(ticket, prompt)
        if not ticket.first_token and _has_token(obj):
            ticket.first_token = True
            self.metrics.ttft.observe(time.monotonic() - ticket.created)

    def _client_event(self, raw: bytes, obj: dict, creq: ClientRequest) -> bytes | None:
        """The event as the client asked for it: usage chunks it did not ask for stripped."""
        if "usage" not in obj or creq.continuous_usage:
            return b"data: " + raw + b"\n\n"
        if not obj.get("choices"):  # the final usage-only chunk
            return b"data: " + raw + b"\n\n" if creq.include_usage else None
        if creq.include_usage:
            obj["usage"] = None
        else:
            del obj["usage"]
        return sse(obj)

    async def _relay(self, ticket: Ticket, stream: _DecodeStream, creq: ClientRequest) -> AsyncIterator[bytes]:
        outcome = "client_disconnect"
        try:
            try:
                for raw, obj in stream.buffered:
                    out = self._client_event(raw, obj, creq)  # type: ignore[arg-type]
                    if out:
                        yield out
                stream.buffered.clear()
                while True:
                    try:
                        event = await stream.next()
                    except httpx.HTTPError as exc:
                        raise _StreamBroken("decode_stream", f"decode stream broke: {type(exc).__name__}: {exc}") from None
                    if event is None:
                        if not stream.finished:
                            raise _StreamBroken("decode_stream", "decode stream ended before the request finished")
                        break
                    raw, obj = event
                    if obj is None:
                        break
                    message = _event_error(obj)
                    if message is not None:
                        raise _StreamBroken("decode_error_event", message)
                    self._observe(ticket, obj)
                    out = self._client_event(raw, obj, creq)
                    if out:
                        yield out
                outcome = "ok"
                yield SSE_DONE
            except _StreamBroken as exc:
                outcome = exc.kind
                self.metrics.errors.labels(exc.kind).inc()
                self._end(ticket, outcome)
                yield sse(error_body(f"upstream decode failed mid-stream: {exc}", status=502, code=exc.kind))
                yield SSE_DONE
        finally:
            self._end(ticket, outcome)
            await stream.aclose()

    async def _assemble(self, ticket: Ticket, stream: _DecodeStream, creq: ClientRequest) -> dict:
        acc = _Assembler(creq.chat)
        for _, obj in stream.buffered:
            acc.add(obj)  # type: ignore[arg-type]
        while True:
            try:
                event = await stream.next()
            except (httpx.HTTPError, _StreamBroken) as exc:
                raise ApiError(502, f"decode failed mid-response: {exc}", kind="decode_stream") from None
            if event is None:
                if not stream.finished:
                    raise ApiError(502, "decode stream ended before the request finished", kind="decode_stream")
                break
            raw, obj = event
            if obj is None:
                break
            message = _event_error(obj)
            if message is not None:
                raise ApiError(502, f"decode failed mid-response: {message}", kind="decode_error_event")
            self._observe(ticket, obj)
            acc.add(obj)
        return acc.result()

    async def _abandon(self, ticket: Ticket, stream: _DecodeStream) -> None:
        self._end(ticket, "client_disconnect")
        await stream.aclose()

    def _end(self, ticket: Ticket, outcome: str) -> None:
        if self.dispatcher.finish(ticket, outcome):
            self.metrics.requests.labels(ticket.endpoint, outcome).inc()
            if outcome == "client_disconnect":
                self.metrics.errors.labels("client_disconnect").inc()

    def _on_tick(self, seconds: float, placed: int) -> None:
        self.metrics.tick.observe(seconds)

    def _extra_gauges(self) -> dict[str, tuple[str, float]]:
        return {"balanceroute_prefill_ready": ("1 if a prefill instance is in service.",
                                               float(self.ready))}

    # ------------------------------------------------------------------- health
    @property
    def ready(self) -> bool:
        """Whether requests can be served: a decode replica and (PD) a prefill target."""
        if not self.ledger.available.any():
            return False
        return self.config.kv_dialect == "none" or self.prefills.ready

    def _apply_availability(self, g: int) -> None:
        self.ledger.set_available(g, self.healthy[g] and not self.drained[g])
        self.dispatcher.wake()

    def _decode_failed(self, g: int) -> None:
        if self.config.health_interval_s > 0 and self.healthy[g]:
            log.warning("decode replica %s failed; out of service until a health probe passes",
                        self.config.decode[g].label)
            self.healthy[g] = False
            self._apply_availability(g)

    def _prefill_failed(self, index: int) -> None:
        if self.config.health_interval_s > 0:
            self.prefills.healthy[index] = False

    async def _probe(self, url: str, dp_rank: int | None) -> bool:
        headers = {"X-data-parallel-rank": str(dp_rank)} if dp_rank is not None else {}
        try:
            resp = await self.client.get(url + "/health", headers=headers,
                                         timeout=self.config.health_timeout_s)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    async def _bootstrap(self) -> None:
        """Mooncake: learn each prefill instance's DP engine ids from its bootstrap ``/query``."""
        for i in range(len(self.config.prefill)):
            if self.prefills.engine_ids[i] is not None:
                continue
            try:
                resp = await self.client.get(self.config.bootstrap_addr(i) + "/query",
                                             timeout=self.config.health_timeout_s)
                data = resp.json() if resp.status_code == 200 else None
                ids = {int(rank): str(entry["engine_id"]) for rank, entry in data.items()}
            except (httpx.HTTPError, ValueError, TypeError, KeyError, AttributeError):
                continue
            if ids:
                self.prefills.set_engine_ids(i, ids)
                log.info("prefill %s: %d DP rank(s) from bootstrap", self.config.prefill[i].url, len(ids))

    async def probe_all(self) -> None:
        """One round of health probes (decode replicas and prefill instances)."""
        cfg = self.config
        decode = [self._probe(d.url, d.dp_rank) for d in cfg.decode]
        prefill = [self._probe(p.url, None) for p in cfg.prefill]
        results = await asyncio.gather(*decode, *prefill)
        for g, ok in enumerate(results[: len(decode)]):
            if ok != self.healthy[g]:
                log.warning("decode replica %s is %s", cfg.decode[g].label, "back" if ok else "down")
                self.healthy[g] = ok
                self._apply_availability(g)
        for i, ok in enumerate(results[len(decode):]):
            self.prefills.healthy[i] = ok

    async def _health_loop(self) -> None:
        interval = self.config.health_interval_s
        while True:
            try:
                if self.config.kv_dialect == "mooncake":
                    await self._bootstrap()
                if interval > 0:
                    await self.probe_all()
            except Exception:  # keep probing whatever happens
                log.exception("health probe round failed")
            if interval <= 0 and (self.config.kv_dialect != "mooncake" or all(
                    ids is not None for ids in self.prefills.engine_ids)):
                return
            await asyncio.sleep(interval if interval > 0 else 1.0)

    # -------------------------------------------------------------------- status
    def status(self) -> dict[str, Any]:
        """The JSON status: policy, replicas with their loads, pool, counters, tick latency."""
        led = self.ledger
        cfg = self.config
        pool_waits = [time.monotonic() - t.joined for t in led.pool]
        n_ticks = max(self.dispatcher.ticks, 1)
        return {
            "policy": getattr(self.policy, "name", cfg.policy),
            "kv_dialect": cfg.kv_dialect,
            "ready": self.ready,
            "uptime_s": time.monotonic() - self._started,
            "replicas": [
                {"index": g, "url": d.url, "dp_rank": d.dp_rank, "available": bool(led.available[g]),
                 "healthy": self.healthy[g], "drained": self.drained[g], "slots": int(led.capacity[g]),
                 "running": int(led.num_active[g]), "kv_load": int(led.loads[g])}
                for g, d in enumerate(cfg.decode)],
            "prefill": [
                {"index": i, "url": p.url, "healthy": self.prefills.healthy[i],
                 "dp_ranks": None if self.prefills.engine_ids[i] is None else len(self.prefills.engine_ids[i] or {}),
                 "in_flight_tokens": sum(t.in_flight for t in self.prefills.targets if t.index == i)}
                for i, p in enumerate(cfg.prefill)],
            "pool": {"size": len(led.pool), "capacity": led.pool_capacity,
                     "oldest_wait_s": max(pool_waits, default=0.0)},
            "prefilling": led.prefilling,
            "imbalance": led.imbalance(),
            "envelope": int(led.loads.max()),
            "mean_imbalance_at_ticks": self.dispatcher.imbalance_sum / n_ticks,
            "requests": {"accepted": led.accepted, "in_flight": led.in_flight,
                         "finished": dict(led.finished)},
            "tick": self.dispatcher.tick_stats(),
        }

    def check_admin(self, request: Request) -> None:
        """Raise 401 unless the request carries the admin token (when one is configured)."""
        if self.admin_token is None:
            return
        given = request.headers.get("authorization", "")
        expected = f"Bearer {self.admin_token}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise ApiError(401, "this endpoint needs the admin token (Authorization: Bearer ...)",
                           kind="unauthorized")

    def set_drained(self, g: int, drained: bool) -> None:
        """Admin: take replica ``g`` out of service (no new requests) or put it back."""
        self.drained[g] = drained
        self._apply_availability(g)


# ------------------------------------------------------------------------ HTTP layer
router = APIRouter()


def _proxy(request: Request) -> Proxy:
    return request.app.state.proxy


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    """OpenAI completions through prefill, the pool and the policy's decode replica."""
    return await _proxy(request).generate(request, chat=False)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions, same path."""
    return await _proxy(request).generate(request, chat=True)


@router.get("/v1/models")
async def models(request: Request) -> Response:
    """The decode servers' model list (the first one that answers), else ``served_models``."""
    proxy = _proxy(request)
    for g, d in enumerate(proxy.config.decode):
        if not proxy.ledger.available[g]:
            continue
        try:
            resp = await proxy.client.get(d.url + "/v1/models", headers=proxy._headers("models", None),
                                          timeout=proxy.config.health_timeout_s)
        except httpx.HTTPError:
            continue
        if resp.status_code == 200:
            return Response(resp.content, media_type="application/json")
    if proxy.config.served_models:
        return JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "balanceroute"}
            for m in proxy.config.served_models]})
    return _error_response(ApiError(503, "no decode server answered /v1/models", kind="no_replica"))


@router.get("/health")
async def health(request: Request) -> Response:
    """200 when a decode replica (and, with a prefill stage, a prefill instance) is in service."""
    proxy = _proxy(request)
    if proxy.ready:
        return JSONResponse({"status": "ok"})
    return _error_response(ApiError(503, "not ready: no decode replica or prefill instance in service",
                                    kind="not_ready"))


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus metrics."""
    return Response(_proxy(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/status")
async def status(request: Request) -> Response:
    """JSON status with replica loads (admin token if configured)."""
    proxy = _proxy(request)
    try:
        proxy.check_admin(request)
    except ApiError as err:
        return _error_response(err)
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
        return _error_response(err)
    proxy.set_drained(replica, action == "drain")
    return JSONResponse(proxy.status()["replicas"][replica])


def create_proxy_app(config: ProxyConfig, *, client: httpx.AsyncClient | None = None,
                     policy: Policy | None = None) -> FastAPI:
    """The proxy as a FastAPI app. ``client`` replaces the upstream HTTP client (tests pass one
    with a mock transport); ``policy`` replaces the configured one."""
    if config.admin_token_env and not config.admin_token():
        raise ValueError(f"admin_token_env={config.admin_token_env!r} is set but that environment "
                         "variable is empty")
    chosen = policy if policy is not None else build_policy(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        http = client or httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=4096),
            timeout=httpx.Timeout(config.decode_read_timeout_s, connect=config.connect_timeout_s))
        proxy = Proxy(config, http, chosen)
        app.state.proxy = proxy
        await proxy.start()
        try:
            yield
        finally:
            await proxy.stop()
            if client is None:
                await http.aclose()

    app = FastAPI(title="BalanceRoute proxy", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.include_router(router)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return JSONResponse(error_body(str(exc.detail), status=exc.status_code),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    return app
