"""The zero-wake relay: the proxy under the native server with the lean upstream client, against
a scripted decode server on 127.0.0.1 (all in the test's loop) — streams relayed from the
upstream connection's callbacks, the connection pooled after ``[DONE]``, a client disconnect
closing upstream, flow control with a slow reader, upstream breaks and read timeouts ending in
an error event, and the fast path agreeing with the general one on every event."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.serving.config import ProxyConfig
from balanceroute.serving.proxy import Proxy
from balanceroute.serving.relay import DecodeStream, StreamBroken
from balanceroute.serving.routes import create_proxy_app
from balanceroute.serving.stream_relay import StreamRelay
from balanceroute.serving.upstream import UpstreamResponse

from .conftest import assert_drained, chunk, usage_chunk
from .test_http_server import native
from .test_upstream import Handler, chunked_head, read_request, scripted_server

pytestmark = pytest.mark.anyio


def compact(event: bytes) -> bytes:
    """A conftest event re-serialised the way vLLM writes it (no spaces)."""
    return b"data: " + json.dumps(json.loads(event[6:]), separators=(",", ":")).encode() + b"\n\n"


def frame(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def tokens(n: int, *, start: int = 0, pad: int = 0) -> list[bytes]:
    """Events of tokens ``start+1 .. start+n`` (the last of ``n`` total finishes)."""
    return [compact(chunk(f" t{k}" + "x" * pad, k + 1, finish="length" if k == start + n - 1 else None))
            for k in range(start, start + n)]


@contextlib.asynccontextmanager
async def relay_proxy(handler: Handler, **config: Any) -> AsyncIterator[tuple[int, Proxy, dict[str, int]]]:
    """The proxy (native server, lean upstream client) in front of ``handler``."""
    async with scripted_server(handler) as (url, seen):
        cfg = ProxyConfig.from_mapping({"kv_dialect": "none", "decode": [{"url": url}], "slots": 4,
                                        "health_interval_s": 0, "tick_interval_s": 0.01,
                                        "upstream_api_key_env": None, **config})
        app = create_proxy_app(cfg)
        async with native(app) as (_, port, _server):
            yield port, app.state.proxy, seen


async def open_stream(port: int, max_tokens: int, *, rcvbuf: int | None = None
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": max_tokens, "stream": True}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return reader, writer


async def read_events(reader: asyncio.StreamReader) -> list[str]:
    """The SSE data of one chunked streamed response."""
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head, head
    body = b""
    while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
        body += (await reader.readexactly(size + 2))[:-2]
    await reader.readuntil(b"\r\n")
    return [block[6:].decode() for block in body.split(b"\n\n") if block]


def texts(events: list[str]) -> str:
    return "".join(json.loads(e)["choices"][0]["text"] for e in events if e != "[DONE]" and "error" not in e)


async def eventually(predicate: Any, what: str, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def count_calls(monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> list[int]:
    calls = [0]
    original = getattr(cls, name)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, wrapper)
    return calls


async def test_streams_are_spliced_and_the_connection_is_pooled_after_done(monkeypatch: pytest.MonkeyPatch) -> None:
    attached = count_calls(monkeypatch, UpstreamResponse, "attach")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):  # two requests on one kept-alive connection
            await read_request(reader)
            writer.write(chunked_head())
            for event in [*tokens(5), compact(usage_chunk(5)), b"data: [DONE]\n\n"]:  # a read each
                writer.write(frame(event))
                await writer.drain()
                await asyncio.sleep(0.002)
            await asyncio.sleep(0.05)  # the client is answered; the last chunk comes later
            writer.write(b"0\r\n\r\n")

    async with relay_proxy(handler) as (port, proxy, seen):
        for _ in range(2):
            reader, writer = await open_stream(port, 5)
            events = await read_events(reader)
            writer.close()
            assert events[-1] == "[DONE]" and texts(events) == " t0 t1 t2 t3 t4"
            assert all("usage" not in json.loads(e) for e in events[:-1])  # not asked for: stripped
            await eventually(lambda: sum(map(len, proxy.upstream._idle.values())) == 1, "the connection pooled")
        await eventually(lambda: proxy.ledger.in_flight == 0, "the ledger to drain")
        assert_drained(proxy)
        assert proxy.ledger.finished["ok"] == 2 and proxy.metrics.relayed_tokens == 10
        assert attached[0] == 2 and seen["connections"] == 1


async def test_a_client_disconnect_mid_stream_closes_upstream_and_frees_the_load() -> None:
    upstream_closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(chunked_head())
        for event in tokens(1000):
            writer.write(frame(event))
            await writer.drain()
            await asyncio.sleep(0.005)
            if reader.at_eof() or writer.is_closing():
                break
        with contextlib.suppress(ConnectionError):
            assert await asyncio.wait_for(reader.read(), 10) == b""
        upstream_closed.set()

    async with relay_proxy(handler) as (port, proxy, _):
        reader, writer = await open_stream(port, 1000)
        await reader.readuntil(b"t2")  # mid-stream
        assert proxy.ledger.in_flight == 1 and proxy.ledger.loads.sum() > 0
        writer.close()
        await asyncio.wait_for(upstream_closed.wait(), 10)
        await eventually(lambda: proxy.ledger.in_flight == 0, "the ledger to drain")
        assert_drained(proxy)
        assert proxy.ledger.finished == {"client_disconnect": 1}


async def test_a_client_leaving_before_its_answer_aborts_upstream_without_a_watcher_task(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode holds its response head back; the client hangs up. The native server calls the
    proxy back (``Cycle.when_gone``): the attempt is cancelled, upstream closed, the ticket ended
    as ``client_disconnect`` — and no task was started to wait for the disconnect."""
    upstream_closed = asyncio.Event()
    reached = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        reached.set()
        with contextlib.suppress(ConnectionError):
            assert await asyncio.wait_for(reader.read(), 10) == b""  # no head: wait for the abort
        upstream_closed.set()

    from balanceroute.serving import proxy as proxy_module

    watchers = count_calls(monkeypatch, proxy_module, "_disconnected")
    async with relay_proxy(handler) as (port, proxy, _):
        _, writer = await open_stream(port, 10)
        await asyncio.wait_for(reached.wait(), 10)
        assert proxy.ledger.in_flight == 1
        writer.close()
        await asyncio.wait_for(upstream_closed.wait(), 10)
        await eventually(lambda: proxy.ledger.in_flight == 0, "the ledger to drain")
        assert_drained(proxy)
        assert proxy.ledger.finished == {"client_disconnect": 1}
    assert watchers[0] == 0


