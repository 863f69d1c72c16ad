"""Running ASGI apps on local sockets: several uvicorn servers in one event loop, in the
foreground (the CLI) or in a background thread (tests, benchmarks), stopped by handle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .config import MAX_BODY_BYTES, HttpServer, ProxyConfig
from .emulator import EmulatedCluster, EmulatorConfig
from .emulator_app import create_decode_app, create_prefill_app
from .http_server import NativeServer

__all__ = ["EmulatorThread", "ServerThread", "bind_socket", "configure_logging", "emulator_apps",
           "emulator_proxy_mapping", "raise_nofile_limit", "serve_apps", "server_options", "start_emulator"]

T = TypeVar("T")
Hook = Callable[[], Awaitable[None]]
log = logging.getLogger("balanceroute.serving.runner")


def server_options(config: ProxyConfig) -> dict[str, Any]:
    """The HTTP server's settings from a proxy config (keyword arguments of :func:`serve_apps`)."""
    from .upstream import connection_bounds

    bounds = connection_bounds(config)
    hosts = len({urlsplit(d.url).netloc for d in config.decode})
    # descriptors kept for upstream connections (decode streams, prefill calls, probes) and the
    # process itself; client connections get the rest of the open-file limit
    prefill = min(config.pool_capacity, 512) if config.prefill else 0
    reserve = hosts * bounds["per_host"] + prefill + 2 * (len(config.prefill) + len(config.decode)) + 64
    return {"http_server": config.http_server, "max_body_bytes": config.max_body_bytes,
            "header_timeout_s": config.header_timeout_s, "body_timeout_s": config.body_timeout_s,
            "write_stall_timeout_s": config.write_stall_timeout_s, "fd_reserve": reserve}


def client_connection_limit(fd_reserve: int | None) -> int | None:
    """Client connections allowed: the open-file soft limit less ``fd_reserve`` (at least 64;
    ``None``: no limit)."""
    if fd_reserve is None:
        return None
    try:
        import resource
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    return max(64, soft - fd_reserve)


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft limit on open files to the hard limit (each client and each upstream
    stream holds a descriptor; the usual soft default, 1024, is below what 1,000 concurrent
    clients need) and log both; returns (soft, hard) as they are now."""
    try:
        import resource
    except ImportError:  # not on this platform
        return (-1, -1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = soft
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    show = lambda n: "unlimited" if n == resource.RLIM_INFINITY else str(n)  # noqa: E731
    log.info("open-file limit: soft %s (was %s), hard %s", show(soft), show(before), show(hard))
    return soft, hard


class _GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with the native server's client limits: a request's line and
    headers within ``header_timeout_s`` (also a connection that sends nothing), its body within
    ``body_timeout_s``, and a client whose write buffer stays full for ``write_stall_s`` is
    disconnected (the app sees ``http.disconnect``; the proxy aborts the upstream request)."""

    header_timeout_s = 10.0
    body_timeout_s = 60.0
    write_stall_s = 30.0
    max_head_bytes = 64 * 1024  # request line and headers (the native server's limit): 431 beyond
    _read_timer: asyncio.TimerHandle | None = None
    _stall_timer: asyncio.TimerHandle | None = None
    _head_size = 0

    def _arm(self, seconds: float | None) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._read_timer = None if seconds is None else self.loop.call_later(seconds, self._too_slow)

    def _too_slow(self) -> None:
        self._read_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._arm(None)
        if self._stall_timer is not None:
            self._stall_timer.cancel()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_size = 0
        self._arm(self.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self._grow(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._grow(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _grow(self, n: int) -> None:
        self._head_size += n
        if self._head_size > self.max_head_bytes and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
                                 b"connection: close\r\n\r\n")
            self.transport.close()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.body_timeout_s)

    def on_message_complete(self) -> None:
        self._arm(None)
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline:
            self._arm(None)  # idle: uvicorn's keep-alive timeout applies

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self.write_stall_s, self._stalled)

    def resume_writing(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        super().resume_writing()

    def _stalled(self) -> None:
        self._stall_timer = None
        log.warning("client %s read nothing for %.0f s: disconnected", self.client, self.write_stall_s)
        self.transport.abort()


def bind_socket(host: str, port: int = 0) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    return sock


def url_of(sock: socket.socket) -> str:
    """``http://host:port`` of a bound socket."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def configure_logging(level: str) -> None:
    """Log at ``level``; the HTTP client's per-request lines (every health probe, every
    upstream call) only at ``debug``."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet = logging.DEBUG if level == "debug" else logging.WARNING
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(quiet)


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to :func:`serve_apps`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_apps(
    apps: list[tuple[Any, socket.socket]],
    *,
    stop: asyncio.Event,
    on_start: Hook | None = None,
    on_stop: Hook | None = None,
    started: Callable[[], None] | None = None,
    log_level: str = "warning",
    graceful_s: float = 2.0,
    http_server: HttpServer = "uvicorn",
    max_body_bytes: int = MAX_BODY_BYTES,
    header_timeout_s: float = 10.0,
    body_timeout_s: float = 60.0,
    write_stall_timeout_s: float = 30.0,
    fd_reserve: int | None = None,
    drain: Hook | None = None,
) -> None:
    """Serve every (app, socket) until ``stop`` is set, under uvicorn or the native server
    (:mod:`.http_server`; ``max_body_bytes`` is its body limit; the client timeouts as in
    :class:`~.config.ProxyConfig`). ``on_start``/``on_stop`` run before the servers start and
    after they stop; ``started()`` is called once all accept connections. With ``fd_reserve``,
    client connections beyond the open-file limit less that reserve are answered 503 with
    ``Retry-After`` (:func:`client_connection_limit`).

    Stopping: the listeners close and idle connections with them, then ``drain()`` runs (the
    proxy's graceful drain: in-flight requests finish or are ended with an error), then
    connections still open get ``graceful_s`` before they are closed."""
    if on_start is not None:
        await on_start()
    servers: list[Any]
    max_clients = client_connection_limit(fd_reserve)
    if max_clients is not None:
        log.info("client connections: at most %d (the rest of the open-file limit is kept for upstream)",
                 max_clients)
    if http_server == "native":
        servers = [NativeServer(app, keep_alive_s=30, graceful_s=graceful_s, max_body_bytes=max_body_bytes,
                                header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s,
                                write_stall_timeout_s=write_stall_timeout_s,
                                **({} if max_clients is None else {"max_connections": max_clients}))
                   for app, _ in apps]
    else:
        protocol = type("GuardedHttpTools", (_GuardedHttpTools,), {
            "header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s,
            "write_stall_s": write_stall_timeout_s})
        servers = [
            # log_config=None: uvicorn's lines go through the root handler (text or JSON) too
            _Server(uvicorn.Config(app, log_level=log_level, log_config=None, access_log=False, lifespan="on", http=protocol,
                                   timeout_graceful_shutdown=graceful_s, timeout_keep_alive=30,
                                   limit_concurrency=max_clients, h11_max_incomplete_event_size=64 * 1024))
            for app, _ in apps
        ]
    tasks = [asyncio.ensure_future(s.serve(sockets=[sock])) for s, (_, sock) in zip(servers, apps, strict=True)]
    try:
        while not all(s.started for s in servers):
            if any(t.done() for t in tasks):
                raise RuntimeError("a server failed to start (see the log above)")
            await asyncio.sleep(0.01)
        if started is not None:
            started()
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if drain is not None and stop.is_set():
            for s in servers:
                _stop_accepting(s)
            await drain()
    finally:
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        if on_stop is not None:
            await on_stop()


