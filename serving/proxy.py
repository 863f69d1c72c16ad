"""The stateful BalanceRoute proxy for vLLM / vllm-ascend prefill–decode deployments.

Request path (DESIGN §4): client → prefill (``max_tokens=1``, ``kv_transfer_params``; see
:mod:`.prefill` and :mod:`.kv`) → s_i and the KV handle → the pool → a scheduling tick of the
configured policy picks the decode replica (:mod:`.dispatch`) → decode (streamed with per-chunk
usage) → relayed to the client (:mod:`.relay`) while ``completion_tokens`` updates a_i and the
loads; the end of the stream frees the slot. The proxy decides nothing itself: the policy
object (the same one the simulator runs) does. HTTP routes live in :mod:`.routes`.

Faults: a decode error before the first token sends the request back to the pool (the tick
picks again, away from replicas it failed on), up to ``max_attempts``, then 502; a request that
failed on ``outlier.poison_hosts`` replicas fails alone. Failures count against a replica only
with evidence (:mod:`.outlier`). After the first token the stream ends with an error event; a
client disconnect closes the upstream stream (vLLM aborts the request) and frees the load; a
request whose KV lease expires in the pool gets 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hmac
import logging
import math
import time
import uuid
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from balanceroute.core.policies.base import Policy

from .assemble import Assembler
from .config import ProxyConfig
from .decode import DecodeStage
from .dispatch import Dispatcher
from .health import Membership
from .kv import get_dialect
from .ledger import Ledger, NoReplica, PoolFull, Ticket
from .metrics import ProxyMetrics
from .outlier import OutlierDetector
from .prefill import PrefillStage
from .protocol import (
    ApiError,
    ClientRequest,
    approx_prompt_tokens,
    parse_body,
    validate_request,
)
from .relay import DecodeStream, Event, RelayResponse, StreamBroken
from .stream_relay import StreamRelay
from .upstream import UpstreamError, UpstreamPool, UpstreamResponse
from .upstream_httpx import HttpxUpstream

__all__ = ["Proxy", "build_policy", "error_response"]

log = logging.getLogger("balanceroute.serving.proxy")


def build_policy(config: ProxyConfig) -> Policy:
    """The configured policy (a catalogue row the proxy can run) with ``policy_params`` (and
    ``ttft_slo_s`` when set); ``deadline_s`` defaults to ``kv_lease_s − lease_margin_s`` for
    policies that take one, so requests near the end of their KV lease are dispatched first."""
    from balanceroute.catalogue import build_policy as build
    from balanceroute.catalogue import policy_entry

    entry = policy_entry(config.policy, online=True)
    params = config.policy_parameters()
    if entry.deadline and "deadline_s" not in params:
        params["deadline_s"] = config.kv_lease_s - config.lease_margin_s
    if "ttft_slo_s" in params and not entry.ttft_slo:
        raise ValueError(f"policy {config.policy!r} does not take ttft_slo_s (--ttft-slo)")
    return build(config.policy, params, online=True)


def error_response(err: ApiError) -> JSONResponse:
    """An :class:`ApiError` as an OpenAI-style JSON response."""
    return JSONResponse(err.body, status_code=err.status, headers=err.headers)


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


class Proxy:
    """The proxy's state and request path; built in the app's lifespan, kept on
    ``app.state.proxy``. Upstream calls go through ``client`` (injected, so tests can swap the
    transport); decode streams through ``upstream`` (:mod:`.upstream`; by default over
    ``client``)."""

    def __init__(self, config: ProxyConfig, client: httpx.AsyncClient, policy: Policy,
                 upstream: UpstreamPool | HttpxUpstream | None = None) -> None:
        self.config = config
        self.client = client
        self.upstream = upstream if upstream is not None else HttpxUpstream(client)
        self.policy = policy
        self.dialect = get_dialect(config.kv_dialect)
        self.warm = False
        self.ledger = Ledger(config.replica_slots(), pool_capacity=config.pool_capacity)
        self.dispatcher = Dispatcher(self.ledger, policy, tick_interval_s=config.tick_interval_s,
                                     on_tick=self._on_tick)
        self.metrics = ProxyMetrics(self.ledger, [d.label for d in config.decode] if config.metrics_urls else None)
        self.prefills = PrefillStage(config, self.dialect, client, self.metrics,
                                     OutlierDetector(len(config.prefill), config.outlier))
        self.members = Membership(config, client, self.ledger, self.dispatcher, self.prefills, self.metrics)
        self.decode = DecodeStage(config, self.upstream, self.ledger, self.dispatcher, self.members, self.metrics,
                                  self._observe)
        self.metrics.register_gauges(self._extra_gauges)
        self.admin_token = config.admin_token()
        self._started = time.monotonic()
        # a predictor that learns from finished requests (brh-survival: OnlineSurvival)
        self.learner = getattr(getattr(policy, "predictor", None), "observe", None)

    # ----------------------------------------------------------------- lifecycle
    def warm_up(self) -> None:
        """Run a copy of the policy once on a scratch ledger of this cluster's shape, so a
        compiled tick is compiled (or loaded from its cache) before the first request, not
        during it. The policy object itself is not called: its state (cursors, memos) and
        anything watching it see only real ticks."""
        scratch = Ledger(self.config.replica_slots(), pool_capacity=self.config.pool_capacity)
        for k in range(min(4, self.config.pool_capacity)):
            scratch.enqueue(scratch.admit(f"warm-{k}"), 16 * (k + 1), 0.0, self.config.kv_lease_s)
        inputs = scratch.build_tick(0.0)
        t0 = time.perf_counter()
        try:
            twin = copy.deepcopy(self.policy)
            learner = getattr(twin, "predictor", None)
            if getattr(learner, "ready", True) is False:  # compile its forecast, too
                for _ in range(learner.min_samples):
                    learner.observe(64)
            if inputs is not None:
                twin.assign(*inputs)
        except Exception as exc:  # the per-tick fallback takes over if the policy keeps failing
            log.warning("policy warm-up failed: %r", exc)
        log.debug("policy warm-up took %.3f s", time.perf_counter() - t0)
        self.warm = True

    async def start(self) -> None:
        """Warm the tick, then start the tick loop and the health/bootstrap loop."""
        self.warm_up()
        self.dispatcher.start()
        self.members.start()

    async def stop(self) -> None:
        """Stop background tasks (open streams end with their clients)."""
        await self.members.stop()
        await self.dispatcher.stop()

    # --------------------------------------------------------------- the request path
    async def generate(self, request: Request, *, chat: bool) -> Response:
        """Serve one ``/v1/completions`` or ``/v1/chat/completions`` request."""
        endpoint = "chat" if chat else "completions"
        try:
            body = await _read_body(request, self.config.max_body_bytes)
            creq = validate_request(parse_body(body), chat=chat, max_model_len=self.config.max_model_len)
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
            return error_response(err)
        self.metrics.accepted.labels(endpoint).inc()
        log.debug("%s: accepted (%s, stream=%s)", request_id, endpoint, creq.stream)

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
        stream: DecodeStream | None = None
        try:
            if self.dialect.has_prefill:
                prompt_len, kv = await self.prefills.run(ticket, creq)
            else:
                prompt_len, kv = approx_prompt_tokens(creq.payload), None
            stream = await self.decode.open(ticket, creq, prompt_len, kv)
            headers = {"X-Request-Id": ticket.request_id}
            if creq.stream:
                owned, stream = stream, None
                relay = StreamRelay(ticket, owned, creq, observe=self._observe, progress=self._progress,
                                    end=self._end, broken=self._broken)
                pushes = isinstance(owned.response, UpstreamResponse)  # the lean client can splice
                return RelayResponse(relay.run, splice=relay.splice if pushes else None, headers={
                    **headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                    on_close=lambda: self._abandon(ticket, owned))
            result = await self._assemble(ticket, stream, creq)
            self._end(ticket, "ok")
            return JSONResponse(result, headers=headers)
        except ApiError as err:
            self.metrics.errors.labels(err.kind).inc()
            self._end(ticket, err.kind)
            return error_response(err)
        except asyncio.CancelledError:
            self._end(ticket, "client_disconnect")
            raise
        except Exception as exc:  # a bug: answer it and keep the accounting right
            log.exception("request %s failed", ticket.request_id)
            self.metrics.errors.labels("internal").inc()
            self._end(ticket, "internal")
            return error_response(ApiError(500, f"internal proxy error: {exc!r}", kind="internal"))
        finally:
            if stream is not None:
                await stream.aclose()

    def _observe(self, ticket: Ticket, event: Event) -> None:
        """Per-event progress: a_i from ``usage.completion_tokens`` (and, without a prefill
        stage, s_i from ``usage.prompt_tokens``). Idempotent: re-observing changes nothing."""
        done = event.completion_tokens
        if done is not None and done > ticket.age:
            self._progress(ticket, done)
        if not ticket.prompt_checked and done is not None:  # the first usage object (not null)
            ticket.prompt_checked = True
            prompt = event.prompt_tokens
            if not self.dialect.has_prefill and prompt is not None and prompt > 0:
                self.ledger.set_prompt(ticket, prompt)

    def _progress(self, ticket: Ticket, done: int) -> None:
        """a_i grew to ``done`` (> ``ticket.age``)."""
        self.metrics.relayed_tokens += done - ticket.age
        self.ledger.progress(ticket, done)

    def _broken(self, ticket: Ticket, exc: StreamBroken) -> None:
        """A stream broke after its first token: counted, charged to its replica, ended."""
        self.metrics.errors.labels(exc.kind).inc()
        self.members.record(ticket.replica, False)
        self._end(ticket, exc.kind)

    async def _assemble(self, ticket: Ticket, stream: DecodeStream, creq: ClientRequest) -> dict:
        acc = Assembler(creq.chat)
        batch, stream.buffered = stream.buffered, []
        while True:
            for event in batch:
                if event.done:
                    return acc.result()
                message = event.error()
                if message is not None:
                    raise ApiError(502, f"decode failed mid-response: {message}", kind="decode_error_event")
                self._observe(ticket, event)
                acc.add(event.parsed())
            try:
                batch = await stream.next_batch(parse=True)
            except (UpstreamError, StreamBroken) as exc:
                raise ApiError(502, f"decode failed mid-response: {exc}", kind="decode_stream") from None
            if not batch:
                if not stream.finished:
                    raise ApiError(502, "decode stream ended before the request finished", kind="decode_stream")
                return acc.result()

    async def _abandon(self, ticket: Ticket, stream: DecodeStream) -> None:
        self._end(ticket, "client_disconnect")
        await stream.aclose()

    def _end(self, ticket: Ticket, outcome: str) -> None:
        tokens = ticket.age  # finishing releases the ticket's slot and its a_i
        if self.dispatcher.finish(ticket, outcome):
            if outcome == "ok" and tokens > 0 and self.learner is not None:
                self.learner(tokens)  # a complete output: its length, as decode reported it
            log.debug("%s: ended (%s) after %.3f s, %d tokens", ticket.request_id, outcome,
                      time.monotonic() - ticket.created, tokens)
            self.metrics.requests.labels(ticket.endpoint, outcome).inc()
            if outcome == "client_disconnect":
                self.metrics.errors.labels("client_disconnect").inc()

    def _on_tick(self, seconds: float, placed: int) -> None:
        self.metrics.tick.observe(seconds)

    def _extra_gauges(self) -> dict[str, tuple[str, Any]]:
        return {
            "balanceroute_prefill_ready": ("1 if a prefill instance is in service.", float(self.ready)),
            "balanceroute_panic": ("1 while too few replicas are usable and all are used (panic mode).",
                                   float(self.members.panic)),
            "balanceroute_policy_errors": ("Ticks whose policy raised (decided by least_load instead).",
                                           float(self.dispatcher.policy_errors)),
            "balanceroute_replica_ejected": ("1 while replica g is ejected by outlier detection.",
                                             [int(self.members.outliers.ejected(g)) for g in range(self.config.num_replicas)]),
        }

    # ------------------------------------------------------------------- health
    @property
    def ready(self) -> bool:
        """Whether requests can be served: the tick is warm, a decode replica and (PD) a prefill
        target are in service."""
        if not self.warm or not self.ledger.available.any():
            return False
        return not self.dialect.has_prefill or self.prefills.ready

    # -------------------------------------------------------------------- status
    def status(self) -> dict[str, Any]:
        """The JSON status: policy, replicas with their loads and outlier state, pool (with the
        oldest pooled request's age), counters, tick latency."""
        led, cfg, now, members = self.ledger, self.config, time.monotonic(), self.members
        n_ticks = max(self.dispatcher.ticks, 1)
        prefill_usable = self.prefills.in_service()
        return {
            "policy": getattr(self.policy, "name", cfg.policy),
            "predictor": self._predictor_status(),
            "kv_dialect": cfg.kv_dialect, "ready": self.ready, "panic": members.panic,
            "uptime_s": now - self._started,
            "replicas": [
                {"index": g, "url": d.url, "dp_rank": d.dp_rank, "available": bool(led.available[g]),
                 "drained": members.drained[g], "slots": int(led.capacity[g]),
                 "running": int(led.num_active[g]), "kv_load": int(led.loads[g]), **members.outliers.state(g)}
                for g, d in enumerate(cfg.decode)],
            "prefill": [
                {"index": i, "url": p.url, "in_service": prefill_usable[i],
                 "dp_ranks": None if self.prefills.engine_ids[i] is None else len(self.prefills.engine_ids[i] or {}),
                 "in_flight_tokens": sum(t.in_flight for t in self.prefills.targets if t.index == i),
                 **self.prefills.detector.state(i)}
                for i, p in enumerate(cfg.prefill)],
            "pool": {"size": len(led.pool), "capacity": led.pool_capacity,
                     "oldest_wait_s": max((now - t.joined for t in led.pool), default=0.0)},
            "prefilling": led.prefilling,
            "imbalance": led.imbalance(),
            "envelope": int(led.loads.max()),
            "mean_imbalance_at_ticks": self.dispatcher.imbalance_sum / n_ticks,
            "requests": {"accepted": led.accepted, "in_flight": led.in_flight, "finished": dict(led.finished)},
            "tick": {**self.dispatcher.tick_stats(), "policy_errors": self.dispatcher.policy_errors},
            "ejections": {"decode": dict(members.outliers.ejections_total),
                          "prefill": dict(self.prefills.detector.ejections_total)},
        }

    def _predictor_status(self) -> dict[str, Any] | None:
        """What the policy's forecast rests on: for one learnt from finished requests, how many
        lengths, whether it is ready and its spread (``None`` without a predictor)."""
        predictor = getattr(self.policy, "predictor", None)
        if predictor is None:
            return None
        out: dict[str, Any] = {"name": getattr(predictor, "name", type(predictor).__name__)}
        if self.learner is not None:
            spread = float(predictor.spread)
            out.update(samples=int(predictor.samples), ready=bool(predictor.ready),
                       spread=spread if math.isfinite(spread) else None)
        return out

    def check_admin(self, request: Request) -> None:
        """Admin endpoints are off (403) without a configured token, and need it (401) with one."""
        if self.admin_token is None:
            raise ApiError(403, "admin endpoints are disabled; set admin_token_env to enable them",
                           kind="admin_disabled")
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.admin_token}".encode()):
            raise ApiError(401, "this endpoint needs the admin token (Authorization: Bearer ...)",
                           kind="unauthorized")
