"""The proxy's own HTTP/1.1 server (``serve --http-server native``): an ``asyncio.Protocol`` per
connection parsing with httptools, and a minimal ASGI 3 adapter for every request — enough for
the package's FastAPI apps: lifespan, the request body in one message, streamed responses
(chunked), keep-alive, pipelined requests answered in order.

Why: under a general ASGI server every relayed chunk wakes a chain of coroutines. Here a
streamed completion can instead take the connection over once its head is sent (the
``balanceroute.splice`` scope extension, :class:`~.asgi.Downstream`): the relay then writes each
decode chunk from the upstream connection's ``data_received`` straight into this transport,
with flow control both ways and the client's disconnect as a callback — no coroutine per chunk.

Limits, all answered with an OpenAI-shaped error and ``connection: close``: malformed requests
400, a URL and headers over ``max_head_bytes`` 431, a body over ``max_body_bytes`` 413, a
request line and headers not complete within ``header_timeout_s`` of its first byte (or a body
not complete within ``body_timeout_s`` of its headers) 408, a connection beyond
``max_connections`` 503 with ``Retry-After`` (descriptors stay free for upstream). A client
whose write buffer stays over its high-water mark for ``write_stall_timeout_s`` is disconnected
(a spliced relay closes its upstream stream, so decode aborts the request and its slot is
freed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import httptools

from .asgi import Cycle, Lifespan
from .config import MAX_BODY_BYTES
from .http1 import response_head
from .protocol import error_body

__all__ = ["NativeServer"]

log = logging.getLogger("balanceroute.serving.http_server")

_MAX_QUEUED = 8  # pipelined requests waiting behind the one being answered (reading pauses)


class _HttpProtocol(asyncio.Protocol):
    """One client connection: httptools parses, requests are answered one at a time, in order."""

    def __init__(self, server: NativeServer) -> None:
        self.server = server
        self.loop = server.loop
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.cycle: Cycle | None = None
        self.queue: deque[tuple[Any, ...]] = deque()
        self.write_paused = False
        self.read_paused = False
        self.closing = False
        self._drain: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._read_timer: asyncio.TimerHandle | None = None  # header/body deadline of a request
        self._stall_timer: asyncio.TimerHandle | None = None  # the client reads nothing
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._size = 0
        self._head_size = 0
        self._refuse: tuple[int, str, str] | None = None
        self.client: tuple[str, int] | None = None
        self.local: tuple[str, int] | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)
        peer, local = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
        self.client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
        self.local = (str(local[0]), int(local[1])) if isinstance(local, tuple) else None
        if self.server.exiting:
            transport.close()
            return
        if len(self.server.connections) > self.server.max_connections:
            # descriptors are kept for upstream connections: this client is answered 503
            self._refuse = (503, "the proxy is at its connection limit; retry shortly", "proxy_overloaded")
        # a new connection's first request must start within the header timeout (a keep-alive
        # connection between requests gets keep_alive_s)
        self._deadline("_timer", self.server.header_timeout_s, transport.close)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # answered as plain HTTP; nothing after it is read
            last = self.cycle if not self.queue else None
            if last is None and not self.queue:
                self._refuse = self._refuse or (400, "protocol upgrades are not supported", "bad_request")
                self._fail_now()
                return
            self.closing = True
            if last is not None:
                last.keep_alive = False
            else:
                self.queue[-1] = (*self.queue[-1][:-1], False)
        except httptools.HttpParserError as exc:
            self._refuse = self._refuse or (400, f"malformed HTTP request: {exc}", "bad_request")
            self._fail_now()
        else:
            if self._refuse is not None:
                self._fail_now()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        for timer in (self._read_timer, self._stall_timer):
            if timer is not None:
                timer.cancel()
        self.queue.clear()
        for waiter in self._drain:
            if not waiter.done():
                waiter.set_result(None)
        if self.cycle is not None:
            self.cycle.lost()

    def pause_writing(self) -> None:
        self.write_paused = True
        if self._stall_timer is None:
            self._deadline("_stall_timer", self.server.write_stall_timeout_s, self._stalled)
        if self.cycle is not None and self.cycle.listener is not None:
            self.cycle.listener.pause_writing()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        for waiter in self._drain:
            if not waiter.done():
                waiter.set_result(None)
        if self.cycle is not None and self.cycle.listener is not None:
            self.cycle.listener.resume_writing()

    async def drained(self) -> None:
        """Wait until the client's write buffer drains (or the connection is lost)."""
        if not self.write_paused or self.closing:
            return
        waiter = self.loop.create_future()
        self._drain.append(waiter)
        try:
            await waiter
        finally:
            self._drain.remove(waiter)

    def _deadline(self, timer: str, seconds: float, action: Callable[[], Any]) -> None:
        """Arm this connection's deadline ``timer`` (the attribute holding its handle, which
        cancels it): ``action()`` after ``seconds``. Each deadline judges the client, so one the
        loop itself reaches more than a tenth of its length late (busy elsewhere) is put off once
        by that tenth, for the client's bytes that came meanwhile to be read first — uvloop runs
        due timers before it polls the sockets."""
        setattr(self, timer, self.loop.call_later(seconds, self._due, timer, action,
                                                  self.loop.time() + seconds, seconds))

    def _due(self, timer: str, action: Callable[[], Any], due: float, seconds: float) -> None:
        if self.loop.time() - due > 0.1 * seconds:  # late: once more (due = inf: no second delay)
            setattr(self, timer, self.loop.call_later(0.1 * seconds, self._due, timer, action, math.inf, seconds))
            return
        setattr(self, timer, None)
        action()

    def _stalled(self) -> None:
        """The client has read nothing for ``write_stall_timeout_s``: drop it."""
        log.warning("client %s read nothing for %g s: disconnected", self.client,
                    self.server.write_stall_timeout_s)
        self.transport.abort()  # type: ignore[union-attr]

    def _read_deadline(self, seconds: float | None) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._read_timer = None
        if seconds is not None:
            self._deadline("_read_timer", seconds, self._read_too_slow)

    def _read_too_slow(self) -> None:
        """A request's head or body did not arrive in time: 408 (or a close mid-response)."""
        if self.closing:
            return
        if self.cycle is None and not self.queue:
            self._refuse = self._refuse or (408, "the request did not arrive in time", "request_timeout")
            self._fail_now()
        else:
            self.closing = True
            if self.cycle is not None:
                self.cycle.keep_alive = False
            self.transport.close()  # type: ignore[union-attr]

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url, self._headers, self._body, self._size, self._head_size = b"", [], [], 0, 0
        self._read_deadline(self.server.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._grow_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))
        self._grow_head(len(name) + len(value) + 4)

    def _grow_head(self, n: int) -> None:
        self._head_size += n
        if self._head_size > self.server.max_head_bytes and self._refuse is None:
            self._refuse = (431, f"request line and headers exceed {self.server.max_head_bytes} bytes",
                            "headers_too_large")

    def on_headers_complete(self) -> None:
        self._read_deadline(self.server.body_timeout_s)
        for name, value in self._headers:
            if name == b"content-length" and value.strip().isdigit() and int(value) > self.server.max_body_bytes:
                self._too_large()
            elif (name == b"expect" and value.lower() == b"100-continue" and self.cycle is None
                  and self._refuse is None):
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self.server.max_body_bytes:
            self._too_large()
        elif self._refuse is None:
            self._body.append(body)

    def _too_large(self) -> None:
        if self._refuse is None:
            self._refuse = (413, f"request body exceeds {self.server.max_body_bytes} bytes", "request_too_large")

    def on_message_complete(self) -> None:
        self._read_deadline(None)
        if self._refuse is not None:
            return
        request = (self.parser.get_method().decode("ascii"), self.parser.get_http_version(), self._url,
                   self._headers, b"".join(self._body), self.parser.should_keep_alive())
        if self.cycle is None and not self.queue:
            self._start(request)
            return
        self.queue.append(request)
        if len(self.queue) >= _MAX_QUEUED and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]

    # requests and responses
    def _start(self, request: tuple[Any, ...]) -> None:
        method, version, url, headers, body, keep_alive = request
        try:
            parsed = httptools.parse_url(url)
        except httptools.HttpParserInvalidURLError:
            self._refuse = (400, f"malformed request target {url[:80]!r}", "bad_request")
            self._fail_now()
            return
        raw_path = parsed.path or b"/"
        path = raw_path.decode("latin-1")
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": version,
            "server": self.local, "client": self.client, "scheme": "http", "method": method,
            "root_path": "", "path": unquote(path) if "%" in path else path, "raw_path": raw_path,
            "query_string": parsed.query or b"", "headers": headers, "state": self.server.lifespan.state.copy(),
        }
        self.cycle = cycle = Cycle(self, scope, body, keep_alive and not self.server.exiting)
        app = self.server.routes.get((method, scope["path"]), self.server.app)
        task = self.loop.create_task(self._run(cycle, app))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    async def _run(self, cycle: Cycle, app: Any) -> None:
        try:
            await app(cycle.scope, cycle.receive, cycle.send)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("unhandled error serving %s %s", cycle.scope["method"], cycle.scope["path"])
            if not cycle.started and not cycle.gone:
                self._answer_error(500, f"internal server error: {type(exc).__name__}", "internal")
            elif not cycle.complete:
                self.transport.close()  # type: ignore[union-attr]
            if not isinstance(exc, Exception):
                raise
            return
        if not cycle.started and not cycle.gone:
            self._answer_error(500, "the application returned without a response", "internal")
        elif not cycle.complete:
            self.transport.close()  # type: ignore[union-attr]

    def response_done(self, cycle: Cycle) -> None:
        """``cycle``'s response was sent in full: serve the next request, idle, or close."""
        if cycle is not self.cycle:
            return
        self.cycle = None
        if self.closing or not cycle.keep_alive:
            self.transport.close()  # type: ignore[union-attr]
            return
        if self.queue:
            request = self.queue.popleft()
            if self.read_paused and len(self.queue) < _MAX_QUEUED:
                self.read_paused = False
                self.transport.resume_reading()  # type: ignore[union-attr]
            self._start(request)
        elif self._refuse is not None:
            self._fail_now()
        else:
            self._idle()

    def _fail_now(self) -> None:
        """Answer the refused request once those before it are answered, then close."""
        if self.cycle is not None or self.queue or self._refuse is None:
            return
        status, message, code = self._refuse
        self._answer_error(status, message, code)

    def _answer_error(self, status: int, message: str, code: str) -> None:
        body = json.dumps(error_body(message, status=status, code=code)).encode()
        extra = [(b"retry-after", b"1")] if status == 503 else []
        head = response_head(status, [(b"content-type", b"application/json"),
                                      (b"content-length", b"%d" % len(body)), *extra],
                             chunked=False, keep_alive=False)
        self.closing = True
        self.transport.write(head + body)  # type: ignore[union-attr]
        # Close once the client has read the answer (a client still sending its body would
        # otherwise get a reset instead of the error).
        with contextlib.suppress(AttributeError, OSError):
            self.transport.write_eof()  # type: ignore[union-attr]
        self.loop.call_later(1.0, self.transport.close)  # type: ignore[union-attr]

    def _idle(self) -> None:
        if self.server.exiting:
            self.transport.close()  # type: ignore[union-attr]
            return
        self._deadline("_timer", self.server.keep_alive_s, self.transport.close)  # type: ignore[union-attr]

    def shutdown(self) -> None:
        """Stop after the response in progress (idle: now)."""
        if self.cycle is None:
            self.transport.close()  # type: ignore[union-attr]
        else:
            self.cycle.keep_alive = False