async def test_a_slow_reader_pauses_upstream_and_gets_every_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    paused = count_calls(monkeypatch, UpstreamResponse, "pause")
    resumed = count_calls(monkeypatch, UpstreamResponse, "resume")
    n = 2000

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(chunked_head())
        for event in [*tokens(n, pad=8000), b"data: [DONE]\n\n"]:
            writer.write(frame(event))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()  # keep the connection open (pooled) until the proxy closes it

    async with relay_proxy(handler) as (port, proxy, _):
        reader, writer = await open_stream(port, n, rcvbuf=4096)
        await reader.readuntil(b"\r\n\r\n")  # the head, then nothing read for a while
        await eventually(lambda: paused[0] > 0, "upstream to be paused")
        await asyncio.sleep(0.2)
        assert 0 < proxy.metrics.relayed_tokens < n  # part of the stream relayed, then held back
        body = b""
        while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        writer.close()
        events = [b[6:].decode() for b in body.split(b"\n\n") if b]
        assert events[-1] == "[DONE]" and len(events) == n + 1
        assert [json.loads(e)["choices"][0]["text"].split("x")[0].strip() for e in events[:3]] == ["t0", "t1", "t2"]
        assert resumed[0] > 0
        await eventually(lambda: proxy.ledger.in_flight == 0, "the ledger to drain")
        assert_drained(proxy)
        assert proxy.ledger.finished == {"ok": 1} and proxy.metrics.relayed_tokens == n
        await eventually(lambda: sum(map(len, proxy.upstream._idle.values())) == 1, "the connection pooled")
        assert not any(conn.paused for idle in proxy.upstream._idle.values() for conn in idle)


