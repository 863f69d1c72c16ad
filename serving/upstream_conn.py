"""One upstream HTTP/1.1 connection (an asyncio protocol) and the response read on it: body
bytes by chunked transfer decoding or content length, pulled by a coroutine (:meth:`read`) or
pushed from the connection's ``data_received`` to a :class:`BodySink` (:meth:`attach`, what the
native server's zero-wake relay uses), with a read timeout either way. Closing a response before
its end closes the connection, so vLLM aborts the request; a response read to its end returns
the connection to its pool (:mod:`.upstream`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from .http1 import ChunkedDecoder, UpstreamError

__all__ = ["BodySink", "ConnectionPool", "UpstreamConnection", "UpstreamResponse"]

_PAUSE_AT = 1 << 18  # buffered but unread bytes at which the socket stops being read


class ConnectionPool(Protocol):
    """Where a response read to its end returns its connection."""

    def release(self, key: tuple[str, str, int], conn: UpstreamConnection) -> None:
        """Keep ``conn`` for the next request to ``key`` (or close it)."""


class UpstreamConnection(asyncio.Protocol):
    """One upstream connection: bytes land in ``chunks``; one reader waits on ``_waiter``;
    in push mode (``push`` set) they go to that response as they come."""

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
        self.on_lost: Callable[[], None] | None = None  # the pool's count of open connections

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
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            on_lost()
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

    def set_timeout(self, timeout: float) -> None:
        """A new read timeout for the response being read; a running wait starts again now."""
        self._timeout = timeout
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self.loop.call_later(timeout, self._on_timer)

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
        elif self.paused and self.push is not None:
            # push mode's back-pressure: the proxy stopped reading because the client reads
            # slower than decode writes. The upstream's silence is ours, not a stall (a client
            # that never reads meets the write-stall timeout); the wait restarts on resume.
            self._timer = self.loop.call_later(self._timeout, self._on_timer)
        elif idle >= self._timeout:
            self._timer = None
            exc = UpstreamError(f"no data from upstream for {self._timeout:g} s (read timeout)", timed_out=True)
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

    # optional: ``on_frame(data) -> bool`` — ``data`` is one read from the socket while the
    # chunked decoder is between chunks; ``True`` when the sink took it, which it may only when
    # ``data`` is exactly one whole chunk (:func:`~.http1.whole_chunk`) — else the read is
    # decoded and its payload given to ``on_body``


class UpstreamResponse:
    """A response being read: ``status``, lower-cased ``headers``, the body via :meth:`read`
    (a coroutine per read) or pushed to a :class:`BodySink` (:meth:`attach`)."""

    def __init__(self, pool: ConnectionPool, key: tuple[str, str, int], conn: UpstreamConnection, status: int,
                 headers: dict[str, str], rest: bytes, read_timeout: float) -> None:
        self.status = status
        self.headers = headers
        self._pool, self._key, self._conn, self._timeout = pool, key, conn, read_timeout
        self._closed = False
        self._keep = headers.get("connection", "").lower() != "close"
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._decoder = ChunkedDecoder() if chunked else None
        length = headers.get("content-length")
        self._left: int | None = None
        if not chunked:
            if length is None or not length.strip().isdigit():
                self._keep = False  # body ends at EOF
            else:
                self._left = int(length)
        self.complete = self._left == 0 or status in (204, 304)
        self._rest = rest
        self._sink: BodySink | None = None
        self._on_frame: Callable[[bytes], bool] | None = None

    @property
    def read_timeout(self) -> float:
        """Seconds without a byte before a read fails; settable mid-response (decode's first
        token is awaited under its own deadline, the rest under the stall timeout)."""
        return self._timeout

    @read_timeout.setter
    def read_timeout(self, timeout: float) -> None:
        self._timeout = timeout
        self._conn.set_timeout(timeout)

    async def read(self) -> bytes:
        """The next body bytes (``b""`` once the body has ended)."""
        while not self.complete:
            data, self._rest = (self._rest, b"") if self._rest else (await self._conn.receive(self._timeout), b"")
            if not data:
                exc = self._at_eof()
                if exc is not None:
                    raise exc
                return b""
            out = self._take(data)
            if out:
                return out
        return b""

    def _at_eof(self) -> UpstreamError | None:
        """The connection ended before the body did: complete when the body ends at EOF (no
        length, not chunked; such a connection is never kept), else the error."""
        if self._left is None and self._decoder is None:
            self.complete = True
            return None
        return UpstreamError("upstream closed the connection mid-response")

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
            self._conn.last_rx = self._conn.loop.time()  # the read timeout counts from here
            transport.resume_reading()

    def pushed(self, data: bytes) -> None:
        """Bytes from the socket in push mode: a read that starts a chunk goes to the sink's
        ``on_frame`` first, when it has one (it takes a whole chunk as it came, or declines)."""
        on_frame = self._on_frame
        if on_frame is not None and self._decoder.between and on_frame(data):  # type: ignore[union-attr]
            return  # one whole chunk: the decoder would have returned its payload, state unchanged
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
            exc = self._at_eof()
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
