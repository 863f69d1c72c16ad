"""The decode stage: wait for the tick's replica, open the decode stream up to its first token,
retry before it, and attribute failures ("fail small", ``docs/serving.md``).

Before the first token a failure sends the request back to the pool (the tick picks again; the
dispatcher steers it away from replicas it failed on), up to ``max_attempts``, then 502. A
request that failed on ``outlier.poison_hosts`` replicas is poison and fails alone. A replica is
charged with a failure only with evidence: at once for a refused connection, otherwise when the
same request then got its first token elsewhere; the replica that served it is credited.

With a prefill stage, an attempt that reached the decode server is never retried with the same
KV: the server may have pulled it already, and the prefill server frees pulled (or expired)
blocks, so the same ``kv_transfer_params`` (or bootstrap room) could name blocks another request
now owns. Such a request is prefilled again (:class:`KvMaybeSpent`; bounded by
``max_attempts`` and the poison rule, like any retry, not by the lease's ``max_reprefills``);
only an attempt that never reached the server (no connection) is retried as it is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from balanceroute.core.lease import LeaseRule

from .config import ProxyConfig
from .dispatch import Dispatcher, LeaseExpired
from .health import Membership
from .ledger import Ledger, Ticket
from .metrics import ProxyMetrics
from .protocol import (
    ApiError,
    ClientRequest,
    decode_body,
    is_retryable,
    public_reason,
    upstream_headers,
)
from .relay import DecodeStream, Event, StreamBroken, has_token
from .upstream import UpstreamError, UpstreamPool, out_of_resources
from .upstream_httpx import HttpxUpstream

__all__ = ["DecodeStage", "KvMaybeSpent"]

log = logging.getLogger("balanceroute.serving.decode")


class KvMaybeSpent(LeaseExpired):
    """A decode attempt failed after the request reached the decode server, which may have
    pulled its KV (the prefill server then frees it): the request must be prefilled again, never
    resent with the same KV. Unlike a missed lease it does not use up ``max_reprefills``
    (``max_attempts`` bounds it)."""


class _Retryable(Exception):
    """An attempt failed before the first token. ``connect``: charge the replica at once;
    otherwise it is charged once the request succeeds elsewhere, unless ``excused`` (a timeout
    while the proxy's own loop lagged: only retried). ``sent``: the request may have reached
    the decode server (which may then have pulled its KV); ``False`` only when no connection
    was made."""

    def __init__(self, kind: str, message: str, *, connect: bool = False, sent: bool = True,
                 excused: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.connect = connect and not excused
        self.sent = sent
        self.excused = excused


@dataclass(slots=True, eq=False)
class DecodeStage:
    """Opens decode streams for tickets; ``observe(ticket, event)`` records per-event progress."""

    config: ProxyConfig
    upstream: UpstreamPool | HttpxUpstream
    ledger: Ledger
    dispatcher: Dispatcher
    members: Membership
    metrics: ProxyMetrics
    observe: Callable[[Ticket, Event], None]
    #: per live ticket (rid), the replicas it failed on for a reason it may carry, kept across a
    #: re-prefill so the evidence rules (charge on success elsewhere, poison) see every attempt
    _suspects: dict[int, list[int]] = field(default_factory=dict)
    #: per live ticket (rid), how many times it was prefilled again after a decode failure
    #: (``kv_spent`` on every :class:`LeaseExpired` open raises: the rest were missed leases)
    _spent: dict[int, int] = field(default_factory=dict)

    async def open(self, ticket: Ticket, creq: ClientRequest, prompt_len: int,
                   kv: dict | None, lease: LeaseRule | None = None,
                   fields: Callable[[int], dict] | None = None) -> DecodeStream:
        """Pool the ticket, wait for the tick's replica and open the decode stream up to the
        first token; before it, failures send the ticket back to the pool (bounded).

        ``lease``: the KV lease of the prefill server that holds the ticket's KV. The ticket is
        never forwarded once ``lease.forward_by_s`` has passed since it was pooled: then
        :class:`LeaseExpired` goes to the caller (which prefills it again or fails it). Without
        a lease (no prefill stage) a pool wait of ``kv_lease_s`` is a 503. ``fields(g)``: body
        fields for replica ``g`` (the SGLang dialect's bootstrap room and ``routed_dp_rank``)."""
        cfg = self.config
        forward_by = cfg.kv_lease_s if lease is None else lease.forward_by_s
        body = json.dumps(decode_body(creq.payload, kv), ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode()
        pooled_at = time.monotonic()
        # replicas that failed this request for a reason it may carry (before a re-prefill too)
        suspects: list[int] = self._suspects.pop(ticket.rid, [])
        first = True
        while True:
            try:
                g = await self.dispatcher.wait_for_slot(ticket, prompt_len if first else None, forward_by)
                if lease is not None and self.dispatcher.missed_lease(ticket):
                    raise LeaseExpired(f"request {ticket.request_id} was placed {forward_by:.1f} s or more "
                                       "after prefill, too late to forward within the KV lease")
            except LeaseExpired as exc:
                if lease is not None:
                    exc.kv_spent = self._spent.get(ticket.rid, 0)  # type: ignore[attr-defined]
                    raise
                raise ApiError(503, str(exc), kind="lease_expired", code="kv_lease_expired") from None
            waited = time.monotonic() - pooled_at
            ticket.pool_wait_s = waited
            if first:
                self.metrics.pool_wait.observe(waited)
            log.debug("%s: replica %d after %.3f s in the pool (attempt %d)", ticket.request_id, g,
                      waited, ticket.decode_attempts + 1)
            first = False
            ticket.decode_attempts += 1
            if fields is not None:
                body = json.dumps({**decode_body(creq.payload, kv), **fields(g)}, ensure_ascii=False,
                                  separators=(",", ":"), allow_nan=False).encode()
            try:
                stream = await self._open(ticket, g, creq, body)
            except _Retryable as exc:
                self.metrics.errors.labels(exc.kind).inc()
                ticket.failed_on.append(g)
                log.warning("%s: decode replica %d (%s) failed, attempt %d: %s", ticket.request_id, g,
                            cfg.decode[g].label, ticket.decode_attempts, exc)
                if exc.connect:
                    self.members.record(g, False)
                elif not exc.excused:
                    suspects.append(g)
                if len(set(suspects)) >= cfg.outlier.poison_hosts:
                    self.metrics.poison.labels("decode").inc()
                    raise ApiError(502, public_reason(
                        f"decode failed on {len(set(suspects))} replicas; this request is not retried "
                        "further", str(exc)), kind="decode_failed", code="decode_failed", detail=str(exc)) from None
                if ticket.decode_attempts >= cfg.max_attempts:
                    raise ApiError(502, public_reason(f"decode failed after {ticket.decode_attempts} "
                                                      "attempt(s)", str(exc)),
                                   kind="decode_failed", code="decode_failed", detail=str(exc)) from None
                if lease is not None and exc.sent:
                    # its KV may be pulled and freed on the prefill server: never resend it
                    for store in (self._suspects, self._spent):
                        for rid in [r for r in store if r not in self.ledger.tickets]:
                            del store[rid]  # tickets that ended meanwhile
                    self._suspects[ticket.rid] = suspects
                    self._spent[ticket.rid] = spent = self._spent.get(ticket.rid, 0) + 1
                    err = KvMaybeSpent(f"decode replica {g} failed after the request reached it "
                                       f"({exc.kind}); its KV may already be freed on the prefill "
                                       "server, so it is prefilled again, not retried with the "
                                       "same KV")
                    err.kv_spent = spent  # type: ignore[attr-defined]
                    raise err from None
                self.metrics.retries.labels("decode").inc()
                # without a lease (no prefill stage) the bound is a pool wait: a first-token
                # timeout as long as kv_lease_s must still leave the retry its wait
                self.ledger.requeue(ticket, renew=None if lease is not None
                                    else (self.dispatcher.clock(), forward_by))
                continue
            for h in suspects:  # the request works elsewhere: those failures were the replicas'
                if h != g:
                    self.members.record(h, False)
            self.members.record(g, True)
            return stream

    async def _open(self, ticket: Ticket, g: int, creq: ClientRequest, body: bytes) -> DecodeStream:
        """One attempt on replica ``g`` up to its first token, within
        ``decode_first_token_timeout_s`` (past it the attempt is aborted, charged to the replica
        and retried elsewhere: nothing has been sent to the client yet)."""
        limit = self.config.decode_first_token_timeout_s
        start = asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(limit):
                return await self._attempt(ticket, g, creq, body)
        except TimeoutError:
            # charged at once, unless the proxy's own loop lagged meanwhile (then only retried)
            raise _Retryable("decode_timeout", f"decode {g}: no first token within {limit:g} s",
                             connect=True, excused=self.members.lag.excuses(start, limit)) from None

    def _excused(self, exc: UpstreamError, start: float) -> bool:
        """Whether a connect or read timeout (timer running since loop time ``start`` at the
        earliest) fired while the proxy's own loop lagged: then it says nothing of the replica."""
        if not exc.timed_out:
            return False
        bound = self.config.connect_timeout_s if exc.connect else self.config.decode_read_timeout_s
        return self.members.lag.excuses(max(start, asyncio.get_running_loop().time() - bound), bound)

    async def _attempt(self, ticket: Ticket, g: int, creq: ClientRequest, body: bytes) -> DecodeStream:
        cfg = self.config
        rep = cfg.decode[g]
        start = asyncio.get_running_loop().time()
        try:
            response = await self.upstream.post_stream(
                rep.url + creq.path, body, upstream_headers(ticket.request_id, rep.dp_rank, rep.api_key()),
                # up to the first token only its deadline applies (the caller's), then the stall timeout
                connect_timeout=cfg.connect_timeout_s,
                read_timeout=max(cfg.decode_read_timeout_s, cfg.decode_first_token_timeout_s))
        except UpstreamError as exc:
            if exc.local:  # the proxy's own descriptors or buffers: nobody else's failure
                log.warning("%s: decode replica %d not tried: %s", ticket.request_id, g, exc)
                raise out_of_resources(cfg.retry_after_s) from None
            raise _Retryable("decode_connect", f"decode {g}: {exc}", connect=exc.connect, sent=not exc.connect,
                             excused=self._excused(exc, start)) from None
        if response.status != 200:
            try:
                content = await response.aread()
            except UpstreamError:
                content = b""
            finally:
                await response.aclose()
            if not is_retryable(response.status):
                raise ApiError.from_upstream(response.status, content, kind="decode_rejected")
            raise _Retryable("decode_http", f"decode {g}: HTTP {response.status}: "
                             f"{content[:200].decode('utf-8', 'replace')}")
        stream = DecodeStream(response)
        pending: list[Event] = []  # read before the client is answered; relayed first
        try:
            while True:
                batch = await stream.next_batch(parse=True)
                if not batch:
                    raise _Retryable("decode_stream", f"decode {g}: stream ended before the first token")
                pending.extend(batch)
                for event in batch:
                    if event.done:
                        raise _Retryable("decode_stream", f"decode {g}: stream ended before the first token")
                    message = event.error()
                    if message is not None:
                        raise _Retryable("decode_error_event", f"decode {g}: {message}")
                    self.observe(ticket, event)
                    if has_token(event.parsed()):
                        response.read_timeout = cfg.decode_read_timeout_s
                        stream.buffered = pending
                        if not ticket.first_token:
                            ticket.first_token = True
                            ticket.first_token_at = time.monotonic()
                            ticket.first_token_tokens = ticket.age
                            self.metrics.ttft.observe(ticket.first_token_at - ticket.created)
                        log.debug("%s: first token from replica %d, %.3f s after arrival",
                                  ticket.request_id, g, time.monotonic() - ticket.created)
                        return stream
        except StreamBroken as exc:
            await stream.aclose()
            raise _Retryable(exc.kind, str(exc)) from None
        except UpstreamError as exc:
            await stream.aclose()
            raise _Retryable("decode_stream", f"decode {g}: {exc}", excused=self._excused(exc, start)) from None
        except BaseException:
            await stream.aclose()
            raise

