"""Shared helpers for the serving tests: a proxy over a mock upstream (in-process ASGI), and
emulator + proxy servers on 127.0.0.1 (background threads, stopped by handle)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from balanceroute.core.dynamics import StepModel
from balanceroute.serving.config import ProxyConfig
from balanceroute.serving.emulator import EmulatorConfig
from balanceroute.serving.proxy import Proxy
from balanceroute.serving.routes import create_proxy_app
from balanceroute.serving.runner import EmulatorThread, ServerThread, bind_socket, start_emulator


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --------------------------------------------------------------- mock upstream pieces
def chunk(text: str | None, done: int, *, prompt: int = 5, chat: bool = False, finish: str | None = None,
          role: bool = False) -> bytes:
    """One vLLM-style streamed chunk with continuous usage."""
    if chat:
        delta = {"role": "assistant", "content": ""} if role else {"content": text}
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    else:
        choices = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}]
    obj = {"id": "cmpl-x", "object": "chat.completion.chunk" if chat else "text_completion", "created": 1,
           "model": "m", "choices": choices,
           "usage": {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def usage_chunk(done: int, prompt: int = 5) -> bytes:
    obj = {"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m", "choices": [],
           "usage": {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def sse_stream(n: int, *, prompt: int = 5, chat: bool = False) -> list[bytes]:
    """A complete decode stream of ``n`` tokens ``t0 t1 ...``."""
    out = [chunk(None, 0, prompt=prompt, chat=True, role=True)] if chat else []
    for k in range(n):
        out.append(chunk(f" t{k}", k + 1, prompt=prompt, chat=chat, finish="length" if k == n - 1 else None))
    return [*out, usage_chunk(n, prompt), b"data: [DONE]\n\n"]


class ByteStream(httpx.AsyncByteStream):
    """A response body produced by an async generator (to hang or break mid-stream)."""

    def __init__(self, gen: AsyncIterator[bytes]) -> None:
        self.gen = gen
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self.gen:
            yield part

    async def aclose(self) -> None:
        self.closed = True
        await self.gen.aclose()  # type: ignore[attr-defined]


def prefill_reply(prompt: int = 5, kv: dict | None = None) -> httpx.Response:
    return httpx.Response(200, json={
        "id": "cmpl-p", "object": "text_completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "text": " x", "finish_reason": "length"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1},
        "kv_transfer_params": kv if kv is not None else {
            "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e0",
            "remote_block_ids": [1, 2], "remote_host": "10.0.0.1", "remote_port": 5600,
            "remote_request_id": "r"}})


def pd_config(**overrides: Any) -> ProxyConfig:
    """Two prefill instances and two decode replicas at fake addresses."""
    values: dict[str, Any] = {
        "prefill": [{"url": "http://p0:8000"}, {"url": "http://p1:8000"}],
        "decode": [{"url": "http://d0:8000"}, {"url": "http://d1:8000"}],
        "slots": 4, "health_interval_s": 0, "tick_interval_s": 0.01, "upstream_api_key_env": None,
    }
    values.update(overrides)
    return ProxyConfig.from_mapping(values)


@contextlib.asynccontextmanager
async def mock_proxy(config: ProxyConfig, handler: Callable, **kwargs: Any
                     ) -> AsyncIterator[tuple[httpx.AsyncClient, Proxy]]:
    """The proxy app in-process (lifespan run by hand) over a mock upstream ``handler``."""
    upstream = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    app = create_proxy_app(config, client=upstream, **kwargs)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            yield client, app.state.proxy
    await upstream.aclose()


def assert_drained(proxy: Proxy) -> None:
    """The exactly-once and zero-load invariants."""
    led = proxy.ledger
    assert led.in_flight == 0, led.tickets
    assert led.accepted == sum(led.finished.values())
    assert not led.pool and led.prefilling == 0
    assert not led.loads.any() and not led.num_active.any()
    assert (led.slot_rid == -1).all()


# ------------------------------------------------------------------ real servers
FAST_STEPS = StepModel(b=0.02, a=2e-7)


def emulator_config(**overrides: Any) -> EmulatorConfig:
    values: dict[str, Any] = {"num_replicas": 4, "slots": 4, "num_prefill": 2, "time_scale": 0.1,
                              "step_model": FAST_STEPS, "prefill_b": 0.005, "prefill_a": 0.0}
    values.update(overrides)
    return EmulatorConfig(**values)


@contextlib.contextmanager
def running_emulator(**overrides: Any) -> Iterator[EmulatorThread]:
    emu = start_emulator(emulator_config(**overrides))
    try:
        yield emu
    finally:
        emu.stop()


@contextlib.contextmanager
def running_proxy(mapping: dict[str, Any], **kwargs: Any) -> Iterator[tuple[str, Proxy, ServerThread]]:
    """A proxy server on 127.0.0.1; yields (base url, the Proxy object, the server handle)."""
    config = ProxyConfig.from_mapping({"tick_interval_s": 0.01, "upstream_api_key_env": None, **mapping})
    app = create_proxy_app(config, **kwargs)
    server = ServerThread([(app, bind_socket("127.0.0.1"))], http_server=config.http_server,
                          max_body_bytes=config.max_body_bytes).start()
    try:
        yield server.urls[0], app.state.proxy, server
    finally:
        server.stop()


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``predicate`` (bounded) until it holds."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