@pytest.mark.parametrize("fault", ["cut", "stall", "bad_framing"])
async def test_an_upstream_fault_mid_stream_ends_with_an_error_event(fault: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(chunked_head())
        for event in tokens(3, pad=0)[:2]:
            writer.write(frame(event))
        await writer.drain()
        await asyncio.sleep(0.05)
        if fault == "cut":
            writer.close()  # at once (not when the writer is collected: a busy run took > 0.3 s)
        elif fault == "stall":
            await asyncio.sleep(5)
        elif fault == "bad_framing":
            writer.write(b"zz\r\nnot a chunk\r\n")
            await writer.drain()
            await asyncio.sleep(1)

    async with relay_proxy(handler, decode_read_timeout_s=0.3) as (port, proxy, _):
        reader, writer = await open_stream(port, 3)
        events = await read_events(reader)
        writer.close()
        assert texts(events) == " t0 t1" and events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "decode_stream"
        assert {"stall": "read timeout", "cut": "mid-response", "bad_framing": "chunked"}[fault] in error["message"]
        await eventually(lambda: proxy.ledger.in_flight == 0, "the ledger to drain")
        assert_drained(proxy)
        assert proxy.ledger.finished == {"decode_stream": 1}


# --------------------------------------------------- the fast path against the general one
class _Sink:
    gone = False

    def __init__(self) -> None:
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def chunk_writer(self) -> Any:
        return self.write_framed

    def write_framed(self, data: bytes) -> None:
        """A whole chunk written by the relay itself: its framing must be exact."""
        start = data.index(b"\r\n") + 2
        assert data[:start - 2] == b"%x" % (len(data) - start - 2) and data.endswith(b"\r\n"), data
        self.out.append(data[start:-2])

    def end(self) -> None:
        pass

    def listen(self, listener: Any) -> None:
        pass


class _Ticket:
    request_id = "r"
    prompt_checked = True

    def __init__(self) -> None:
        self.age = 0


_text = st.text(st.sampled_from('ab "\\{}[],:\n/') | st.characters(max_codepoint=0x2FF), max_size=12)


@st.composite
def vllm_events(draw: Any) -> dict[str, Any]:
    usage = {"prompt_tokens": draw(st.integers(0, 99)), "completion_tokens": draw(st.integers(0, 99)),
             "total_tokens": 1}
    keys = draw(st.permutations(list(usage)))
    choice = {"index": 0, "text": draw(_text), "logprobs": None,
              "finish_reason": draw(st.sampled_from([None, "length", "stop"])),
              "stop_reason": draw(st.sampled_from([None, "recomputed", 7]))}
    obj: dict[str, Any] = {"id": draw(_text), "object": "text_completion", "created": 1, "model": "m",
                           "choices": draw(st.sampled_from([[choice], []]))}
    if draw(st.booleans()):
        obj["error"] = {"message": "x"}
    obj["usage"] = draw(st.sampled_from([{k: usage[k] for k in keys}, None]))
    return obj


class _Response:
    closed = False

    def close(self, *, drain: bool = False) -> None:
        self.closed = True


def _relay_for(include_usage: bool, continuous: bool) -> tuple[StreamRelay, _Sink, asyncio.AbstractEventLoop]:
    creq = type("C", (), {"include_usage": include_usage, "continuous_usage": continuous})
    relay = StreamRelay(_Ticket(), DecodeStream(_Response()), creq,
                        observe=lambda t, e: e.completion_tokens is not None and setattr(
                            t, "age", max(t.age, e.completion_tokens)),
                        progress=lambda t, d: setattr(t, "age", d), end=lambda t, o: None, broken=lambda t, e: None)
    loop = asyncio.new_event_loop()
    relay._down, relay._done = sink, _ = _Sink(), loop.create_future()
    return relay, sink, loop


def _through(path: str, data: bytes, include_usage: bool, continuous: bool) -> tuple[Any, ...]:
    """One upstream read through ``path`` — ``frame``: as one whole chunk (``on_frame``, falling
    back to ``on_body`` when it declines, as ``UpstreamResponse.pushed`` does), ``body``:
    ``on_body``, ``general``: the general framing and :meth:`convert` alone — and what came of it:
    (client bytes, progress, finished, outcome decided, whether ``on_frame`` took the read)."""
    relay, sink, loop = _relay_for(include_usage, continuous)
    took = False
    try:
        if path == "frame":
            framed = frame(data)
            took = relay.on_frame(framed)
            if not took:
                relay.on_body(data)
        elif path == "body":
            relay.on_body(data)
        else:
            try:
                out, over = relay.convert(relay.stream.feed(data))
                sink.write(out)
                if over:
                    relay._finish("ok")
            except StreamBroken as exc:
                sink.write(relay._error_event(exc))
                relay._finish(exc.kind)
        out = b"".join(sink.out)
        broke = b"upstream decode failed mid-stream" in out  # then whether it finished is moot
        return out, relay.ticket.age, broke or relay.stream.finished, relay._done.done(), took
    finally:
        loop.close()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(vllm_events(), st.booleans(), st.booleans()), min_size=1, max_size=3), st.booleans(),
       st.booleans(), st.booleans())
