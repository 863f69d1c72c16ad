"""The proxy's request path and error mapping over a mock upstream (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import httpx
import pytest

from balanceroute.serving.protocol import NIXL_PREFILL_PARAMS

from .conftest import (
    ByteStream,
    assert_drained,
    chunk,
    mock_proxy,
    pd_config,
    prefill_reply,
    sse_stream,
)

pytestmark = pytest.mark.anyio


def events(body: bytes) -> list:
    """Parsed SSE data payloads (``"[DONE]"`` kept as a string)."""
    out = []
    for block in body.split(b"\n\n"):
        if block.startswith(b"data: "):
            data = block[6:]
            out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


class Recorder:
    """A mock upstream: NIXL prefill on p*, decode streams on d*; records what it got."""

    def __init__(self, n_tokens: int = 3, prompt: int = 5) -> None:
        self.n_tokens = n_tokens
        self.prompt = prompt
        self.calls: list[tuple[str, dict, httpx.Headers]] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if request.url.path == "/health":
            return httpx.Response(200)
        body = json.loads(request.content)
        self.calls.append((host, body, request.headers))
        if host.startswith("p"):
            return prefill_reply(self.prompt)
        chat = request.url.path.endswith("chat/completions")
        return httpx.Response(200, content=b"".join(sse_stream(self.n_tokens, prompt=self.prompt, chat=chat)),
                              headers={"content-type": "text/event-stream"})


async def test_nixl_request_path_bodies_and_headers() -> None:
    rec = Recorder()
    async with mock_proxy(pd_config(), rec) as (client, proxy):
        resp = await client.post("/v1/completions", json={
            "model": "m", "prompt": "hello world", "max_tokens": 3, "max_completion_tokens": 3,
            "min_tokens": 2, "stream": True, "stream_options": {"include_usage": False}})
        assert resp.status_code == 200
        got = events(resp.content)
        assert got[-1] == "[DONE]"
        assert "".join(e["choices"][0]["text"] for e in got[:-1]) == " t0 t1 t2"
        assert all("usage" not in e for e in got[:-1])  # the client did not ask for usage
        assert_drained(proxy)
    (p_host, p_body, p_headers), (d_host, d_body, d_headers) = rec.calls
    assert p_host.startswith("p") and d_host.startswith("d")
    assert p_body["stream"] is False and p_body["max_tokens"] == 1 and p_body["max_completion_tokens"] == 1
    assert "stream_options" not in p_body and "min_tokens" not in p_body
    assert p_body["kv_transfer_params"] == NIXL_PREFILL_PARAMS
    assert d_body["kv_transfer_params"] == prefill_reply().json()["kv_transfer_params"]
    assert d_body["stream"] is True
    assert d_body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert d_body["max_tokens"] == 3 and d_body["min_tokens"] == 2  # decode gets the client's body
    assert p_headers["x-request-id"] == d_headers["x-request-id"] == resp.headers["x-request-id"]


@pytest.mark.parametrize("options, per_chunk, final", [
    ({"include_usage": True}, False, True),
    ({"include_usage": True, "continuous_usage_stats": True}, True, True),
    (None, False, False),
])
async def test_usage_chunks_follow_the_client_options(options, per_chunk, final) -> None:
    async with mock_proxy(pd_config(), Recorder(n_tokens=4)) as (client, proxy):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
        if options is not None:
            body["stream_options"] = options
        got = events((await client.post("/v1/chat/completions", json=body)).content)
        chunks = [e for e in got[:-1] if e["choices"]]
        usage_only = [e for e in got[:-1] if not e["choices"]]
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in chunks) == " t0 t1 t2 t3"
        assert all((e.get("usage") is not None) == per_chunk for e in chunks)
        assert len(usage_only) == (1 if final else 0)
        if final:
            assert usage_only[0]["usage"]["completion_tokens"] == 4
        assert_drained(proxy)


@pytest.mark.parametrize("chat", [False, True])
async def test_non_streaming_client_gets_an_assembled_response(chat: bool) -> None:
    async with mock_proxy(pd_config(), Recorder(n_tokens=3, prompt=7)) as (client, proxy):
        if chat:
            resp = await client.post("/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        else:
            resp = await client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 3})
        assert resp.status_code == 200
        data = resp.json()
        choice = data["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        assert text == " t0 t1 t2"
        assert data["object"] == ("chat.completion" if chat else "text_completion")
        assert choice["finish_reason"] == "length"
        assert data["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        assert_drained(proxy)


async def test_mooncake_dialect_uses_bootstrap_engine_ids_and_transfer_id() -> None:
    calls = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/query":
            return httpx.Response(200, json={"0": {"engine_id": "eng-a"}, "1": {"engine_id": "eng-b"}})
        if request.url.path == "/health":
            return httpx.Response(200)
        body = json.loads(request.content)
        calls.append((request.url.host, body, request.headers))
        if request.url.host == "p0":
            return prefill_reply(kv={})
        return httpx.Response(200, content=b"".join(sse_stream(2)))

    config = pd_config(kv_dialect="mooncake", prefill=[{"url": "http://p0:8000"}], bootstrap_port=8998)
    async with mock_proxy(config, handler) as (client, proxy):
        for _ in range(50):
            if proxy.prefills.ready:
                break
            await asyncio.sleep(0.01)
        for _ in range(2):
            resp = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert resp.status_code == 200
        assert_drained(proxy)
    ranks = set()
    for (_, p_body, p_headers), (_, d_body, _) in zip(calls[0::2], calls[1::2], strict=True):
        transfer = p_body["kv_transfer_params"]["transfer_id"]
        assert transfer == f"xfer-{p_headers['x-request-id']}"
        assert p_body["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False,
                                                "transfer_id": transfer}
        rank = int(p_headers["x-data-parallel-rank"])
        ranks.add(rank)
        assert d_body["kv_transfer_params"] == {
            "do_remote_decode": False, "do_remote_prefill": True, "transfer_id": transfer,
            "remote_bootstrap_addr": "http://p0:8998", "remote_engine_id": ["eng-a", "eng-b"][rank]}
    assert ranks == {0, 1}  # round robin over the prefill DP ranks


async def test_dp_rank_header_addresses_decode_replicas() -> None:
    seen = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host.startswith("p"):
            return prefill_reply()
        seen.append(request.headers.get("x-data-parallel-rank"))
        return httpx.Response(200, content=b"".join(sse_stream(1)))

    config = pd_config(decode=[{"url": "http://d0:8000", "dp_size": 4}])
    async with mock_proxy(config, handler) as (client, proxy):
        await asyncio.gather(*(client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
                               for _ in range(4)))
        assert_drained(proxy)
    assert sorted(seen) == ["0", "1", "2", "3"]  # an empty cluster: one request per replica


# ------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (json.dumps({"model": "m"}).encode(), "messages"),
    (json.dumps({"messages": "hi"}).encode(), "messages"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}).encode(), "max_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}).encode(), "stream"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2}).encode(), "n"),
    (json.dumps({"messages": [{"content": "x"}]}).encode(), "messages.0.role"),
])
async def test_bad_input_is_an_openai_400(body: bytes, param: str | None) -> None:
    async with mock_proxy(pd_config(), Recorder()) as (client, proxy):
        resp = await client.post("/v1/chat/completions", content=body,
                                 headers={"content-type": "application/json"})
        assert resp.status_code == 400
        err = resp.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["type"] == "invalid_request_error" and err["param"] == param
        assert proxy.ledger.accepted == 0


async def test_oversized_body_and_unknown_route() -> None:
    async with mock_proxy(pd_config(max_body_bytes=2048), Recorder()) as (client, _):
        resp = await client.post("/v1/completions", json={"prompt": "x" * 5000})
        assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"
        resp = await client.get("/v1/nothing")
        assert resp.status_code == 404 and "error" in resp.json()


# --------------------------------------------------------------------------- faults
async def test_prefill_failure_is_retried_on_another_instance() -> None:
    hits = []

    async def handler(request: httpx.Request) -> httpx.Response:
        hits.append(request.url.host)
        if request.url.host == "p0":
            raise httpx.ConnectError("refused", request=request)
        if request.url.host == "p1":
            return prefill_reply()
        return httpx.Response(200, content=b"".join(sse_stream(2)))

    async with mock_proxy(pd_config(), handler) as (client, proxy):
        for _ in range(2):
            resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert resp.status_code == 200
        assert proxy.metrics.retries.labels("prefill")._value.get() >= 1
        assert_drained(proxy)


async def test_prefill_errors_map_to_502_or_are_relayed() -> None:
    async def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": {"message": "overloaded"}})

    async with mock_proxy(pd_config(), broken) as (client, proxy):
        resp = await client.post("/v1/completions", json={"prompt": "x"})
        assert resp.status_code == 502
        err = resp.json()["error"]
        assert err["code"] == "prefill_failed" and "HTTP 503" in err["message"]
        assert proxy.ledger.finished["prefill_failed"] == 1
        assert_drained(proxy)

    async def too_long(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"object": "error", "message": "prompt is too long", "type": "BadRequestError"})

    async with mock_proxy(pd_config(), too_long) as (client, proxy):
        resp = await client.post("/v1/completions", json={"prompt": "x"})
        assert resp.status_code == 400 and resp.json()["error"]["message"] == "prompt is too long"
        assert_drained(proxy)


def first_decode_fails() -> tuple[Callable[[httpx.Request], Awaitable[httpx.Response]], list[str]]:
    """A mock upstream whose first decode answer is a 500 and whose next ones stream two
    tokens, and the list of decode hosts it was asked, in order."""
    decode_hosts: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host.startswith("p"):
            return prefill_reply()
        decode_hosts.append(request.url.host)
        if len(decode_hosts) == 1:
            return httpx.Response(500, json={"error": {"message": "engine dead"}})
        return httpx.Response(200, content=b"".join(sse_stream(2)))

    return handler, decode_hosts


async def test_decode_failure_before_first_token_goes_back_to_the_pool() -> None:
    handler, decode_hosts = first_decode_fails()

    async with mock_proxy(pd_config(), handler) as (client, proxy):
        resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "stream": True})
        assert resp.status_code == 200 and events(resp.content)[-1] == "[DONE]"
        assert len(decode_hosts) == 2
        assert_drained(proxy)

    async def always_500(request: httpx.Request) -> httpx.Response:
        if request.url.host.startswith("p"):
            return prefill_reply()
        return httpx.Response(500, text="boom")

    async with mock_proxy(pd_config(max_attempts=2), always_500) as (client, proxy):
        resp = await client.post("/v1/completions", json={"prompt": "x", "stream": True})
        assert resp.status_code == 502 and resp.json()["error"]["code"] == "decode_failed"
        assert_drained(proxy)


async def test_debug_log_traces_each_request(caplog: pytest.LogCaptureFixture) -> None:
    """At debug the proxy logs a request's arrival, every placement (with its pool wait and
    attempt), its first token and its end, each with the request id."""
    handler, decode_hosts = first_decode_fails()

    with caplog.at_level("DEBUG", logger="balanceroute.serving"):
        async with mock_proxy(pd_config(), handler) as (client, proxy):
            resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "stream": True})
            assert resp.status_code == 200 and events(resp.content)[-1] == "[DONE]"
            assert_drained(proxy)
    rid = resp.headers["x-request-id"]
    trace = [r.getMessage().removeprefix(rid + ": ") for r in caplog.records
             if r.levelname == "DEBUG" and r.getMessage().startswith(rid)]
    failed = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.getMessage().startswith(rid)]
    assert len(failed) == 1 and "decode replica 0 (http://d0:8000) failed, attempt 1" in failed[0]
    assert trace[0] == "accepted (completions, stream=True)"
    assert [m.split(" after ")[0] for m in trace[1:3]] == ["replica 0", "replica 1"]
    assert trace[1].endswith("(attempt 1)") and trace[2].endswith("(attempt 2)")
    assert trace[3].startswith("first token from replica 1, ")
    assert trace[4].startswith("ended (ok) after ") and trace[4].endswith(", 2 tokens")
    assert len(trace) == 5


async def test_decode_break_after_first_token_ends_with_an_error_event() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host.startswith("p"):
            return prefill_reply()

        async def gen():
            yield chunk(" t0", 1)
            yield chunk(" t1", 2)
            raise httpx.ReadError("connection reset")

        return httpx.Response(200, stream=ByteStream(gen()))

    async with mock_proxy(pd_config(), handler) as (client, proxy):
        resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 5, "stream": True})
        got = events(resp.content)
        assert [e["choices"][0]["text"] for e in got[:2]] == [" t0", " t1"]
        assert "error" in got[2] and got[-1] == "[DONE]"
        assert proxy.ledger.finished["decode_stream"] == 1
        assert_drained(proxy)
        # a non-streaming client gets a 502 instead
        resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 5})
        assert resp.status_code == 502
        assert_drained(proxy)


async def test_pool_full_is_429_with_retry_after() -> None:
    release = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host.startswith("p"):
            await release.wait()
            return prefill_reply()
        return httpx.Response(200, content=b"".join(sse_stream(1)))

    async with mock_proxy(pd_config(pool_capacity=1, retry_after_s=3), handler) as (client, proxy):
        first = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}))
        while proxy.ledger.prefilling == 0:
            await asyncio.sleep(0.01)
        resp = await client.post("/v1/completions", json={"prompt": "x"})
        assert resp.status_code == 429 and resp.headers["retry-after"] == "3"
        assert resp.json()["error"]["code"] == "pool_full"
        release.set()
        assert (await first).status_code == 200
        assert_drained(proxy)


async def test_lease_expiry_in_the_pool_is_503(policy=None) -> None:
    """(``policy``: run the same scenario under another policy object.)"""
    hold = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host.startswith("p"):
            return prefill_reply()

        async def gen():
            yield chunk(" t0", 1)
            await hold.wait()
            yield chunk(" t1", 2, finish="length")
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, stream=ByteStream(gen()))

    config = pd_config(decode=[{"url": "http://d0:8000", "slots": 1}], kv_lease_s=0.3, lease_margin_s=0.1)
    async with mock_proxy(config, handler, policy=policy) as (client, proxy):
        first = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "x", "stream": True}))
        while not proxy.ledger.num_active.any():
            await asyncio.sleep(0.01)
        resp = await client.post("/v1/completions", json={"prompt": "y"})
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "kv_lease_expired"
        hold.set()
        assert (await first).status_code == 200
        assert_drained(proxy)


async def test_unhealthy_replica_gets_no_requests_and_returns() -> None:
    down = {"d0"}
    used = []

    async def handler(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if request.url.path == "/health":
            return httpx.Response(503 if host in down else 200)
        if host.startswith("p"):
            return prefill_reply()
        used.append(host)
        return httpx.Response(200, content=b"".join(sse_stream(1)))

    async with mock_proxy(pd_config(health_interval_s=0.05), handler) as (client, proxy):
        while proxy.ledger.available[0]:
            await asyncio.sleep(0.01)
        for _ in range(4):
            assert (await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})).status_code == 200
        assert used == ["d1"] * 4
        assert proxy.status()["replicas"][0]["available"] is False
        assert (await client.get("/status")).status_code == 403  # admin endpoints are off without a token
        down.clear()
        while not proxy.ledger.available[0]:
            await asyncio.sleep(0.01)
        assert_drained(proxy)


async def test_status_admin_token_and_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BR_TEST_ADMIN", "s3cret")
    async with mock_proxy(pd_config(admin_token_env="BR_TEST_ADMIN"), Recorder()) as (client, proxy):
        assert (await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})).status_code == 200
        assert (await client.get("/status")).status_code == 401
        assert (await client.get("/status", headers={"Authorization": "Bearer nope"})).status_code == 401
        status = (await client.get("/status", headers={"Authorization": "Bearer s3cret"})).json()
        assert status["policy"] == "br0" and status["requests"]["finished"] == {"ok": 1}
        assert status["tick"]["count"] >= 1 and len(status["replicas"]) == 2
        assert status["pool"]["oldest_wait_s"] == 0.0 and status["panic"] is False
        drained = await client.post("/admin/replicas/1/drain", headers={"Authorization": "Bearer s3cret"})
        assert drained.json()["available"] is False
        text = (await client.get("/metrics")).text
        for name in ("balanceroute_requests_total", "balanceroute_pool_size", "balanceroute_imbalance_tokens",
                     "balanceroute_replica_kv_load_tokens", "balanceroute_replica_running",
                     "balanceroute_tick_seconds_bucket", "balanceroute_errors_total",
                     "balanceroute_pool_wait_seconds_bucket", "balanceroute_ttft_seconds_bucket",
                     "balanceroute_relayed_tokens_total 3.0", "balanceroute_ejections_total"):
            assert name in text
        assert (await client.get("/health")).status_code == 200
        assert_drained(proxy)


async def test_without_prefill_the_prompt_estimate_is_replaced_by_decodes_usage() -> None:
    hold = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        async def gen():
            yield b'data: {"id": "x", "choices": [{"index": 0, "text": "", "finish_reason": null}], "usage": null}\n\n'
            yield chunk(" t0", 1, prompt=37)
            yield chunk(" t1", 2, prompt=37)
            await hold.wait()
            yield chunk(" t2", 3, prompt=37, finish="length")
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, stream=ByteStream(gen()))

    config = pd_config(kv_dialect="none", prefill=[])
    async with mock_proxy(config, handler) as (client, proxy):
        reply = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "x" * 400, "stream": True}))
        for _ in range(1000):  # the estimate 100 (400 bytes / 4) becomes 37, plus 2 tokens
            if proxy.ledger.loads.sum() == 37 + 2:
                break
            await asyncio.sleep(0.01)
        assert proxy.ledger.loads.sum() == 37 + 2
        hold.set()
        got = events((await reply).content)
        assert "".join(e["choices"][0]["text"] for e in got[:-1]) == " t0 t1 t2"
        assert_drained(proxy)
