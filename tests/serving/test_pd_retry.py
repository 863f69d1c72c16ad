"""A decode attempt that failed after reaching the decode server is never retried with the same
KV: the server may have pulled it, and the prefill server frees pulled blocks (vLLM's NIXL
connector does so on decode's done-notice), so resending the same ``kv_transfer_params`` could
make decode read blocks another request now owns. The request is prefilled again (bounded by
``max_attempts``, like any retry) or answered with a clear error; an attempt that never reached
the server (no connection) is retried as it is."""

from __future__ import annotations

import json

import httpx
import pytest

from .conftest import assert_drained, mock_proxy, pd_config, prefill_reply, sse_stream

pytestmark = pytest.mark.anyio


class Upstream:
    """Prefill answers carry a fresh ``remote_request_id`` each (``r0``, ``r1``, ...); the first
    decode attempt fails as ``first`` says (``"500"``: the server answered 500 after taking the
    request; ``"connect"``: the connection was refused); later ones stream two tokens (or fail
    with 500 too: ``always``). Records
    every prefill's params and every decode body's."""

    def __init__(self, first: str, always: bool = False) -> None:
        self.first = first
        self.always = always
        self.prefilled: list[dict] = []
        self.decoded: list[dict] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.host.startswith("p"):
            kv = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e0",
                  "remote_block_ids": [len(self.prefilled)], "remote_host": "10.0.0.1", "remote_port": 5600,
                  "remote_request_id": f"r{len(self.prefilled)}"}
            self.prefilled.append(kv)
            return prefill_reply(kv=kv)
        if not self.decoded and self.first == "connect":
            self.decoded.append({})  # never reached the server
            raise httpx.ConnectError("connection refused", request=request)
        self.decoded.append(json.loads(request.content)["kv_transfer_params"])
        if len(self.decoded) == 1 or self.always:
            return httpx.Response(500, json={"error": {"message": "engine died after the KV pull"}})
        return httpx.Response(200, content=b"".join(sse_stream(2)))


BODY = {"model": "m", "prompt": "x", "max_tokens": 2, "stream": True}


async def test_failed_after_reaching_decode_is_prefilled_again_not_resent() -> None:
    up = Upstream(first="500")
    async with mock_proxy(pd_config(), up) as (client, proxy):
        resp = await client.post("/v1/completions", json=BODY)
        assert resp.status_code == 200 and resp.content.rstrip().endswith(b"data: [DONE]")
        assert [kv["remote_request_id"] for kv in up.prefilled] == ["r0", "r1"]
        # each decode attempt got the KV of its own prefill: never r0's twice
        assert [kv["remote_request_id"] for kv in up.decoded] == ["r0", "r1"]
        assert proxy.metrics.retries.labels("reprefill")._value.get() == 1
        assert proxy.metrics.retries.labels("decode")._value.get() == 0
        assert_drained(proxy)


async def test_never_connected_is_retried_with_the_same_kv() -> None:
    up = Upstream(first="connect")
    async with mock_proxy(pd_config(), up) as (client, proxy):
        resp = await client.post("/v1/completions", json=BODY)
        assert resp.status_code == 200
        assert [kv["remote_request_id"] for kv in up.prefilled] == ["r0"]  # no second prefill
        assert [kv.get("remote_request_id") for kv in up.decoded] == [None, "r0"]
        assert proxy.metrics.retries.labels("decode")._value.get() == 1
        assert proxy.metrics.retries.labels("reprefill")._value.get() == 0
        assert_drained(proxy)


async def test_failing_everywhere_ends_in_a_clear_502_never_a_resend() -> None:
    """Every decode attempt fails after reaching the server: each gets the KV of a new prefill,
    ``max_attempts`` bounds them (not the lease's ``max_reprefills`` = 0), then 502."""
    up = Upstream(first="500", always=True)
    async with mock_proxy(pd_config(max_attempts=3, max_reprefills=0), up) as (client, proxy):
        resp = await client.post("/v1/completions", json=BODY)
        assert resp.status_code == 502 and resp.json()["error"]["code"] == "decode_failed"
        assert [kv["remote_request_id"] for kv in up.decoded] == ["r0", "r1", "r2"]
        assert len(up.prefilled) == 3
        assert proxy.metrics.retries.labels("reprefill")._value.get() == 2
        assert_drained(proxy)
