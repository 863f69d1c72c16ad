"""The ASGI side of the native server (``http_server.py``): the lifespan protocol (startup
before the socket accepts, shutdown after it closes; its state copied into every request's
scope) and one request/response cycle (``receive``/``send``, and the ``balanceroute.splice``
extension through which a relay writes the response body itself)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from .http1 import LAST_CHUNK, encode_chunk, response_head

__all__ = ["SPLICE", "Cycle", "Downstream", "Lifespan", "SpliceListener"]

log = logging.getLogger("balanceroute.serving.http_server")


SPLICE = "balanceroute.splice"  # scope["extensions"][SPLICE]["downstream"]: the Downstream
_NO_BODY = frozenset((204, 304))


class SpliceListener(Protocol):
    """What a spliced relay hears from its client connection."""

    def on_gone(self) -> None:
        """The client connection is lost."""

    def pause_writing(self) -> None:
        """The client's write buffer is over its high-water mark."""

    def resume_writing(self) -> None:
        """The client's write buffer drained below its low-water mark."""


class Downstream(Protocol):
    """A response whose head has been sent, written to synchronously (:class:`Cycle`)."""

    gone: bool

    def write(self, data: bytes) -> None:
        """Send body bytes (framed as one chunk when the response is chunked)."""

    def end(self) -> None:
        """End the body; the connection serves its next request."""

    def chunk_writer(self) -> Any:
        """The client transport's ``write`` for bytes already framed as whole chunks, once the
        response head is out and its body is chunked (else ``None``); valid until the relay
        stops listening."""

    def listen(self, listener: SpliceListener | None) -> None:
        """Route disconnect and flow-control events to ``listener`` (``None``: stop); a client
        already over its high-water mark pauses it at once."""

    def when_gone(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the client connection is lost (at once if it is already)."""


class Cycle:
    """One request and its response on a connection (``conn``: the server's protocol); the
    ASGI ``receive``/``send`` pair, and the :class:`Downstream` of a spliced relay."""

    def __init__(self, conn: Any, scope: dict[str, Any], body: bytes, keep_alive: bool) -> None:
        self.conn = conn
        self.scope = scope
        self.body: bytes | None = body
        self.keep_alive = keep_alive
        self.head_only = scope["method"] == "HEAD"
        self.http10 = scope["http_version"] == "1.0"
        self.started = self.complete = self.gone = False
        self.chunked = False
        self.head = b""
        self.listener: SpliceListener | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._on_gone: list[Callable[[], None]] = []
        scope["extensions"] = {SPLICE: {"downstream": self}}

    # ASGI
    async def receive(self) -> dict[str, Any]:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        if not (self.gone or self.complete):
            waiter = self.conn.loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                self._waiters.remove(waiter)
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            status = int(message["status"])
            headers = [(bytes(k).lower(), bytes(v)) for k, v in message.get("headers", ())]
            names = {k for k, _ in headers}
            if b"connection" in names and any(k == b"connection" and v.lower() == b"close" for k, v in headers):
                self.keep_alive = False
                headers = [(k, v) for k, v in headers if k != b"connection"]
            no_body = status in _NO_BODY or self.head_only
            framed = b"content-length" in names or b"transfer-encoding" in names or no_body
            if not framed and self.http10:
                self.keep_alive = False  # body delimited by close
            self.chunked = not framed and not self.http10
            self.head = response_head(status, headers, chunked=self.chunked, keep_alive=self.keep_alive)
            if no_body:
                self.head_only = True
        elif kind == "http.response.body":
            if not self.started:
                raise RuntimeError("http.response.body before http.response.start")
            if self.complete or self.gone:
                return
            body, more = message.get("body", b""), message.get("more_body", False)
            if body and not self.head_only:
                self.write(body)
            if not more:
                self.end()
            elif self.conn.write_paused:
                await self.conn.drained()

    # Downstream (the splice)
    def write(self, data: bytes) -> None:
        if self.gone or self.complete or not data:  # an empty chunk would end the body
            return
        if self.chunked and not self.head:  # the relay's path: one chunk per write
            self.conn.transport.write(b"%x\r\n%b\r\n" % (len(data), data))  # type: ignore[union-attr]
            return
        out = encode_chunk(data) if self.chunked else data
        if self.head:
            out, self.head = self.head + out, b""
        self.conn.transport.write(out)  # type: ignore[union-attr]

    def chunk_writer(self) -> Any:
        if self.chunked and not self.head and self.started and not (self.gone or self.complete or self.head_only):
            return self.conn.transport.write
        return None

    def end(self) -> None:
        if self.complete:
            return
        self.complete = True
        self.listener = None
        if not self.gone:
            tail = LAST_CHUNK if self.chunked else b""
            if self.head or tail:
                self.conn.transport.write(self.head + tail)  # type: ignore[union-attr]
            self.head = b""
        self._wake()
        self.conn.response_done(self)

    def listen(self, listener: SpliceListener | None) -> None:
        self.listener = listener
        if listener is not None and self.conn.write_paused:
            listener.pause_writing()  # already over the high-water mark

    def when_gone(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the client connection is lost (now, if it is): what an app
        would learn from ``receive()``'s ``http.disconnect``, without a task waiting on it."""
        if self.gone:
            callback()
        else:
            self._on_gone.append(callback)

    # connection events
    def lost(self) -> None:
        self.gone = True
        self._wake()
        callbacks, self._on_gone = self._on_gone, []
        for callback in callbacks:
            callback()
        listener, self.listener = self.listener, None
        if listener is not None:
            listener.on_gone()

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)


class Lifespan:
    """Runs ``app``'s lifespan in a task of its own; :meth:`startup` raises ``RuntimeError``
    when the app reports (or raises) a startup failure."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
        self._inbox: asyncio.Queue[dict[str, Any]] | None = None
        self._started: asyncio.Future[None] | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        """Send ``lifespan.startup`` and wait for the app's answer."""
        loop = asyncio.get_running_loop()
        self._inbox = asyncio.Queue()
        self._started, self._stopped = loop.create_future(), loop.create_future()
        self._task = loop.create_task(self._main())
        await self._inbox.put({"type": "lifespan.startup"})
        await self._started

    async def shutdown(self) -> None:
        """Send ``lifespan.shutdown`` and wait for the app (errors are logged)."""
        if self._task is None or self._task.done() or self._inbox is None or self._stopped is None:
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        try:
            await self._stopped
        except RuntimeError as exc:
            log.error("%s", exc)

    async def _main(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self.state}
        try:
            await self.app(scope, self._receive, self._send)
        except BaseException as exc:
            for fut in (self._started, self._stopped):
                if fut is not None and not fut.done():
                    fut.set_exception(RuntimeError(f"application lifespan failed: {exc!r}"))
            if not isinstance(exc, Exception):
                raise
        else:
            for fut in (self._started, self._stopped):
                if fut is not None and not fut.done():
                    fut.set_result(None)

    async def _receive(self) -> dict[str, Any]:
        assert self._inbox is not None
        return await self._inbox.get()

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        fut = self._started if kind.startswith("lifespan.startup") else self._stopped
        if fut is None or fut.done():
            return
        if kind.endswith(".failed"):
            fut.set_exception(RuntimeError(f"application {kind}: {message.get('message', '')}"))
        else:
            fut.set_result(None)