def test_the_fast_path_relays_exactly_what_the_general_path_does(events: list[tuple[dict[str, Any], bool, bool]],
                                                                 done: bool, include_usage: bool,
                                                                 continuous: bool) -> None:
    """One upstream read of 1–3 events (compact or spaced, ASCII or not, then maybe ``[DONE]``)
    through ``on_body`` (the fast path where it applies) and through the general framing and
    :meth:`convert` alone: the same bytes, the same progress, the same finish and outcome."""
    data = b"".join(b"data: " + json.dumps(obj, separators=(", ", ": ") if spaced else (",", ":"),
                                           ensure_ascii=ascii).encode() + b"\n\n"
                    for obj, spaced, ascii in events) + (b"data: [DONE]\n\n" if done else b"")
    want = _through("general", data, include_usage, continuous)[:4]
    assert _through("frame", data, include_usage, continuous)[:4] == want
    assert _through("body", data, include_usage, continuous)[:4] == want


@pytest.mark.parametrize("include_usage, continuous", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("n, pad", [(1, 0), (3, 0), (2, 40)])  # the last of n tokens finishes
def test_the_whole_chunk_path_takes_a_compact_event_and_relays_what_the_general_path_does(
        include_usage: bool, continuous: bool, n: int, pad: int) -> None:
    """The property test above mostly sees reads that ``on_frame`` declines (several or spaced
    events), so each usage setting gets one read it must take — a compact token event, finishing
    or not — and the same bytes, progress and finish as the general path."""
    for event in tokens(n, pad=pad)[-2:]:
        got = _through("frame", event, include_usage, continuous)
        assert got[4], event  # on_frame took it
        assert got[:4] == _through("general", event, include_usage, continuous)[:4]


def test_the_fast_path_takes_vllms_compact_token_events_only() -> None:
    relay, _, loop = _relay_for(include_usage=True, continuous=False)
    loop.close()
    event = tokens(3)[2]
    relay._down = sink = _Sink()
    assert relay.on_frame(frame(event))
    assert sink.out == [event.replace(b'"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}',
                                      b'"usage":null')]
    assert relay.ticket.age == 3 and relay.stream.finished
    usage_only = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}'
    for other in (usage_only, chunk(" a", 1)[:-2], b"data: [DONE]", event[:-2] + b"\n" + event[:-2]):
        framed = frame(other + b"\n\n")
        assert not relay.on_frame(framed)
    assert len(sink.out) == 1
