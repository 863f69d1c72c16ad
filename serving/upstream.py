"""The decode stream's HTTP/1.1 client: an asyncio protocol per connection, chunked transfer
decoding by byte scanning, a keep-alive pool, connect and read timeouts, abort by closing.

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
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

from .http1 import MAX_LINE, ChunkedDecoder, UpstreamError, parse_head, whole_chunk

__all__ = ["BodySink", "UpstreamError", "UpstreamPool", "UpstreamResponse"]

_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")  # header smuggling: no CR, LF, NUL, ... in what we send
_PAUSE_AT = 1 << 18  # buffered but unread bytes at which the socket stops being read


class _Connection(asyncio.Protocol):
    """One upstream connection: bytes land in ``chunks``; one reader waits on ``_waiter``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.eof = False
        self.lost: BaseException | None = None
        self.paused = False
        self.last_rx = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timeout = 0.0
        self.push: UpstreamResponse | None = None  # push mode: bytes go straight to it

    # protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.push is not None:
            self.last_rx = self.loop.time()
            self.push.pushed(data)
            return
        self.chunks.append(data)
        self.buffered += len(data)
        self.last_rx = self.loop.time()
        if self.buffered > _PAUSE_AT and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake(None)

    def eof_received(self) -> bool:
        self.eof = True
        if self.push is not None:
            self.push.pushed_end(None)
        self._wake(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.lost = exc
        if self.push is not None:
            self.push.pushed_end(None if exc is None else UpstreamError(f"upstream connection lost: {exc}"))
        self._wake(None)

    def _wake(self, exc: BaseException | None) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)

    # reading
    async def receive(self, timeout: float) -> bytes:
        """The bytes received since the last call (``b""`` at EOF); ``UpstreamError`` after
        ``timeout`` seconds without a byte."""
        while not self.chunks:
            if self.eof:
                return b""
            self._waiter = self.loop.create_future()
            if self._timer is None:
                self._timeout = timeout
                self._timer = self.loop.call_later(timeout, self._on_timer)
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    def _on_timer(self) -> None:  # one timer per wait period, not one per read
        idle = self.loop.time() - self.last_rx
        if self.push is None and (self._waiter is None or self._waiter.done()):
            self._timer = None
        elif idle >= self._timeout:
            self._timer = None
            exc = UpstreamError(f"no data from upstream for {self._timeout:g} s (read timeout)")
            if self.push is not None:
                self.push.pushed_end(exc)
            else:
                self._wake(exc)
        else:
            self._timer = self.loop.call_later(self._timeout - idle, self._on_timer)

    def close(self) -> None:
        """Drop the connection (the server sees the client go away)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()
        self.eof = True

    @property
    def reusable(self) -> bool:
        return (not self.eof and not self.chunks and self.transport is not None
                and not self.transport.is_closing())


class BodySink(Protocol):
    """Where a response in push mode (:meth:`UpstreamResponse.attach`) delivers its body."""

    def on_body(self, data: bytes) -> None:
        """Body bytes (chunked coding removed), called from the connection's ``data_received``."""

    def on_end(self) -> None:
        """The body ended."""

    def on_error(self, exc: UpstreamError) -> None:
        """The body broke: connection lost, bad framing, or the read timeout."""

    # optional: ``on_frame(data, start) -> bool`` — ``data`` is exactly one whole chunk (its
    # payload ``data[start:-2]``), as read from the socket; ``True`` when the sink took it
    # (else the chunk is decoded and given to ``on_body``)


