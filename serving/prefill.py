"""The prefill stage: which prefill target a request goes to, and the ``max_tokens=1`` call that
gives s_i and the KV handle (``docs/serving.md``, "The request path").

Targets are prefill instances, or their DP ranks when the dialect learns them at run time
(Mooncake ``/query``). They are taken round robin (or least in-flight prompt tokens) among the
instances the :class:`~.outlier.OutlierDetector` keeps in service; a request retries on another
instance, up to ``max_attempts``, and stops early once it failed on ``poison_hosts`` instances.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx

from .config import ProxyConfig
from .http1 import local_error
from .kv import KvDialect, MooncakeDialect, SglangDialect
from .ledger import Ticket
from .metrics import ProxyMetrics
from .outlier import OutlierDetector
from .protocol import (
    ApiError,
    ClientRequest,
    approx_prompt_tokens,
    is_retryable,
    prefill_body,
    public_reason,
    upstream_headers,
)
from .upstream import out_of_resources

__all__ = ["PrefillLeg", "Prefilled", "PrefillStage", "PrefillTarget"]

log = logging.getLogger("balanceroute.serving.prefill")


@dataclass(slots=True, eq=False)
class PrefillTarget:
    """One prefill instance (``dp_rank=None``) or one DP rank of it."""

    index: int
    url: str
    dp_rank: int | None
    in_flight: int = 0


@dataclass(frozen=True, slots=True)
class Prefilled:
    """What a prefill call gave: s_i, decode's ``kv_transfer_params`` (``None``: decode
    recomputes) and the index of the prefill server that holds the KV (whose lease applies)."""

    prompt_len: int
    kv: dict[str, Any] | None
    index: int


@dataclass(slots=True, eq=False)
class PrefillLeg:
    """A prefill request held open (SGLang dialect): the prefill server's index, the bootstrap
    fields decode must carry too, and the task posting it (it ends when decode has pulled the
    KV; it raises :class:`ApiError` when prefill failed)."""

    index: int
    fields: dict[str, Any]
    task: asyncio.Task


@dataclass(slots=True, eq=False)
class PrefillStage:
    """Prefill targets, their outlier state, and the prefill call."""

    config: ProxyConfig
    dialect: KvDialect
    client: httpx.AsyncClient
    metrics: ProxyMetrics
    detector: OutlierDetector
    engine_ids: list[dict[int, str] | None] = field(default_factory=list)
    targets: list[PrefillTarget] = field(default_factory=list)
    cursor: int = 0
    lag: Any = None  # the proxy's LoopLag (.health): a timeout while the loop lagged charges nobody

    def __post_init__(self) -> None:
        self.engine_ids = [None] * len(self.config.prefill)
        if not self.dialect.discovers_ranks:
            self.targets = [PrefillTarget(i, p.url, None) for i, p in enumerate(self.config.prefill)]

    # ------------------------------------------------------------------ targets
    def set_engine_ids(self, index: int, ids: dict[int, str]) -> None:
        """Instance ``index`` has these DP ranks (from its bootstrap server)."""
        self.engine_ids[index] = ids
        self.targets = [t for t in self.targets if t.index != index] + [
            PrefillTarget(index, self.config.prefill[index].url, rank) for rank in sorted(ids)]
        self.targets.sort(key=lambda t: (t.index, t.dp_rank or 0))

    @property
    def discovered(self) -> bool:
        """Every instance's DP ranks are known (always true without rank discovery)."""
        return not self.dialect.discovers_ranks or all(ids is not None for ids in self.engine_ids)

    async def discover(self) -> None:
        """Mooncake: learn each instance's DP engine ids from its bootstrap ``/query``."""
        for i in range(len(self.config.prefill)):
            if self.engine_ids[i] is not None:
                continue
            ids = await MooncakeDialect.query_engine_ids(self.client, self.config.bootstrap_addr(i),
                                                         self.config.health_timeout_s)
            if ids:
                self.set_engine_ids(i, ids)
                log.info("prefill %s: %d DP rank(s) from bootstrap", self.config.prefill[i].url, len(ids))

    def in_service(self) -> list[bool]:
        """Per instance: usable now (outlier state, panic included)."""
        return self.detector.usable()[0]

    @property
    def ready(self) -> bool:
        """A target is known and in service."""
        usable = self.in_service()
        return any(usable[t.index] for t in self.targets)

    def pick(self, tried: list[PrefillTarget]) -> PrefillTarget | None:
        """Round robin (or least in-flight prompt tokens) over usable targets on instances this
        request has not tried; when it has tried them all, over every usable target again."""
        usable = self.in_service()
        seen = {t.index for t in tried}
        pool = [t for t in self.targets if usable[t.index]]
        fresh = [t for t in pool if t.index not in seen] or pool
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

    def _record(self, index: int, ok: bool) -> None:
        reason = self.detector.record(index, ok)
        if reason is not None:
            self.metrics.ejections.labels("prefill", reason).inc()
            log.warning("prefill instance %d ejected (%s)", index, reason)

    # ------------------------------------------------------------ held-open leg
    def open_leg(self, ticket: Ticket, creq: ClientRequest, repeat: int = 0) -> PrefillLeg:
        """SGLang dialect: send the client's body (not streamed) with a fresh bootstrap room to a
        usable prefill server and return at once; the leg stays open until decode pulls the KV."""
        cfg = self.config
        target = self.pick([])
        if target is None:
            raise ApiError(503, "no prefill instance is in service", kind="prefill_failed",
                           code="prefill_failed", headers={"Retry-After": str(cfg.retry_after_s)})
        endpoint = cfg.prefill[target.index]
        assert isinstance(self.dialect, SglangDialect)
        fields = self.dialect.bootstrap(target.url, endpoint.bootstrap_addr, cfg.bootstrap_port)
        body = {k: v for k, v in creq.payload.items() if k != "stream_options"}
        body.update(fields, stream=False)
        request_id = ticket.request_id if not repeat else f"{ticket.request_id}-r{repeat}"
        task = asyncio.ensure_future(self._leg(target, creq, body, request_id))
        return PrefillLeg(target.index, fields, task)

    async def _leg(self, target: PrefillTarget, creq: ClientRequest, body: dict[str, Any],
                   request_id: str) -> None:
        cfg = self.config
        weight = approx_prompt_tokens(creq.payload)
        # it answers after the pool wait too, which the lease bounds
        read_s = cfg.prefill_timeout_s + cfg.lease_rule(target.index).lease_s
        target.in_flight += weight
        try:
            resp = await self.client.post(
                target.url + creq.path, json=body,
                headers=upstream_headers(request_id, target.dp_rank, cfg.prefill[target.index].api_key()),
                timeout=httpx.Timeout(read_s, connect=cfg.connect_timeout_s))
        except httpx.HTTPError as exc:
            self.metrics.errors.labels("prefill_connect").inc()
            self._record(target.index, False)
            detail = f"prefill {target.url}: {type(exc).__name__}: {exc}"
            raise ApiError(502, public_reason("prefill failed", detail), kind="prefill_failed",
                           code="prefill_failed", detail=detail) from None
        finally:
            target.in_flight -= weight
        if resp.status_code != 200:
            self.metrics.errors.labels("prefill_http").inc()
            self._record(target.index, False)
            detail = f"prefill {target.url}: HTTP {resp.status_code}: {resp.text[:200]}"
            raise ApiError(502, public_reason("prefill failed", detail), kind="prefill_failed",
                           code="prefill_failed", detail=detail)
        self._record(target.index, True)

    # --------------------------------------------------------------- the call
    async def run(self, ticket: Ticket, creq: ClientRequest, repeat: int = 0) -> Prefilled:
        """Prefill on a usable instance, retrying on others. Failures count against an instance
        only when this request then succeeds elsewhere (or the connection itself failed).
        ``repeat`` > 0: the request missed its KV lease and is prefilled again, under its own
        request id (``<id>-r<repeat>``) so the server never sees one id twice."""
        cfg = self.config
        tried: list[PrefillTarget] = []
        failed_on: list[int] = []
        last = "no prefill instance is in service"
        weight = approx_prompt_tokens(creq.payload)
        request_id = ticket.request_id if not repeat else f"{ticket.request_id}-r{repeat}"
        transfer_id = f"xfer-{request_id}"
        for attempt in range(cfg.max_attempts):
            if len(set(failed_on)) >= cfg.outlier.poison_hosts:
                self.metrics.poison.labels("prefill").inc()
                break
            target = self.pick(tried)
            if target is None:
                break
            if attempt:
                self.metrics.retries.labels("prefill").inc()
                log.warning("%s: prefill attempt %d failed: %s", ticket.request_id, attempt, last)
            tried.append(target)
            endpoint = cfg.prefill[target.index]
            target.in_flight += weight
            deadline = cfg.prefill_timeout_s + cfg.prefill_timeout_per_token_s * weight
            started = asyncio.get_running_loop().time()
            try:
                async with asyncio.timeout(deadline):  # per attempt; then another instance
                    resp = await self.client.post(
                        target.url + creq.path,
                        json=prefill_body(creq.payload, self.dialect.prefill_params(transfer_id)),
                        headers=upstream_headers(request_id, target.dp_rank, endpoint.api_key()),
                        timeout=httpx.Timeout(deadline, connect=cfg.connect_timeout_s))
            except (httpx.HTTPError, TimeoutError) as exc:
                if local_error(exc) or isinstance(exc, httpx.PoolTimeout):  # the proxy's own limits
                    log.warning("%s: prefill not tried: %s", ticket.request_id, exc)
                    raise out_of_resources(cfg.retry_after_s) from None
                last = f"prefill {target.url}: {type(exc).__name__}: {exc}"
                self.metrics.errors.labels("prefill_connect").inc()
                if isinstance(exc, (TimeoutError, httpx.TimeoutException)) and not isinstance(exc, httpx.PoolTimeout):
                    last = f"prefill {target.url}: no answer within {deadline:.3g} s ({type(exc).__name__})"
                    self.metrics.errors.labels("prefill_timeout").inc()
                    bound = cfg.connect_timeout_s if isinstance(exc, httpx.ConnectTimeout) else deadline
                    if self.lag is None or not self.lag.excuses(started, bound):
                        self._record(target.index, False)  # the instance's failure (not the proxy's lag)
                elif isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
                    self._record(target.index, False)  # the instance's fault, not the request's
                else:
                    failed_on.append(target.index)
                continue
            finally:
                target.in_flight -= weight
            if resp.status_code != 200:
                if not is_retryable(resp.status_code):
                    raise ApiError.from_upstream(resp.status_code, resp.content, kind="prefill_rejected")
                last = f"prefill {target.url}: HTTP {resp.status_code}: {resp.text[:200]}"
                self.metrics.errors.labels("prefill_http").inc()
                failed_on.append(target.index)
                continue
            try:
                data = resp.json()
                usage = data.get("usage") or {}
                prompt_len = usage.get("prompt_tokens")
            except (ValueError, AttributeError):
                last = f"prefill {target.url}: the reply is not a JSON object"
                self.metrics.errors.labels("prefill_protocol").inc()
                failed_on.append(target.index)
                continue
            if not isinstance(prompt_len, int) or prompt_len < 1:
                prompt_len = weight
            ids = self.engine_ids[target.index] or {}
            kv = self.dialect.decode_params(data, transfer_id, cfg.bootstrap_addr(target.index),
                                            ids.get(target.dp_rank or 0))
            if kv is None:
                self.metrics.errors.labels("prefill_no_kv_params").inc()
            for index in failed_on:
                if index != target.index:
                    self._record(index, False)
            self._record(target.index, True)
            return Prefilled(prompt_len, kv, target.index)
        raise ApiError(502, public_reason(f"prefill failed after {len(tried)} attempt(s)", last),
                       kind="prefill_failed", code="prefill_failed", detail=last)
