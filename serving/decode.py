"""The decode stage: wait for the tick's replica, open the decode stream up to its first token,
retry before it, and attribute failures (DESIGN §4, "fail small").

Before the first token a failure sends the request back to the pool (the tick picks again; the
dispatcher steers it away from replicas it failed on), up to ``max_attempts``, then 502. A
request that failed on ``outlier.poison_hosts`` replicas is poison and fails alone. A replica is
charged with a failure only with evidence: at once for a refused connection, otherwise when the
same request then got its first token elsewhere; the replica that served it is credited.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from .config import ProxyConfig
from .dispatch import Dispatcher, LeaseExpired
from .health import Membership
from .ledger import Ledger, Ticket
from .metrics import ProxyMetrics
from .protocol import ApiError, ClientRequest, decode_body, is_retryable, upstream_headers
from .relay import DecodeStream, Event, StreamBroken, has_token
from .upstream import UpstreamError, UpstreamPool
from .upstream_httpx import HttpxUpstream

__all__ = ["DecodeStage"]

log = logging.getLogger("balanceroute.serving.decode")


class _Retryable(Exception):
    def __init__(self, kind: str, message: str, *, connect: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.connect = connect


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

    async def open(self, ticket: Ticket, creq: ClientRequest, prompt_len: int,
                   kv: dict | None) -> DecodeStream:
        """Pool the ticket, wait for the tick's replica and open the decode stream up to the
        first token; before it, failures send the ticket back to the pool (bounded)."""
        cfg = self.config
        body = json.dumps(decode_body(creq.payload, kv), ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode()
        pooled_at = time.monotonic()
        suspects: list[int] = []  # replicas that failed this request for a reason it may carry
        first = True
        while True:
            try:
                g = await self.dispatcher.wait_for_slot(ticket, prompt_len if first else None, cfg.kv_lease_s)
            except LeaseExpired as exc:
                raise ApiError(503, str(exc), kind="lease_expired", code="kv_lease_expired") from None
            waited = time.monotonic() - pooled_at
            if first:
                self.metrics.pool_wait.observe(waited)
            log.debug("%s: replica %d after %.3f s in the pool (attempt %d)", ticket.request_id, g,
                      waited, ticket.decode_attempts + 1)
            first = False
            ticket.decode_attempts += 1
            try:
                stream = await self._open(ticket, g, creq, body)
            except _Retryable as exc:
                self.metrics.errors.labels(exc.kind).inc()
                ticket.failed_on.append(g)
                if exc.connect:
                    self.members.record(g, False)
                else:
                    suspects.append(g)
                if len(set(suspects)) >= cfg.outlier.poison_hosts:
                    self.metrics.poison.labels("decode").inc()
                    raise ApiError(502, f"decode failed on {len(set(suspects))} replicas; this request "
                                   f"is not retried further: {exc}", kind="decode_failed",
                                   code="decode_failed") from None
                if ticket.decode_attempts >= cfg.max_attempts:
                    raise ApiError(502, f"decode failed after {ticket.decode_attempts} attempt(s): {exc}",
                                   kind="decode_failed", code="decode_failed") from None
                self.metrics.retries.labels("decode").inc()
                self.ledger.requeue(ticket)
                continue
            for h in suspects:  # the request works elsewhere: those failures were the replicas'
                if h != g:
                    self.members.record(h, False)
            self.members.record(g, True)
            return stream

    async def _open(self, ticket: Ticket, g: int, creq: ClientRequest, body: bytes) -> DecodeStream:
        cfg = self.config
        rep = cfg.decode[g]
        try:
            response = await self.upstream.post_stream(
                rep.url + creq.path, body, upstream_headers(ticket.request_id, rep.dp_rank, rep.api_key()),
                connect_timeout=cfg.connect_timeout_s, read_timeout=cfg.decode_read_timeout_s)
        except UpstreamError as exc:
            raise _Retryable("decode_connect", f"decode {g}: {exc}", connect=exc.connect) from None
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
                        stream.buffered = pending
                        if not ticket.first_token:
                            ticket.first_token = True
                            self.metrics.ttft.observe(time.monotonic() - ticket.created)
                        log.debug("%s: first token from replica %d, %.3f s after arrival",
                                  ticket.request_id, g, time.monotonic() - ticket.created)
                        return stream
        except StreamBroken as exc:
            await stream.aclose()
            raise _Retryable(exc.kind, str(exc)) from None
        except UpstreamError as exc:
            await stream.aclose()
            raise _Retryable("decode_stream", f"decode {g}: {exc}") from None
        except BaseException:
            await stream.aclose()
            raise