class UpstreamResponse:
    """A response being read: ``status``, lower-cased ``headers``, the body via :meth:`read`
    (a coroutine per read) or pushed to a :class:`BodySink` (:meth:`attach`)."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, str, int], conn: _Connection, status: int,
                 headers: dict[str, str], rest: bytes, read_timeout: float) -> None:
        self.status = status
        self.headers = headers
        self._pool, self._key, self._conn, self._timeout = pool, key, conn, read_timeout
        self._closed = False
        self._keep = headers.get("connection", "").lower() != "close"
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._decoder = ChunkedDecoder() if self._chunked else None
        length = headers.get("content-length")
        self._left: int | None = None
        if not self._chunked:
            if length is None or not length.strip().isdigit():
                self._keep = False  # body ends at EOF
            else:
                self._left = int(length)
        self.complete = self._left == 0 or status in (204, 304)
        self._rest = rest
        self._sink: BodySink | None = None
        self._on_frame: Callable[[bytes, int], bool] | None = None

    async def read(self) -> bytes:
        """The next body bytes (``b""`` once the body has ended)."""
        while not self.complete:
            data, self._rest = (self._rest, b"") if self._rest else (await self._conn.receive(self._timeout), b"")
            if not data:
                if self._left is None and self._decoder is None:
                    self.complete = True
                    return b""
                raise UpstreamError("upstream closed the connection mid-response")
            out = self._take(data)
            if out:
                return out
        return b""

    def _take(self, data: bytes) -> bytes:
        if self._decoder is not None:
            try:
                out = self._decoder.feed(data)
            except ValueError as exc:
                raise UpstreamError(f"bad chunked encoding from upstream: {exc}") from None
            if self._decoder.done:
                self.complete = True
                self._keep = self._keep and not self._decoder.extra
            return out
        if self._left is not None:
            if len(data) > self._left:
                self._keep = False
                data = data[:self._left]
            self._left -= len(data)
            self.complete = not self._left
        return data

    async def aread(self, limit: int = 1 << 20) -> bytes:
        """The rest of the body (at most ``limit`` bytes are kept)."""
        parts, size = [], 0
        while part := await self.read():
            if size < limit:
                parts.append(part)
                size += len(part)
        return b"".join(parts)[:limit]

    # push mode
    def attach(self, sink: BodySink) -> None:
        """Push mode: from now on the body goes to ``sink`` from the connection's callbacks,
        no coroutine per read (what already arrived first); the read timeout still applies."""
        conn = self._conn
        pending = self._rest + b"".join(conn.chunks) if conn.chunks else self._rest
        self._rest = b""
        conn.chunks.clear()
        conn.buffered = 0
        self._sink = sink
        self._on_frame = getattr(sink, "on_frame", None) if self._decoder is not None else None
        conn.push = self
        conn.last_rx = conn.loop.time()
        if conn._timer is None:
            conn._timeout = self._timeout
            conn._timer = conn.loop.call_later(self._timeout, conn._on_timer)
        self.resume()
        if pending:
            self.pushed(pending)
        if conn.eof and conn.push is self:
            self.pushed_end(None if conn.lost is None else UpstreamError(f"upstream connection lost: {conn.lost}"))
        elif self.complete and conn.push is self:
            self._end_push(None)

    def pause(self) -> None:
        """Stop reading the socket (push mode's back-pressure)."""
        transport = self._conn.transport
        if not self._conn.paused and transport is not None and not transport.is_closing():
            self._conn.paused = True
            transport.pause_reading()

    def resume(self) -> None:
        """Read the socket again."""
        transport = self._conn.transport
        if self._conn.paused and transport is not None and not transport.is_closing():
            self._conn.paused = False
            transport.resume_reading()

    def pushed(self, data: bytes) -> None:
        """Bytes from the socket in push mode: a read of exactly one whole chunk goes to the
        sink's ``on_frame`` first, when it has one (it may take the framed bytes as they are)."""
        on_frame = self._on_frame
        if on_frame is not None and self._decoder.at_boundary:  # type: ignore[union-attr]
            start = whole_chunk(data)
            if start > 0 and on_frame(data, start):
                return
        try:
            out = self._take(data)
        except UpstreamError as exc:
            self._end_push(exc)
            return
        sink = self._sink
        if out:
            if sink is None:  # draining after close(drain=True): nothing more was expected
                self.complete = False
                self._end_push(None)
                return
            sink.on_body(out)
        if self.complete and self._conn.push is self:
            self._end_push(None)

    def pushed_end(self, exc: UpstreamError | None) -> None:
        """EOF, a lost connection or the read timeout in push mode."""
        if self._conn.push is not self:
            return
        if exc is None and not self.complete:
            if self._left is None and self._decoder is None:
                self.complete, self._keep = True, False  # the body ends at EOF
            else:
                exc = UpstreamError("upstream closed the connection mid-response")
        self._end_push(exc)

    def _end_push(self, exc: UpstreamError | None) -> None:
        self._conn.push = None
        sink, self._sink, self._on_frame = self._sink, None, None
        if sink is None:
            self._release()
        elif exc is None:
            sink.on_end()
        else:
            sink.on_error(exc)

    def close(self, *, drain: bool = False) -> None:
        """Return the connection to the pool if the body was read to its end (what already
        arrived is looked at), else close it — vLLM aborts the request. ``drain`` (push mode,
        the stream finished): let the connection read the body's last bytes, then pool it."""
        if self._closed:
            return
        self._closed = True
        if self._conn.push is self:
            self._sink = self._on_frame = None
            if drain and not self.complete:
                return
            self._conn.push = None
        self._release()

    async def aclose(self) -> None:
        """:meth:`close` from a coroutine."""
        self.close()

    def _release(self) -> None:
        if not self.complete and not self._rest and self._conn.chunks and not self._conn.lost:
            data = b"".join(self._conn.chunks)
            self._conn.chunks.clear()
            self._conn.buffered = 0
            try:
                self._take(data)
            except UpstreamError:
                self.complete = False
        if self.complete and self._keep and not self._rest and not self._conn.chunks:
            self._pool.release(self._key, self._conn)
        else:
            self._conn.close()


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections per (scheme, host, port) for streamed POSTs."""

    def __init__(self, *, max_idle_per_host: int = 512) -> None:
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = None

    def release(self, key: tuple[str, str, int], conn: _Connection) -> None:
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

    async def _connect(self, key: tuple[str, str, int], timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        scheme, host, port = key
        context = None
        if scheme == "https":
            self._ssl = self._ssl or ssl.create_default_context()
            context = self._ssl
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(lambda: _Connection(loop), host, port, ssl=context)
        except TimeoutError:
            raise UpstreamError(f"connect to {host}:{port} timed out after {timeout:g} s", connect=True) from None
        except OSError as exc:
            raise UpstreamError(f"connect to {host}:{port} failed: {exc}", connect=True) from None
        return conn

    async def post_stream(self, url: str, content: bytes, headers: dict[str, str], *,
                          connect_timeout: float, read_timeout: float) -> UpstreamResponse:
        """POST ``content`` (JSON) to ``url`` and return once the status line and headers are in;
        a kept-alive connection the server has meanwhile closed is retried once on a new one."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamError(f"unsupported upstream URL {url!r}")
        key = (parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        fields = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        if " " in target or _UNSAFE.search("".join((target, *headers, *headers.values()))) is not None:
            raise UpstreamError("refusing to send a header or target with a control character")
        request = (f"POST {target} HTTP/1.1\r\nHost: {parts.netloc.rpartition('@')[2]}\r\nAccept: */*\r\n"
                   f"Accept-Encoding: identity\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(content)}\r\n{fields}\r\n").encode("latin-1") + content
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

    async def _exchange(self, key: tuple[str, str, int], conn: _Connection, request: bytes, timeout: float,
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


class _Stale(Exception):
    """A kept-alive connection was closed by the server before it answered (retried)."""
