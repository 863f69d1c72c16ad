"""The stateful BalanceRoute proxy for vLLM / vllm-ascend prefill–decode deployments.

Request path (``docs/serving.md``): client → prefill (``max_tokens=1``, ``kv_transfer_params``; see
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
import functools
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

from .asgi import SPLICE
from .assemble import Assembler
from .config import ProxyConfig
from .decode import DecodeStage, KvMaybeSpent
from .dispatch import Dispatcher, LeaseExpired
from .health import Membership
from .kv import SglangDialect, get_dialect
from .ledger import Ledger, NoReplica, PoolFull, Ticket
from .logs import client_request_id, log_access
from .metrics import ProxyMetrics
from .outlier import OutlierDetector
from .prefill import PrefillStage
from .protocol import (
    ApiError,
    ClientRequest,
    approx_prompt_tokens,
    output_cap,
    parse_body,
    public_reason,
    validate_request,
)
from .relay import DecodeStream, Event, RelayResponse, StreamBroken
from .signals import Signals, build_readers
from .speed_fit import SpeedFit, TokenClock
from .stream_relay import StreamRelay
from .upstream import UpstreamError, UpstreamPool, UpstreamResponse
from .upstream_httpx import HttpxUpstream

__all__ = ["Proxy", "build_policy", "error_response", "warm_up_policy"]

log = logging.getLogger("balanceroute.serving.proxy")


def warm_up_policy(policy: Policy, config: ProxyConfig) -> None:
    """Run a copy of ``policy`` once on a scratch ledger of ``config``'s cluster shape, so a
    compiled tick is compiled (or loaded from its cache) before the first request, not during
    it. The policy object itself is not called: its state (cursors, memos) and anything
    watching it see only real ticks. A failure is logged (the per-tick fallback takes over if
    the policy keeps failing)."""
    scratch = Ledger(config.replica_slots(), pool_capacity=config.pool_capacity)
    for k in range(min(4, config.pool_capacity)):
        scratch.enqueue(scratch.admit(f"warm-{k}"), 16 * (k + 1), 0.0, config.kv_lease_s)
    inputs = scratch.build_tick(0.0)
    t0 = time.perf_counter()
    try:
        twin = copy.deepcopy(policy)
        learner = getattr(twin, "predictor", None)
        if getattr(learner, "ready", True) is False:  # compile its forecast, too
            for _ in range(learner.min_samples):
                learner.observe(64)
        if inputs is not None:
            twin.assign(*inputs)
    except Exception as exc:
        log.warning("policy warm-up failed: %r", exc)
    log.debug("policy warm-up took %.3f s", time.perf_counter() - t0)


def build_policy(config: ProxyConfig) -> Policy:
    """The configured policy (a catalogue row the proxy can run) with ``policy_params`` (and
    ``ttft_slo_s`` when set); ``deadline_s`` defaults to ``kv_lease_s − lease_margin_s`` for
    policies that take one, so requests near the end of their KV lease are dispatched first."""
    from balanceroute.catalogue import build_policy as build
    from balanceroute.catalogue import policy_entry

    entry = policy_entry(config.policy, online=True)
    params = config.policy_parameters()
    if entry.deadline and "deadline_s" not in params:
        params["deadline_s"] = config.policy_lease().deadline_s
    if "ttft_slo_s" in params and not entry.ttft_slo:
        raise ValueError(f"policy {config.policy!r} does not take ttft_slo_s (--ttft-slo)")
    return build(config.policy, params, online=True)


def error_response(err: ApiError) -> JSONResponse:
    """An :class:`ApiError` as an OpenAI-style JSON response."""
    return JSONResponse(err.body, status_code=err.status, headers=err.headers)


def _leg_done(request_id: str, task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("%s: prefill leg failed after decode was placed: %s", request_id, task.exception())


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
        # graceful drain (serving/drain.py): readiness fails while ``draining``; once the grace
        # is over (``stopping``) open relays end with an error event, unanswered requests get 503
        self.draining = False
        self.stopping = False
        self.open_relays: dict[Ticket, StreamRelay] = {}
        self._legs: dict[Ticket, asyncio.Task] = {}  # SGLang prefill legs of placed requests
        self.unanswered: dict[Ticket, asyncio.Future[Response]] = {}
        self.ledger = Ledger(config.replica_slots(), pool_capacity=config.pool_capacity)
        self.dispatcher = Dispatcher(self.ledger, policy, tick_interval_s=config.tick_interval_s,
                                     on_tick=self._on_tick)
        self.metrics = ProxyMetrics(self.ledger, [d.label for d in config.decode] if config.metrics_urls else None)
        self.prefills = PrefillStage(config, self.dialect, client, self.metrics,
                                     OutlierDetector(len(config.prefill), config.outlier))
        self.members = Membership(config, client, self.ledger, self.dispatcher, self.prefills, self.metrics)
        self.prefills.lag = self.members.lag
        self.decode = DecodeStage(config, self.upstream, self.ledger, self.dispatcher, self.members, self.metrics,
                                  self._observe)
        # engine-reported state, reconciled with the ledger in one place (serving/signals.py);
        # speed_fit: the replicas' SpeedFit (serving/speed_fit.py), fed by _progress
        self.speed_fit = (SpeedFit(num_replicas=self.ledger.num_replicas)
                          if getattr(config, "speed_fit", False) else None)
        self._token_clock = TokenClock()
        # a_i grew (per relayed token): straight to the ledger, through _speed_progress with a fit
        self._progress = self.ledger.progress if self.speed_fit is None else self._speed_progress
        self.signals = Signals(self.ledger, build_readers(config.engine_state, config.decode, client,
                                                          timeout_s=config.health_timeout_s),
                               poll_interval_s=config.engine_poll_interval_s, speed_fit=self.speed_fit,
                               on_read=self._on_engine_read)
        for g, d in enumerate(config.decode):  # configured KV budgets (an engine report replaces one)
            if getattr(d, "kv_budget", None):
                self.signals.set_budget(g, d.kv_budget, d.kv_block_size)
        self.ledger.reconcile = self.signals.reconcile
        self.ledger.reconciles = self.signals.adds_state
        self.metrics.register_gauges(self._extra_gauges)
        self.admin_token = config.admin_token()
        self._started = time.monotonic()
        # a predictor that learns from finished requests (brh-survival: OnlineSurvival)
        self.learner = getattr(getattr(policy, "predictor", None), "observe", None)

    # ----------------------------------------------------------------- lifecycle
    def warm_up(self) -> None:
        """:func:`warm_up_policy` on this proxy's policy and cluster shape."""
        warm_up_policy(self.policy, self.config)
        self.warm = True

    async def start(self) -> None:
        """Warm the tick, then start the tick loop and the health/bootstrap loop."""
        self.warm_up()
        # a restarted proxy starts from the engines' state, not from zero: one read before ready
        await self.signals.poll_once()
        self.signals.start()
        self.dispatcher.start()
        self.members.start()

    async def stop(self) -> None:
        """Stop background tasks (open streams end with their clients)."""
        await self.members.stop()
        await self.signals.stop()
        await self.dispatcher.stop()

    # --------------------------------------------------------------- the request path
    async def generate(self, request: Request, *, chat: bool) -> Response:
        """Serve one ``/v1/completions`` or ``/v1/chat/completions`` request."""
        endpoint = "chat" if chat else "completions"
        arrived = time.monotonic()
        # the client's X-Request-Id (sanitised) names the request in logs and in the response;
        # upstream gets it with a unique suffix (two clients may send the same id)
        client_id = client_request_id(request.headers.get("x-request-id"))
        request_id = f"{client_id}-{uuid.uuid4().hex[:12]}" if client_id else f"br-{uuid.uuid4().hex}"
        try:
            if self.draining:
                raise self.shutdown_error()
            body = await _read_body(request, self.config.max_body_bytes)
            creq = validate_request(parse_body(body), chat=chat, max_model_len=self.config.max_model_len)
            try:
                ticket = self.ledger.admit(request_id, endpoint=endpoint, now=time.monotonic(),
                                           output_cap=output_cap(creq.payload, chat=chat,
                                                                 max_model_len=self.config.max_model_len))
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
            err.headers.setdefault("X-Request-Id", client_id or request_id)
            log_access(request_id=client_id or request_id, endpoint=endpoint, status=err.status,
                       outcome=err.kind, duration_s=time.monotonic() - arrived)
            return error_response(err)
        ticket.client_id = client_id or ""
        ticket.stream = creq.stream
        self.metrics.accepted.labels(endpoint).inc()
        log.debug("%s: accepted (%s, stream=%s)", request_id, endpoint, creq.stream)

        work = asyncio.ensure_future(self._serve(ticket, creq))
        self.unanswered[ticket] = work
        work.add_done_callback(lambda _: self.unanswered.pop(ticket, None))
        # wait for the answer or the client's leaving, whichever comes first: the native server
        # calls back on a disconnect; under any other ASGI server a task waits for it
        either = asyncio.get_running_loop().create_future()

        def wake(_: Any = None) -> None:
            if not either.done():
                either.set_result(None)

        work.add_done_callback(wake)
        down = request.scope.get("extensions", {}).get(SPLICE, {}).get("downstream")
        watch = None
        if down is not None:
            down.when_gone(wake)
        else:
            watch = asyncio.ensure_future(_disconnected(request))
            watch.add_done_callback(wake)
        try:
            await either
        except asyncio.CancelledError:
            work.cancel()
            if watch is not None:
                watch.cancel()
            raise
        if work.done():
            if watch is not None:
                watch.cancel()
            if work.cancelled() and self.stopping:  # the drain's grace ended before an answer
                return error_response(self.shutdown_error())
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
            if self.dialect.holds_prefill_open:
                stream = await self._bootstrap_then_decode(ticket, creq)
            elif self.dialect.has_prefill:
                stream = await self._prefill_then_decode(ticket, creq)
            else:
                stream = await self.decode.open(ticket, creq, approx_prompt_tokens(creq.payload), None)
            headers = {"X-Request-Id": ticket.client_id or ticket.request_id}
            if creq.stream:
                owned, stream = stream, None
                relay = StreamRelay(ticket, owned, creq, observe=self._observe, progress=self._progress,
                                    end=self._end, broken=self._broken)
                self.open_relays[ticket] = relay
                pushes = isinstance(owned.response, UpstreamResponse)  # the lean client can splice
                return RelayResponse(relay.run, splice=relay.splice if pushes else None, headers={
                    **headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                    on_close=lambda: self._abandon(ticket, owned))
            result = await self._assemble(ticket, stream, creq)
            self._end(ticket, "ok")
            return JSONResponse(result, headers=headers)
        except ApiError as err:
            self.metrics.errors.labels(err.kind).inc()
            if err.detail:  # upstream addresses and bodies: the log's, never the client's
                log.log(logging.WARNING if err.status >= 500 else logging.INFO, "%s: %s: %s",
                        ticket.request_id, err.kind, err.detail)
            err.headers.setdefault("X-Request-Id", ticket.client_id or ticket.request_id)
            self._end(ticket, err.kind, err.status)
            return error_response(err)
        except asyncio.CancelledError:
            self._end(ticket, "shutdown" if self.stopping else "client_disconnect")
            raise
        except Exception:  # a bug: answer it and keep the accounting right
            log.exception("request %s failed", ticket.request_id)
            self.metrics.errors.labels("internal").inc()
            self._end(ticket, "internal")
            return error_response(ApiError(500, "internal proxy error", kind="internal"))
        finally:
            if stream is not None:
                await stream.aclose()

    async def _prefill_then_decode(self, ticket: Ticket, creq: ClientRequest) -> DecodeStream:
        """Prefill, then decode within the prefill server's KV lease (:class:`LeaseRule`): a
        request not forwarded by ``forward_by_s`` is prefilled again, up to ``max_reprefills``
        times, then answered 503 ``kv_lease_expired`` — never forwarded late."""
        repeat = 0
        while True:
            done = await self.prefills.run(ticket, creq, repeat)
            lease = self.config.lease_rule(done.index)
            try:
                return await self.decode.open(ticket, creq, done.prompt_len, done.kv, lease)
            except LeaseExpired as exc:
                repeat = self._prefill_again(ticket, exc, repeat, lease)

    def _prefill_again(self, ticket: Ticket, exc: LeaseExpired, repeat: int, lease: Any) -> int:
        """The lease rule's answer to a request not forwarded by ``forward_by_s``: back to
        prefill (the count of prefills so far + 1 returned) while ``max_reprefills`` allows,
        else 503 ``kv_lease_expired``. A decode attempt that may have spent the KV
        (:class:`KvMaybeSpent`) is prefilled again without using up ``max_reprefills``: the
        decode stage bounds it by ``max_attempts``."""
        spent = isinstance(exc, KvMaybeSpent)  # after a decode failure: max_attempts bounds it
        if not spent and repeat - getattr(exc, "kv_spent", 0) >= lease.max_reprefills:
            raise ApiError(503, f"{exc}; prefilled {repeat + 1} time(s), the decode replicas "
                           "stayed too busy: retry later", kind="lease_expired",
                           code="kv_lease_expired",
                           headers={"Retry-After": str(self.config.retry_after_s)}) from None
        self.metrics.retries.labels("reprefill").inc()
        if spent:
            log.info("%s: prefilling again: %s", ticket.request_id, exc)
        else:
            log.info("%s: not forwarded within the KV lease (%.1f s), prefilling again (%d of %d)",
                     ticket.request_id, lease.forward_by_s, repeat + 1, lease.max_reprefills)
        self.dispatcher.reprefill(ticket)
        return repeat + 1

    async def _bootstrap_then_decode(self, ticket: Ticket, creq: ClientRequest) -> DecodeStream:
        """SGLang dialect: the prefill leg goes out now and stays open; the request waits in the
        pool with s_i estimated by the proxy; the decode leg goes to the tick's replica with the
        same bootstrap room (and ``routed_dp_rank``). The lease is the one rule: a request not
        forwarded by ``forward_by_s`` has its prefill leg closed and gets a new one, up to
        ``max_reprefills`` times, then 503 ``kv_lease_expired``. A prefill leg that fails while
        the request waits fails the request."""
        dialect = self.dialect
        assert isinstance(dialect, SglangDialect)
        prompt_len = approx_prompt_tokens(creq.payload)
        repeat = 0
        while True:
            leg = self.prefills.open_leg(ticket, creq, repeat)
            lease = self.config.lease_rule(leg.index)

            def fields(g: int, leg_fields: dict = leg.fields) -> dict:
                return {**leg_fields, **dialect.decode_fields(self.config.decode[g].dp_rank)}

            decode = asyncio.ensure_future(self.decode.open(ticket, creq, prompt_len, None, lease, fields))
            try:
                await asyncio.wait({decode, leg.task}, return_when=asyncio.FIRST_COMPLETED)
                if not decode.done() and (leg.task.cancelled() or leg.task.exception() is not None):
                    decode.cancel()  # prefill failed before decode was placed: nothing to pull
                    with contextlib.suppress(asyncio.CancelledError, ApiError, LeaseExpired):
                        await decode
                    leg.task.result()  # raises the prefill failure
                stream = await decode
            except LeaseExpired as exc:
                leg.task.cancel()  # closing the leg aborts the request on the prefill server
                repeat = self._prefill_again(ticket, exc, repeat, lease)
                continue
            except BaseException:
                decode.cancel()
                leg.task.cancel()
                raise
            self._legs[ticket] = leg.task  # ends once decode pulled the KV; closed with the request
            leg.task.add_done_callback(functools.partial(_leg_done, ticket.request_id))
            return stream

    def _observe(self, ticket: Ticket, event: Event) -> None:
        """Per-event progress: a_i from ``usage.completion_tokens`` (and, where s_i was the
        proxy's estimate — no prefill stage, or SGLang's — s_i from ``usage.prompt_tokens``).
        Idempotent: re-observing changes nothing."""
        done = event.completion_tokens
        if done is not None and done > ticket.age:
            self._progress(ticket, done)
        if not ticket.prompt_checked and done is not None:  # the first usage object (not null)
            ticket.prompt_checked = True
            prompt = event.prompt_tokens
            estimated = not self.dialect.has_prefill or self.dialect.holds_prefill_open
            if estimated and prompt is not None and prompt > 0:
                self.ledger.set_prompt(ticket, prompt)

    def _speed_progress(self, ticket: Ticket, done: int) -> None:
        """a_i grew to ``done`` (> ``ticket.age``), with the speed fit on: the one place the
        relay feeds it, then the ledger (``_progress`` without a fit)."""
        g = ticket.replica
        interval = self._token_clock.interval(ticket.rid, done, time.monotonic())
        if interval is not None and g is not None and g >= 0:
            self.ledger.settle()  # (the fit reads L_g as of this token: no copy of the loads)
            self.speed_fit.observe(g, interval, float(self.ledger.loads[g]),  # type: ignore[union-attr]
                                   int(self.ledger.num_active[g]))
        self.ledger.progress(ticket, done)

    def _broken(self, ticket: Ticket, exc: StreamBroken) -> None:
        """A stream broke after its first token: counted, charged to its replica (unless a read
        timeout fired while the proxy's own loop lagged), logged (the client's error event says
        less), ended."""
        bound = self.config.decode_read_timeout_s
        lag = self.members.lag
        excused = exc.timed_out and lag.excuses(asyncio.get_running_loop().time() - bound, bound)
        log.warning("%s: decode replica %d failed mid-stream%s: %s", ticket.request_id, ticket.replica,
                    " (not charged: the proxy's own loop lagged)" if excused else "", exc)
        self.metrics.errors.labels(exc.kind).inc()
        if not excused:
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
                    raise ApiError(502, public_reason("decode failed mid-response", message),
                                   kind="decode_error_event", detail=f"decode replica {ticket.replica}: {message}")
                self._observe(ticket, event)
                acc.add(event.parsed())
            try:
                batch = await stream.next_batch(parse=True)
            except (UpstreamError, StreamBroken) as exc:
                raise ApiError(502, public_reason("decode failed mid-response", str(exc)), kind="decode_stream",
                               detail=f"decode replica {ticket.replica}: {exc}") from None
            if not batch:
                if not stream.finished:
                    raise ApiError(502, "decode stream ended before the request finished", kind="decode_stream")
                return acc.result()

    async def _abandon(self, ticket: Ticket, stream: DecodeStream) -> None:
        self._end(ticket, "client_disconnect")
        await stream.aclose()

    def _end(self, ticket: Ticket, outcome: str, status: int | None = None) -> None:
        tokens = ticket.age  # finishing releases the ticket's slot and its a_i
        replica = ticket.replica  # (and its replica)
        self.open_relays.pop(ticket, None)
        leg = self._legs.pop(ticket, None)
        if leg is not None and not leg.done():
            leg.cancel()
        if self.dispatcher.finish(ticket, outcome):
            self._access(ticket, outcome, status, tokens, replica)
            if outcome == "ok" and tokens > 0 and self.learner is not None:
                self.learner(tokens)  # a complete output: its length, as decode reported it
            log.debug("%s: ended (%s) after %.3f s, %d tokens", ticket.request_id, outcome,
                      time.monotonic() - ticket.created, tokens)
            self.metrics.requests.labels(ticket.endpoint, outcome).inc()
            if outcome == "ok" and ticket.first_token_at and tokens > ticket.first_token_tokens:
                self.metrics.tpot.observe((time.monotonic() - ticket.first_token_at)
                                          / (tokens - ticket.first_token_tokens))
            if outcome == "client_disconnect":
                self.metrics.errors.labels("client_disconnect").inc()

    def _access(self, ticket: Ticket, outcome: str, status: int | None, tokens: int, replica: int) -> None:
        """The request's access line (:func:`.logs.log_access`)."""
        if status is None:  # a stream's head (200) went out once it had its first token
            started = ticket.first_token and ticket.stream
            status = {"ok": 200, "client_disconnect": 499}.get(outcome) or (
                200 if started else 500 if outcome == "internal" else 503 if outcome.startswith("shut") else 502)
        now = time.monotonic()
        log_access(request_id=ticket.client_id or ticket.request_id, endpoint=ticket.endpoint,
                   stream=ticket.stream, status=status, outcome=outcome,
                   replica=replica if replica >= 0 else None,
                   prompt_tokens=ticket.prompt_len or None, output_tokens=tokens,
                   pool_wait_s=ticket.pool_wait_s,
                   ttft_s=ticket.first_token_at - ticket.created if ticket.first_token_at else None,
                   duration_s=now - ticket.created, attempts=ticket.decode_attempts,
                   upstream_id=ticket.request_id if ticket.client_id else None)

    def _on_tick(self, seconds: float, placed: int) -> None:
        self.metrics.tick.observe(seconds)

    def _on_engine_read(self, source: str, server: int, ok: bool) -> None:
        self.metrics.engine_reads.labels(source, str(server), "ok" if ok else "failed").inc()

    def _extra_gauges(self) -> dict[str, tuple[str, Any]]:
        return {
            **self.signals.gauges(),
            **({} if self.speed_fit is None else {
                "balanceroute_replica_step_a_seconds_per_token": (
                    "Fitted per-KV-token step cost a_g of replica g (speed fit).",
                    self.speed_fit.coefficients()[0].tolist()),
                "balanceroute_replica_step_b_seconds": (
                    "Step time's fixed part b_g of replica g (speed fit).",
                    self.speed_fit.coefficients()[1].tolist())}),
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
        """Whether requests can be served (:meth:`unready_reason` is ``None``)."""
        return self.unready_reason() is None

    def unready_reason(self) -> str | None:
        """Why the proxy is not ready, or ``None``: not draining, the tick warm and running, a
        decode replica and (PD) a prefill instance in service (:mod:`.health`)."""
        if self.draining:
            return "draining: the proxy is shutting down"
        if not self.warm:
            return "warming up: the policy's tick is not compiled yet"
        if self.dispatcher.stopped:
            return "the scheduling tick has stopped"
        reason = self.members.decode_unready()
        if reason is None and self.dialect.has_prefill:
            reason = self.members.prefill_unready()
        return reason

    def shutdown_error(self) -> ApiError:
        """What a request gets that the proxy will not serve because it is shutting down."""
        return ApiError(503, "the proxy is shutting down; retry the request (another instance will "
                        "serve it)", kind="shutting_down", code="shutting_down",
                        headers={"Retry-After": str(self.config.retry_after_s), "Connection": "close"})

    async def drain(self, grace_s: float) -> None:
        """The graceful drain (:func:`.drain.drain`)."""
        from .drain import drain

        await drain(self, grace_s)

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
                 "running": int(led.num_active[g]), "kv_load": int(led.loads[g]), **members.outliers.state(g),
                 **self.signals.replica_status(g, now),
                 **({} if self.speed_fit is None else {"speed": self.speed_fit.snapshot()[g]})}
                for g, d in enumerate(cfg.decode)],
            "prefill": [
                {"index": i, "url": p.url, "in_service": prefill_usable[i],
                 "dp_ranks": None if self.prefills.engine_ids[i] is None else len(self.prefills.engine_ids[i] or {}),
                 "in_flight_tokens": sum(t.in_flight for t in self.prefills.targets if t.index == i),
                 **self.prefills.detector.state(i)}
                for i, p in enumerate(cfg.prefill)],
            "engine_state": {"source": cfg.engine_state, "poll_interval_s": self.signals.poll_interval_s,
                             "max_age_s": self.signals.max_age_s, "reads": self.signals.reads,
                             "failures": self.signals.failures},
            "pool": {"size": len(led.pool), "capacity": led.pool_capacity,
                     "oldest_wait_s": max((now - t.joined for t in led.pool), default=0.0)},
            "prefilling": led.prefilling,
            "imbalance": led.imbalance(),
            "envelope": int(led.loads.max()),
            "mean_imbalance_at_ticks": self.dispatcher.imbalance_sum / n_ticks,
            "requests": {"accepted": led.accepted, "in_flight": led.in_flight, "finished": dict(led.finished)},
            "tick": {**self.dispatcher.tick_stats(), "policy_errors": self.dispatcher.policy_errors,
                     "compiled": self.dispatcher.compiled_ticks},
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
