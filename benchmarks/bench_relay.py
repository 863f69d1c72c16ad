"""Proxy CPU per relayed token, in one process (no sockets, no emulator).

A mock vLLM decode server (an ``httpx`` transport replaying pre-built, vLLM-shaped chunks with
continuous usage, one chunk per token) behind the proxy app, read by an in-process client
through ``httpx.ASGITransport``. The same streams are also read straight from the mock, in the
same run: the proxy's cost is the CPU time of the proxied run minus the direct run's.

    python benchmarks/bench_relay.py [--streams 64] [--tokens 256] [--concurrency 16] [--json]

Reports, per client mode (``continuous``: the client asked for per-chunk usage, so chunks are
forwarded as they are; ``plain``: no ``stream_options``, so usage is stripped from every
chunk): proxy CPU µs per relayed token and relayed chunks per CPU-second (one core). The
``floor`` row is a FastAPI app that only pipes the upstream bytes through (no pool, no
scanning): the cost of the HTTP stack itself in this set-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from balanceroute.serving.config import ProxyConfig

try:
    from balanceroute.serving.routes import create_proxy_app
except ImportError:  # before the proxy was split by concern
    from balanceroute.serving.routes import create_proxy_app


def vllm_chunks(n: int) -> list[bytes]:
    """A vLLM-shaped completion stream of ``n`` tokens with continuous usage."""
    out = []
    for k in range(n):
        obj = {"id": "cmpl-0123456789abcdef", "object": "text_completion", "created": 1700000000,
               "model": "m", "choices": [{"index": 0, "text": f" tok{k}", "logprobs": None,
                                          "finish_reason": "length" if k == n - 1 else None,
                                          "stop_reason": None}],
               "usage": {"prompt_tokens": 12, "total_tokens": 13 + k, "completion_tokens": k + 1}}
        out.append(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")
    final = {"id": "cmpl-0123456789abcdef", "object": "text_completion", "created": 1700000000,
             "model": "m", "choices": [],
             "usage": {"prompt_tokens": 12, "total_tokens": 12 + n, "completion_tokens": n}}
    out.append(b"data: " + json.dumps(final, separators=(",", ":")).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


class _Replay(httpx.AsyncByteStream):
    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts

    async def __aiter__(self):
        for part in self.parts:
            yield part


class MockDecode(httpx.AsyncBaseTransport):
    """Answers every POST with the replayed stream; ``/health`` with 200."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={})
        await request.aread()
        return httpx.Response(200, stream=_Replay(self.parts),
                              headers={"content-type": "text/event-stream"})


async def _drive(client: httpx.AsyncClient, body: dict[str, Any], streams: int, concurrency: int) -> int:
    sem = asyncio.Semaphore(concurrency)
    received = 0

    async def one() -> None:
        nonlocal received
        async with sem:
            async with client.stream("POST", "/v1/completions", json=body) as resp:
                assert resp.status_code == 200, resp.status_code
                async for part in resp.aiter_bytes():
                    received += len(part)

    await asyncio.gather(*(one() for _ in range(streams)))
    return received


async def measure(mode: str, streams: int, tokens: int, concurrency: int) -> dict[str, float]:
    parts = vllm_chunks(tokens)
    body: dict[str, Any] = {"model": "m", "prompt": [1] * 12, "max_tokens": tokens, "stream": True}
    if mode == "continuous":
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    # direct: the client reads the mock upstream itself
    async with httpx.AsyncClient(transport=MockDecode(parts), base_url="http://d0") as direct:
        await _drive(direct, body, 4, concurrency)
        c0 = time.process_time()
        await _drive(direct, body, streams, concurrency)
        direct_cpu = time.process_time() - c0
    config = ProxyConfig.from_mapping({
        "kv_dialect": "none", "decode": [{"url": f"http://d{g}:8000"} for g in range(4)],
        "slots": 256, "pool_capacity": 4096, "health_interval_s": 0, "upstream_api_key_env": None,
        "log_level": "warning"})
    upstream = httpx.AsyncClient(transport=MockDecode(parts))
    app = create_proxy_app(config, client=upstream)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client:
            await _drive(client, body, 4, concurrency)
            c0 = time.process_time()
            await _drive(client, body, streams, concurrency)
            proxied_cpu = time.process_time() - c0
    await upstream.aclose()
    relayed = streams * tokens
    proxy_cpu = max(proxied_cpu - direct_cpu, 1e-9)
    return {"mode": mode, "tokens": relayed, "direct_cpu_s": direct_cpu, "proxied_cpu_s": proxied_cpu,
            "proxy_us_per_token": proxy_cpu / relayed * 1e6, "chunks_per_cpu_s": relayed / proxy_cpu}


def _floor_app(upstream: httpx.AsyncClient) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/completions")
    async def relay(request: Request) -> StreamingResponse:
        body = await request.body()
        resp = await upstream.send(upstream.build_request("POST", "http://d0:8000/v1/completions",
                                                          content=body), stream=True)

        async def pipe():
            try:
                async for part in resp.aiter_raw():
                    yield part
            finally:
                await resp.aclose()

        return StreamingResponse(pipe(), media_type="text/event-stream")

    return app


async def measure_floor(streams: int, tokens: int, concurrency: int) -> dict[str, float]:
    parts = vllm_chunks(tokens)
    body: dict[str, Any] = {"model": "m", "prompt": [1] * 12, "max_tokens": tokens, "stream": True}
    async with httpx.AsyncClient(transport=MockDecode(parts), base_url="http://d0") as direct:
        await _drive(direct, body, 4, concurrency)
        c0 = time.process_time()
        await _drive(direct, body, streams, concurrency)
        direct_cpu = time.process_time() - c0
    async with httpx.AsyncClient(transport=MockDecode(parts)) as upstream:
        app = _floor_app(upstream)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client:
            await _drive(client, body, 4, concurrency)
            c0 = time.process_time()
            await _drive(client, body, streams, concurrency)
            proxied_cpu = time.process_time() - c0
    relayed = streams * tokens
    proxy_cpu = max(proxied_cpu - direct_cpu, 1e-9)
    return {"mode": "floor", "tokens": relayed, "direct_cpu_s": direct_cpu, "proxied_cpu_s": proxied_cpu,
            "proxy_us_per_token": proxy_cpu / relayed * 1e6, "chunks_per_cpu_s": relayed / proxy_cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [asyncio.run(measure(mode, args.streams, args.tokens, args.concurrency))
            for mode in ("continuous", "plain")]
    rows.append(asyncio.run(measure_floor(args.streams, args.tokens, args.concurrency)))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'mode':>11} {'tokens':>8} {'proxy µs/token':>15} {'chunks/CPU-s':>13}")
    for r in rows:
        print(f"{r['mode']:>11} {r['tokens']:>8} {r['proxy_us_per_token']:>15.1f} {r['chunks_per_cpu_s']:>13,.0f}")


if __name__ == "__main__":
    main()
