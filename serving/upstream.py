"""The decode stream's HTTP/1.1 client: a keep-alive pool of connections (:mod:`.upstream_conn`:
the asyncio protocol per connection and the response read on it, chunked transfer decoding by
byte scanning, read timeouts, abort by closing), connect timeouts, the request sent.

The relay reads one decode response per request, event by event; a general client (httpx)
spends most of the proxy's CPU per chunk in its layers of async iterators and its HTTP state
machine. Here a socket read is one ``data_received`` callback into a buffer and one wake-up of
the waiting relay. Closing a response before its end closes the connection, so vLLM aborts the
request; a response read to its end returns the connection to the pool.

Both implementations of the small contract the decode stage uses —
``await post_stream(url, content, headers, connect_timeout=, read_timeout=)`` → a response with
``status``, ``headers``, ``await read()`` (body bytes, ``b""`` at the end), ``await aread()``
and ``await aclose()`` — raise only :class:`UpstreamError`: :class:`UpstreamPool` (sockets) and
:class:`~.upstream_httpx.HttpxUpstream` (an injected ``httpx.AsyncClient``, so tests can swap
the transport). Only this module's responses also push their body (:meth:`UpstreamResponse.attach`),
which the native server's zero-wake relay uses.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from urllib.parse import urlsplit

from .config import ProxyConfig
from .http1 import MAX_LINE, UpstreamError, local_error, parse_head
from .protocol import ApiError
from .upstream_conn import BodySink, UpstreamConnection, UpstreamResponse

__all__ = ["BodySink", "UpstreamError", "UpstreamPool", "UpstreamResponse", "connection_bounds",
           "out_of_resources"]

_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")  # header smuggling: no CR, LF, NUL, ... in what we send


def connection_bounds(config: ProxyConfig) -> dict[str, int]:
    """Upstream connection bounds for ``config``: ``per_host`` — decode streams to one host (the
    slots of its replicas, DP ranks summed, plus 8 for streams being closed); ``client`` — the
    shared HTTP client's connections (prefill calls, at most ``pool_capacity`` at a time, plus
    probes and reads: 2 per upstream, plus 32)."""
    per_host: dict[str, int] = {}
    for rep, slots in zip(config.decode, config.replica_slots(), strict=True):
        host = urlsplit(rep.url).netloc
        per_host[host] = per_host.get(host, 0) + slots
    return {"per_host": max(per_host.values()) + 8,
            "client": config.pool_capacity + 2 * (len(config.prefill) + len(config.decode)) + 32}


def out_of_resources(retry_after_s: int) -> ApiError:
    """What a client gets when the proxy itself is out of descriptors (or buffers): 503 and
    ``Retry-After``; no upstream is charged."""
    return ApiError(503, "the proxy is temporarily out of connections; retry shortly", kind="local_resources",
                    code="proxy_overloaded", headers={"Retry-After": str(max(1, retry_after_s))})


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections per (scheme, host, port) for streamed POSTs; at most
    ``max_per_host`` open at a time per host (``None``: no bound): a request beyond it waits
    for one to close, up to its connect timeout, then fails as a local error (nobody's fault)."""

    def __init__(self, *, max_idle_per_host: int = 512, max_per_host: int | None = None) -> None:
        self.max_idle_per_host = max_idle_per_host
        self.max_per_host = max_per_host
        self._idle: dict[tuple[str, str, int], list[UpstreamConnection]] = {}
        self._open: dict[tuple[str, str, int], int] = {}
        self._freed: dict[tuple[str, str, int], asyncio.Event] = {}
        self._ssl: ssl.SSLContext | None = None
        # url -> (pool key, request target, the request head up to Content-Length's value)
        self._targets: dict[str, tuple[tuple[str, str, int], str, bytes]] = {}

    def _closed(self, key: tuple[str, str, int]) -> None:
        self._open[key] -= 1
        freed = self._freed.get(key)
        if freed is not None:
            freed.set()

    async def _reserve(self, key: tuple[str, str, int], timeout: float) -> None:
        """Count one more open connection to ``key``, waiting while the host is at its bound."""
        limit = self.max_per_host
        if limit is not None and self._open.get(key, 0) >= limit:
            try:
                async with asyncio.timeout(timeout):
                    while self._open.get(key, 0) >= limit:
                        idle = self._idle.get(key)
                        if idle:  # an idle one makes room
                            idle.pop(0).close()
                        freed = self._freed.setdefault(key, asyncio.Event())
                        freed.clear()
                        await freed.wait()
            except TimeoutError:
                raise UpstreamError(f"{limit} connections to {key[1]}:{key[2]} are open (the per-host "
                                    "bound); none freed in time", local=True) from None
        self._open[key] = self._open.get(key, 0) + 1

    def release(self, key: tuple[str, str, int], conn: UpstreamConnection) -> None:
        """Keep ``conn`` for the next request to ``key`` (or close it when the pool is full)."""
        if conn._timer is not None:
            conn._timer.cancel()
            conn._timer = None
        if conn.paused and conn.transport is not None and not conn.transport.is_closing():
            conn.paused = False  # a relay may have paused it as its last bytes came in
            conn.transport.resume_reading()
        idle = self._idle.setdefault(key, [])
        if conn.reusable and len(idle) < self.max_idle_per_host:
            idle.append(conn)
        else:
            conn.close()

    async def _connect(self, key: tuple[str, str, int], timeout: float) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        scheme, host, port = key
        context = None
        if scheme == "https":
            self._ssl = self._ssl or ssl.create_default_context()
            context = self._ssl
        await self._reserve(key, timeout)
        last_local: OSError | None = None
        try:
            async with asyncio.timeout(timeout):
                while True:  # out of descriptors (a burst of clients): wait for some, within the timeout
                    try:
                        _, conn = await loop.create_connection(lambda: UpstreamConnection(loop), host, port,
                                                               ssl=context)
                        break
                    except OSError as exc:
                        if not local_error(exc):
                            raise
                        last_local = exc
                        await asyncio.sleep(0.05)
        except TimeoutError:
            if last_local is not None:  # the proxy's own shortage all along: nobody's fault
                self._closed(key)
                raise UpstreamError(f"connect to {host}:{port}: {last_local}", local=True) from None
            self._closed(key)
            raise UpstreamError(f"connect to {host}:{port} timed out after {timeout:g} s", connect=True,
                                timed_out=True) from None
        except OSError as exc:
            self._closed(key)
            raise UpstreamError(f"connect to {host}:{port} failed: {exc}", connect=True,
                                local=local_error(exc)) from None
        except BaseException:
            self._closed(key)
            raise
        if conn.eof:  # lost already
            self._closed(key)
        else:
            conn.on_lost = lambda: self._closed(key)
        return conn

    async def post_stream(self, url: str, content: bytes, headers: dict[str, str], *,
                          connect_timeout: float, read_timeout: float) -> UpstreamResponse:
        """POST ``content`` (JSON) to ``url`` and return once the status line and headers are in;
        a kept-alive connection the server has meanwhile closed is retried once on a new one."""
        known = self._targets.get(url)
        if known is None:
            known = _target(url)
            if len(self._targets) < 4096:  # the configured replicas' URLs, in practice
                self._targets[url] = known
        key, target, head = known
        fields = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        if _UNSAFE.search("".join((*headers, *headers.values()))) is not None:
            raise UpstreamError("refusing to send a header or target with a control character")
        request = b"%b%d\r\n%b\r\n%b" % (head, len(content), fields.encode("latin-1"), content)
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.reusable:
                try:
                    return await self._exchange(key, conn, request, read_timeout)
                except _Stale:
                    break
            conn.close()
        return await self._exchange(key, await self._connect(key, connect_timeout), request, read_timeout,
                                    fresh=True)

    async def _exchange(self, key: tuple[str, str, int], conn: UpstreamConnection, request: bytes, timeout: float,
                        *, fresh: bool = False) -> UpstreamResponse:
        conn.transport.write(request)  # type: ignore[union-attr]
        buf = b""
        try:
            while True:
                data = await conn.receive(timeout)
                if not data:
                    conn.close()
                    if not buf and not fresh:
                        raise _Stale
                    raise UpstreamError("upstream closed the connection before answering")
                buf += data
                while (cut := buf.find(b"\r\n\r\n")) >= 0:
                    status, headers = parse_head(buf[:cut])
                    buf = buf[cut + 4:]
                    if not 100 <= status < 200:
                        return UpstreamResponse(self, key, conn, status, headers, buf, timeout)
                if len(buf) > 8 * MAX_LINE:
                    raise UpstreamError("upstream response headers too long")
        except BaseException:
            conn.close()
            raise

    async def aclose(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def _target(url: str) -> tuple[tuple[str, str, int], str, bytes]:
    """(pool key, request target, the POST's head up to ``Content-Length: ``) of ``url``;
    :class:`UpstreamError` for an URL the pool cannot call or a target with a control character."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UpstreamError(f"unsupported upstream URL {url!r}")
    key = (parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if " " in target or _UNSAFE.search(target) is not None:
        raise UpstreamError("refusing to send a header or target with a control character")
    head = (f"POST {target} HTTP/1.1\r\nHost: {parts.netloc.rpartition('@')[2]}\r\nAccept: */*\r\n"
            f"Accept-Encoding: identity\r\nContent-Type: application/json\r\nContent-Length: ")
    return key, target, head.encode("latin-1")


class _Stale(Exception):
    """A kept-alive connection was closed by the server before it answered (retried)."""