def _stop_accepting(server: Any) -> None:
    """Close ``server``'s listeners and its idle connections (the drain's first step)."""
    if isinstance(server, NativeServer):
        server.stop_accepting()
        return
    for listener in getattr(server, "servers", ()):
        listener.close()
    for conn in list(server.server_state.connections):
        conn.shutdown()


def run_foreground(apps: list[tuple[Any, socket.socket]], *, on_start: Hook | None = None,
                   on_stop: Hook | None = None, started: Callable[[], None] | None = None,
                   log_level: str = "info", **server: Any) -> None:
    """Serve in the main thread until SIGINT/SIGTERM (``server``: the other keyword arguments of
    :func:`serve_apps`, e.g. :func:`server_options` and ``drain``). Raises the open-file soft
    limit to the hard limit first."""
    raise_nofile_limit()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            if stop.is_set():
                log.warning("%s again: already stopping", sig.name)
                return
            log.warning("%s received: stopping", sig.name)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal, sig)
        await serve_apps(apps, stop=stop, on_start=on_start, on_stop=on_stop, started=started,
                         log_level=log_level, **server)

    try:
        import uvloop  # optional (uvicorn[standard]): a faster event loop
    except ImportError:
        asyncio.run(main())
        return
    uvloop.run(main())


@dataclass
class ServerThread:
    """Apps served by a background thread with its own event loop; ``with`` starts and stops it.

    ``urls[i]`` is where app i listens. ``call(coro_fn)`` runs a coroutine on that loop.
    """

    apps: list[tuple[Any, socket.socket]]
    on_start: Hook | None = None
    on_stop: Hook | None = None
    log_level: str = "warning"
    http_server: HttpServer = "uvicorn"
    max_body_bytes: int = MAX_BODY_BYTES
    drain: Hook | None = None  # run by stop() before the servers close (the proxy's drain)
    options: dict[str, Any] = field(default_factory=dict)  # more of serve_apps' keywords
    urls: list[str] = field(init=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False)
    _stop: asyncio.Event | None = field(default=None, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _ready: threading.Event = field(default_factory=threading.Event, init=False)
    _error: BaseException | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.urls = [url_of(sock) for _, sock in self.apps]

    def start(self, timeout: float = 120.0) -> ServerThread:
        """Start serving; returns once every server accepts connections (``timeout``: how long
        to wait for that; start-up can include the warm tick's compile, which on a busy machine
        took longer than 30 s once in a test run)."""
        self._thread = threading.Thread(target=self._main, name="balanceroute-servers", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("servers did not start in time")
        if self._error is not None:
            raise RuntimeError(f"servers failed: {self._error!r}")
        return self

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await serve_apps(self.apps, stop=self._stop, on_start=self.on_start, on_stop=self.on_stop,
                             started=self._ready.set, log_level=self.log_level,
                             http_server=self.http_server, max_body_bytes=self.max_body_bytes,
                             drain=self.drain, **self.options)

        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
        finally:
            self._ready.set()
            for _, sock in self.apps:
                sock.close()

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]], timeout: float = 30.0) -> T:
        """Run ``fn()`` on the servers' loop and return its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the servers and join the thread."""
        if self._loop is not None and self._stop is not None and self._thread and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- emulator