class NativeServer:
    """Serves one ASGI app on given sockets (the interface ``runner.serve_apps`` uses:
    ``await serve(sockets=[...])``, ``started``, ``should_exit``). Requests whose (method, path)
    is in the app's ``state.native_routes`` go to that ASGI callable instead of the app."""

    def __init__(self, app: Any, *, keep_alive_s: float = 30.0, graceful_s: float = 2.0,
                 max_body_bytes: int = MAX_BODY_BYTES, max_head_bytes: int = 64 * 1024,
                 header_timeout_s: float = 10.0, body_timeout_s: float = 60.0,
                 write_stall_timeout_s: float = 30.0, max_connections: int = 1 << 30) -> None:
        self.app = app
        # (method, path) → an ASGI callable served directly (the app's ``state.native_routes``)
        self.routes: dict[tuple[str, str], Any] = dict(getattr(getattr(app, "state", None), "native_routes", {}))
        self.keep_alive_s = keep_alive_s
        self.graceful_s = graceful_s
        self.max_body_bytes = max_body_bytes
        self.max_head_bytes = max_head_bytes
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.write_stall_timeout_s = write_stall_timeout_s
        self.max_connections = max_connections  # client connections; beyond: 503 + Retry-After
        self.lifespan = Lifespan(app)
        self.connections: set[_HttpProtocol] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.started = False
        self.exiting = False
        self._exit: asyncio.Event | None = None
        self._listeners: list[asyncio.Server] = []
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]

    @property
    def should_exit(self) -> bool:
        """Set to ``True`` to stop serving (gracefully, within ``graceful_s``)."""
        return self.exiting

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value and self._exit is not None:
            self.loop.call_soon_threadsafe(self._exit.set)

    def stop_accepting(self) -> None:
        """Close the listeners and the idle connections; requests in progress go on, each
        connection closing after its response."""
        self.exiting = True
        for server in self._listeners:
            server.close()
        for conn in list(self.connections):
            conn.shutdown()

    async def serve(self, sockets: list[Any]) -> None:
        """Run the lifespan startup, serve ``sockets`` until ``should_exit``, then shut down."""
        self.loop = asyncio.get_running_loop()
        self._exit = asyncio.Event()
        await self.lifespan.startup()
        servers = [await self.loop.create_server(lambda: _HttpProtocol(self), sock=sock, backlog=2048)
                   for sock in sockets]
        self._listeners = servers
        self.started = True
        try:
            await self._exit.wait()
        finally:
            self.stop_accepting()
            for conn in list(self.connections):
                conn.shutdown()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.graceful_s):
                    while self.connections:
                        await asyncio.sleep(0.02)
            for conn in list(self.connections):
                conn.transport.close()  # type: ignore[union-attr]
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await self.lifespan.shutdown()
