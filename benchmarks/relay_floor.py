"""The floor under the proxy's relay, for ``bench_proxy.py --section peer --floor``: a bare ASGI
app that sends each request round robin to the decode servers through the proxy's own upstream
client and forwards the body as it comes — no FastAPI, no ledger, no policy, no SSE scanning, no
usage stripping, no validation. Its CPU per token is what the HTTP server, the event loop and the
sockets alone cost at this chunk rate.

``native`` (the default; the proxy's own stack, ``serve --http-server native``): the native
server with the splice — each upstream chunk, as read from the socket, written to the client's
transport from the upstream connection's ``data_received`` (no coroutine per chunk), flow
control and disconnects as in the proxy. ``uvicorn``: the same pipe under uvicorn (uvloop +
httptools), a coroutine wake and an ASGI send per chunk.

``native-tick``: the native pipe plus the decision work a barrier-aware router cannot skip —
each request admitted and pooled in the proxy's own :class:`~balanceroute.serving.ledger.Ledger`
(64 slots per upstream), one BR-0 tick, run as the proxy's dispatcher runs it (BR-0's
compiled tick on the ledger's arrays, ``serving/compiled_tick.py``), to choose its upstream,
its slot freed at the end. Still no parsing of events, no token counts, no metrics: what a request costs on this stack with the
policy and nothing else (the floor under the issue's per-request goal).

    python benchmarks/relay_floor.py PORT URL[,URL...] [native|uvicorn|native-tick]
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
from typing import Any

import uvicorn

from balanceroute.serving.asgi import SPLICE, Downstream
from balanceroute.serving.http1 import whole_chunk
from balanceroute.serving.http_server import NativeServer
from balanceroute.serving.protocol import approx_prompt_tokens
from balanceroute.serving.runner import bind_socket
from balanceroute.serving.upstream import UpstreamError, UpstreamPool, UpstreamResponse


class _Pipe:
    """A spliced response: upstream body bytes straight to the client (a ``BodySink`` and the
    downstream's listener); ``done`` resolves when either side ends."""

    def __init__(self, response: UpstreamResponse, down: Downstream) -> None:
        self.response, self.down = response, down
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_frame(self, data: bytes) -> bool:
        write = self.down.chunk_writer()
        if write is None or whole_chunk(data) < 0:
            return False
        write(data)  # the upstream chunk as it came
        return True

    def on_body(self, data: bytes) -> None:
        self.down.write(data)

    def on_end(self) -> None:
        self._finish(drain=True)

    def on_error(self, exc: UpstreamError) -> None:
        self._finish(drain=False)

    def on_gone(self) -> None:
        self._finish(drain=False)

    def pause_writing(self) -> None:
        self.response.pause()

    def resume_writing(self) -> None:
        self.response.resume()

    def _finish(self, *, drain: bool) -> None:
        if self.done.done():
            return
        self.down.listen(None)
        self.response.close(drain=drain)
        if not self.down.gone:
            self.down.end()
        self.done.set_result(None)


class _Ticked:
    """``native-tick``'s choice of upstream: the proxy's ledger, dispatcher and BR-0 tick (the
    tick loop batches the arrivals of one event-loop turn, as in the proxy), nothing else."""

    def __init__(self, urls: list[str]) -> None:
        from balanceroute.serving.config import ProxyConfig
        from balanceroute.serving.dispatch import Dispatcher
        from balanceroute.serving.ledger import Ledger
        from balanceroute.serving.proxy import build_policy, warm_up_policy

        config = ProxyConfig.from_mapping({"kv_dialect": "none", "decode": [{"url": u} for u in urls],
                                           "slots": 64, "policy": "br0"})
        self.ledger = Ledger(config.replica_slots(), pool_capacity=config.pool_capacity)
        self.dispatcher = Dispatcher(self.ledger, build_policy(config), tick_interval_s=config.tick_interval_s)
        self.lease_s = config.kv_lease_s
        warm_up_policy(self.dispatcher.policy, config)  # the kernels loaded, as the proxy does
        self.started = False

    async def place(self, prompt_len: int) -> tuple[Any, int]:
        """Admit and pool one request, wait for the tick that places it: (ticket, replica)."""
        if not self.started:
            self.dispatcher.start()
            self.started = True
        ticket = self.ledger.admit("floor", now=time.monotonic())
        return ticket, await self.dispatcher.wait_for_slot(ticket, prompt_len, self.lease_s)


def make_app(urls: list[str], ticked: bool = False) -> Any:
    """The piping ASGI app over ``urls`` (spliced when the server offers it); ``ticked``: each
    request's upstream chosen by the ledger and BR-0's tick (``native-tick``)."""
    targets = itertools.cycle(urls)
    pool = UpstreamPool()
    chooser = _Ticked(urls) if ticked else None

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await pool.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        payload = {**json.loads(body), "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        ticket = None
        if chooser is None:
            target = next(targets)
        else:
            ticket, g = await chooser.place(approx_prompt_tokens(payload))  # the proxy's s_i estimate
            target = urls[g]
        try:
            await _relay(pool, target, scope, payload, send)
        finally:
            if ticket is not None:
                chooser.dispatcher.finish(ticket, "ok")

    return app


async def _relay(pool: UpstreamPool, target: str, scope: dict, payload: dict, send: Any) -> None:
    """The request to ``target``, its body piped back (spliced when the server offers it)."""
    resp = await pool.post_stream(target + scope["path"], json.dumps(payload).encode(), {},
                                  connect_timeout=5.0, read_timeout=60.0)
    await send({"type": "http.response.start", "status": resp.status,
                "headers": [(b"content-type", b"text/event-stream")]})
    spliced = scope.get("extensions", {}).get(SPLICE)
    if spliced is not None:
        pipe = _Pipe(resp, spliced["downstream"])
        pipe.down.listen(pipe)
        resp.attach(pipe)
        await pipe.done
        return
    try:
        while data := await resp.read():
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        await resp.aclose()


async def _serve_native(app: Any, port: int) -> None:
    await NativeServer(app).serve(sockets=[bind_socket("127.0.0.1", port)])


if __name__ == "__main__":
    mode = sys.argv[3] if len(sys.argv) > 3 else "native"
    app = make_app(sys.argv[2].split(","), ticked=mode == "native-tick")
    if mode == "uvicorn":
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", loop="uvloop",
                    http="httptools")
    else:
        import uvloop

        uvloop.run(_serve_native(app, int(sys.argv[1])))
