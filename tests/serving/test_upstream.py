"""The decode stream's HTTP/1.1 client: chunked decoding at every split, and the pool against a
scripted server on 127.0.0.1 (keep-alive reuse, abort by close, stale connections, timeouts)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.serving.http1 import ChunkedDecoder, whole_chunk
from balanceroute.serving.upstream import UpstreamError, UpstreamPool

pytestmark = pytest.mark.anyio


def encode_chunked(pieces: list[bytes], *, ext: bool = False, trailers: list[bytes] = ()) -> bytes:
    """``pieces`` as chunked transfer coding (optionally with chunk extensions and trailers)."""
    out = [b"%x%s\r\n%s\r\n" % (len(p), b";name=v" if ext else b"", p) for p in pieces if p]
    return b"".join(out) + b"0\r\n" + b"".join(t + b"\r\n" for t in trailers) + b"\r\n"


def decode_all(parts: list[bytes]) -> tuple[bytes, ChunkedDecoder]:
    decoder = ChunkedDecoder()
    return b"".join(decoder.feed(p) for p in parts), decoder


_pieces = st.lists(st.binary(min_size=0, max_size=40), max_size=6)


@settings(max_examples=150, deadline=None)
@given(_pieces, st.booleans(), st.lists(st.sampled_from([b"X-T: 1", b"Checksum: ab"]), max_size=2),
       st.binary(max_size=5))
def test_chunked_decoding_is_the_same_at_every_split(pieces: list[bytes], ext: bool, trailers: list[bytes],
                                                     after: bytes) -> None:
    wire = encode_chunked(pieces, ext=ext, trailers=trailers)
    for cut in range(len(wire) + 1):
        body, decoder = decode_all([wire[:cut], wire[cut:] + after])
        assert body == b"".join(pieces) and decoder.done and decoder.extra == after
        if cut < len(wire):
            assert not decode_all([wire[:cut]])[1].done


@settings(max_examples=100, deadline=None)
@given(_pieces, st.data())
def test_chunked_decoding_byte_by_byte_and_random_splits(pieces: list[bytes], data: st.DataObject) -> None:
    wire = encode_chunked(pieces)
    body, decoder = decode_all([wire[i:i + 1] for i in range(len(wire))])
    assert body == b"".join(pieces) and decoder.done
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    parts = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    body, decoder = decode_all(parts)
    assert body == b"".join(pieces) and decoder.done and decoder.extra == b""


@pytest.mark.parametrize("wire", [b"zz\r\n", b"0x5\r\nhello\r\n", b"+5\r\nhello\r\n", b"1_0\r\n",
                                  b"5\r\nhelloXY", b"-1\r\n", b"\r\n", b"5" * 9000])
def test_chunked_decoding_rejects_malformed_framing(wire: bytes) -> None:
    with pytest.raises(ValueError):
        ChunkedDecoder().feed(wire)


# ------------------------------------------------------------------ the pool over sockets
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def scripted_server(handler: Handler) -> AsyncIterator[tuple[str, dict[str, int]]]:
    """A server on 127.0.0.1 running ``handler`` per connection; yields its URL and counters
    (``connections``, ``closed_by_peer``)."""
    seen = {"connections": 0, "closed_by_peer": 0}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["connections"] += 1
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            seen["closed_by_peer"] += 1
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return await reader.readexactly(length)


def chunked_head(status: int = 200) -> bytes:
    return b"HTTP/1.1 %d OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" % status


async def read_body(pool: UpstreamPool, url: str, **kw: float) -> tuple[int, bytes]:
    resp = await pool.post_stream(url + "/v1/completions", b'{"a":1}', {"X-Request-Id": "r"},
                                  connect_timeout=kw.get("connect", 5.0), read_timeout=kw.get("read", 5.0))
    body = await resp.aread()
    await resp.aclose()
    return resp.status, body


async def test_keep_alive_reuses_one_connection_for_sequential_streams() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                body = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(chunked_head())
            for piece in (b"data: " + body + b"\n\n", b"data: [DONE]\n\n"):
                writer.write(encode_chunked([piece])[:-5])  # one chunk, no terminator yet
                await writer.drain()
            writer.write(b"0\r\n\r\n")

    pool = UpstreamPool()
    async with scripted_server(handler) as (url, seen):
        for _ in range(3):
            assert await read_body(pool, url) == (200, b'data: {"a":1}\n\ndata: [DONE]\n\n')
        assert seen["connections"] == 1
        await pool.aclose()


async def test_closing_before_the_end_drops_the_connection() -> None:
    gone = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(chunked_head() + encode_chunked([b"data: {}\n\n"])[:-5])
        await writer.drain()
        assert await reader.read() == b""  # the client closed: vLLM would abort here
        gone.set()

    pool = UpstreamPool()
    async with scripted_server(handler) as (url, seen):
        resp = await pool.post_stream(url + "/x", b"{}", {}, connect_timeout=5, read_timeout=5)
        assert await resp.read() == b"data: {}\n\n"
        await resp.aclose()
        await asyncio.wait_for(gone.wait(), 10)
        assert seen["connections"] == 1 and not any(pool._idle.values())


async def test_a_stale_idle_connection_is_replaced_and_content_length_bodies_read() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy")
        await writer.drain()
        # close the kept-alive connection before the client's next request

    pool = UpstreamPool()
    async with scripted_server(handler) as (url, seen):
        assert await read_body(pool, url) == (503, b"busy")
        assert await read_body(pool, url) == (503, b"busy")
        assert seen["connections"] == 2


async def test_read_timeout_connect_refusal_and_mid_body_close_raise_upstream_errors() -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(chunked_head())
        await writer.drain()
        await reader.read()

    pool = UpstreamPool()
    async with scripted_server(stall) as (url, _):
        resp = await pool.post_stream(url, b"{}", {}, connect_timeout=5, read_timeout=0.2)
        with pytest.raises(UpstreamError, match="read timeout") as info:
            await resp.read()
        assert not info.value.connect and info.value.timed_out  # a timer: judged against the loop's lag
        await resp.aclose()

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(chunked_head() + b"a\r\n01234")

    async with scripted_server(cut) as (url, _):
        resp = await pool.post_stream(url, b"{}", {}, connect_timeout=5, read_timeout=5)
        with pytest.raises(UpstreamError, match="mid-response"):
            await resp.aread()
        await resp.aclose()

    with pytest.raises(UpstreamError) as info:  # the server above is gone: refused
        await pool.post_stream(url, b"{}", {}, connect_timeout=5, read_timeout=5)
    assert info.value.connect and not info.value.timed_out  # refused: no timer, charged as it is
    with pytest.raises(UpstreamError, match="control character"):
        await pool.post_stream(url, b"{}", {"X-Bad": "a\r\nInjected: 1"}, connect_timeout=5, read_timeout=5)
    with pytest.raises(UpstreamError, match="unsupported"):
        await pool.post_stream("ftp://x/y", b"{}", {}, connect_timeout=5, read_timeout=5)
    await pool.aclose()


@pytest.mark.parametrize("size", [1, 9, 255, 4095, 4096, 70000])
def test_a_whole_chunk_is_found_at_every_size_and_only_in_the_servers_form(size: int) -> None:
    """One whole chunk is taken as it is (payload offset after the size line) on both sides of
    the precomputed size lines; upper-case hex, a leading zero, a short or a long payload go to
    the general decoder (-1), which decodes the same bytes."""
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    wire = b"%x\r\n%b\r\n" % (size, payload)
    start = whole_chunk(wire)
    assert start == wire.index(b"\r\n") + 2 and wire[start:-2] == payload
    for other in (b"%X\r\n%b\r\n" % (size, payload) if b"%X" % size != b"%x" % size else None, b"0" + wire, wire[:-3] + b"\r\n",
                  b"%x\r\n%bz\r\n" % (size, payload)):
        if other is not None:
            assert whole_chunk(other) == -1
    decoder = ChunkedDecoder()
    assert decoder.between and decoder.feed(wire) == payload and decoder.between
    # a decoder mid-chunk is not between chunks (no read may then be taken whole), after it is
    first = decoder.feed(wire[:5])
    assert not decoder.between
    assert first + decoder.feed(wire[5:]) == payload and decoder.between


async def test_each_request_is_sent_as_its_own_head_on_a_reused_connection() -> None:
    """The request head built once per URL: the target with its query, Host, the content length
    and the headers of each request, byte for byte, on two requests down one connection."""
    heads: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            heads.append(head + await reader.readexactly(length))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    pool = UpstreamPool()
    async with scripted_server(record) as (url, seen):
        for body, rid in ((b'{"a":1}', "r1"), (b'{"bb":22}', "r-2")):
            resp = await pool.post_stream(url + "/v1/completions?x=1", body, {"X-Request-Id": rid},
                                          connect_timeout=5, read_timeout=5)
            assert await resp.aread() == b"ok"
            await resp.aclose()
        assert seen["connections"] == 1
        # the kept-alive connection closed before the server: since Python 3.12 the server's
        # wait_closed() waits for its connections, and this handler reads until its client goes
        await pool.aclose()
    host = url.removeprefix("http://")
    assert heads == [(f"POST /v1/completions?x=1 HTTP/1.1\r\nHost: {host}\r\nAccept: */*\r\nAccept-Encoding: "
                      f"identity\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                      f"X-Request-Id: {rid}\r\n\r\n").encode() + body
                     for body, rid in ((b'{"a":1}', "r1"), (b'{"bb":22}', "r-2"))]
    with pytest.raises(UpstreamError, match="control character"):
        await pool.post_stream(url + "/v1/\x01", b"{}", {}, connect_timeout=5, read_timeout=5)


class _Sink:
    """A push-mode body sink that records what it got."""

    def __init__(self) -> None:
        self.body, self.ended, self.error = b"", asyncio.Event(), None

    def on_body(self, data: bytes) -> None:
        self.body += data

    def on_end(self) -> None:
        self.ended.set()

    def on_error(self, exc: UpstreamError) -> None:
        self.error = exc
        self.ended.set()


async def test_a_read_paused_for_a_slow_client_is_not_an_upstream_stall() -> None:
    """In push mode the relay stops reading decode while the client is slower (back-pressure);
    that silence is the proxy's own and must not end the stream as "no data from upstream" (it
    once cut a healthy 60,000-token vLLM stream and charged the replica). Once reading resumes,
    a really silent upstream still meets the read timeout."""
    go, then_stall = asyncio.Event(), asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(chunked_head() + encode_chunked([b"data: 1\n\n"])[:-5])
        await writer.drain()
        await go.wait()
        writer.write(encode_chunked([b"data: 2\n\n"])[:-5])
        await writer.drain()
        await then_stall.wait()
        await reader.read()

    timeout = 0.2
    pool = UpstreamPool()
    async with scripted_server(handler) as (url, _):
        resp = await pool.post_stream(url, b"{}", {}, connect_timeout=5, read_timeout=timeout)
        sink = _Sink()
        resp.attach(sink)
        for _ in range(200):  # bounded: the first event arrives
            if sink.body:
                break
            await asyncio.sleep(0.01)
        assert sink.body == b"data: 1\n\n"
        resp.pause()  # the client is slower than decode
        await asyncio.sleep(4 * timeout)  # paused this long: still no stall
        assert sink.error is None and not sink.ended.is_set()
        go.set()
        resp.resume()
        for _ in range(500):
            if sink.body.endswith(b"data: 2\n\n"):
                break
            await asyncio.sleep(0.01)
        assert sink.body == b"data: 1\n\ndata: 2\n\n" and sink.error is None
        await asyncio.wait_for(sink.ended.wait(), 30)  # reading, and the upstream is silent
        assert isinstance(sink.error, UpstreamError) and "read timeout" in str(sink.error) and sink.error.timed_out
        then_stall.set()
        await resp.aclose()
    await pool.aclose()