def emulator_apps(cluster: EmulatedCluster, *, host: str = "127.0.0.1", base_port: int = 0
                  ) -> tuple[list[tuple[Any, socket.socket]], list[str], list[str]]:
    """The emulator's servers on sockets: prefill p at ``base_port + p``, then the decode
    server(s) (port 0: free ports). Returns (apps, prefill urls, decode urls)."""
    cfg = cluster.config
    apps: list[tuple[Any, socket.socket]] = []
    port = base_port
    socks: list[socket.socket] = []

    def next_socket() -> socket.socket:
        nonlocal port
        try:
            sock = bind_socket(host, port)
        except ValueError:
            for s in socks:
                s.close()
            raise
        socks.append(sock)
        port = port + 1 if port else 0
        return sock

    for p in range(cfg.num_prefill):
        apps.append((create_prefill_app(cluster, p), next_socket()))
    if cfg.layout == "ports":
        for g in range(cfg.num_replicas):
            apps.append((create_decode_app(cluster, g), next_socket()))
    else:
        apps.append((create_decode_app(cluster, None), next_socket()))
    urls = [url_of(sock) for _, sock in apps]
    return apps, urls[: cfg.num_prefill], urls[cfg.num_prefill:]


def emulator_proxy_mapping(config: EmulatorConfig, prefill_urls: list[str], decode_urls: list[str],
                           *, kv_dialect: str = "nixl") -> dict[str, Any]:
    """A proxy config (as from a config file) that routes to this emulator."""
    if config.layout == "ports":
        decode: list[dict[str, Any]] = [{"url": u} for u in decode_urls]
    else:
        decode = [{"url": decode_urls[0], "dp_size": config.num_replicas}]
    out: dict[str, Any] = {"kv_dialect": kv_dialect, "decode": decode, "slots": config.slots,
                           "served_models": [config.model]}
    if kv_dialect != "none":
        if not prefill_urls:
            raise ValueError(f"kv_dialect={kv_dialect!r} needs emulated prefill instances (--prefill >= 1)")
        out["prefill"] = [{"url": u, "bootstrap_addr": u} if kv_dialect in ("mooncake", "sglang") else {"url": u}
                          for u in prefill_urls]
    return out


class EmulatorThread(ServerThread):
    """A running emulator (see :func:`start_emulator`)."""

    cluster: EmulatedCluster
    prefill_urls: list[str]
    decode_urls: list[str]

    def proxy_mapping(self, kv_dialect: str = "nixl") -> dict[str, Any]:
        """A proxy config mapping pointing at this emulator."""
        return emulator_proxy_mapping(self.cluster.config, self.prefill_urls, self.decode_urls,
                                      kv_dialect=kv_dialect)

    def stats(self) -> dict[str, Any]:
        """The cluster's measurements (read on its loop)."""

        async def read() -> dict[str, Any]:
            return self.cluster.stats()

        return self.call(read)


def start_emulator(config: EmulatorConfig, *, host: str = "127.0.0.1", base_port: int = 0,
                   log_level: str = "warning") -> EmulatorThread:
    """Start an emulated cluster in a background thread (stop it with ``.stop()`` or ``with``)."""
    cluster = EmulatedCluster(config)
    apps, prefill_urls, decode_urls = emulator_apps(cluster, host=host, base_port=base_port)

    async def on_start() -> None:
        cluster.start()

    emu = EmulatorThread(apps, on_start=on_start, on_stop=cluster.stop, log_level=log_level)
    emu.cluster = cluster
    emu.prefill_urls = prefill_urls
    emu.decode_urls = decode_urls
    return emu.start()
