"""The floor under the proxy's relay, for ``bench_proxy.py --section peer --floor``: a bare ASGI
app under the same uvicorn (uvloop + httptools) that sends each request round robin to the
decode servers through the proxy's own upstream client and forwards the decoded body bytes as
they come — no FastAPI, no ledger, no policy, no SSE scanning, no usage stripping. Its CPU per
token is what the HTTP server, the event loop and the sockets cost at this chunk rate.

    python benchmarks/relay_floor.py PORT URL[,URL...]
"""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any

import uvicorn

from balanceroute.serving.upstream import UpstreamPool


def make_app(urls: list[str]) -> Any:
    """The piping ASGI app over ``urls``."""
    targets = itertools.cycle(urls)
    pool = UpstreamPool()

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
        resp = await pool.post_stream(next(targets) + scope["path"], json.dumps(payload).encode(), {},
                                      connect_timeout=5.0, read_timeout=60.0)
        await send({"type": "http.response.start", "status": resp.status,
                    "headers": [(b"content-type", b"text/event-stream")]})
        try:
            while data := await resp.read():
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await resp.aclose()

    return app


if __name__ == "__main__":
    uvicorn.run(make_app(sys.argv[2].split(",")), host="127.0.0.1", port=int(sys.argv[1]),
                log_level="warning", loop="uvloop", http="httptools")
