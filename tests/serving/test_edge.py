"""The HTTP edge: secure defaults, client auth, OpenAI-shaped errors everywhere, /openapi.json,
warm start, a policy that throws, logging, and a fuzzer (no body gets a 5xx)."""

from __future__ import annotations

import asyncio
import json
import logging
import math

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from balanceroute.core.state import Assignment
from balanceroute.serving.config import ProxyConfig
from balanceroute.serving.http_server import NativeServer
from balanceroute.serving.proxy import Proxy, build_policy
from balanceroute.serving.routes import create_proxy_app
from balanceroute.serving.runner import bind_socket, configure_logging, url_of

from .conftest import assert_drained, mock_proxy, pd_config
from .test_proxy_unit import Recorder
from .test_proxy_unit import test_lease_expiry_in_the_pool_is_503 as lease_expiry_scenario

pytestmark = pytest.mark.anyio


async def test_the_proxys_own_openai_key_never_reaches_an_upstream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-proxys-own")
    monkeypatch.setenv("BR_D1_KEY", "d1-token")
    rec = Recorder()
    config = ProxyConfig.from_mapping({
        "prefill": ["http://p0:8000"], "health_interval_s": 0, "tick_interval_s": 0.01, "slots": 1,
        "decode": [{"url": "http://d0:8000"}, {"url": "http://d1:8000", "api_key_env": "BR_D1_KEY"}]})
    async with mock_proxy(config, rec) as (client, proxy):
        await asyncio.gather(*(client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
                               for _ in range(4)))
        assert_drained(proxy)
    auth = {(host, headers.get("authorization")) for host, _, headers in rec.calls}
    assert auth == {("p0", None), ("d0", None), ("d1", "Bearer d1-token")}
    assert not any("sk-the-proxys-own" in str(h) for _, _, h in rec.calls)


async def test_client_auth_admin_off_and_metrics_without_urls() -> None:
    async with mock_proxy(pd_config(client_api_key="k1"), Recorder()) as (client, proxy):
        body = {"prompt": "x", "max_tokens": 1}
        resp = await client.post("/v1/completions", json=body)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
        assert (await client.post("/v1/completions", json=body, headers={"Authorization": "Bearer no"})).status_code == 401
        assert (await client.post("/v1/completions", json=body, headers={"Authorization": "Bearer k1"})).status_code == 200
        assert (await client.get("/health")).status_code == 200  # probes need no key
        for path, method in (("/status", "GET"), ("/admin/replicas/0/drain", "POST")):
            resp = await client.request(method, path)
            assert resp.status_code == 403 and "admin_token_env" in resp.json()["error"]["message"]
        text = (await client.get("/metrics")).text
        assert "http://d0" not in text and 'balanceroute_replica_kv_load_tokens{replica="0"}' in text
    async with mock_proxy(pd_config(metrics_urls=True), Recorder()) as (client, _):
        assert 'url="http://d0:8000"' in (await client.get("/metrics")).text


async def test_every_error_is_openai_shaped_and_openapi_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BR_ADMIN", "t")
    async with mock_proxy(pd_config(admin_token_env="BR_ADMIN"), Recorder()) as (client, _):
        admin = {"Authorization": "Bearer t"}
        for resp in (await client.get("/nope"), await client.get("/v1/completions"),
                     await client.post("/admin/replicas/abc/drain", headers=admin),
                     await client.post("/admin/replicas/9/drain", headers=admin)):
            assert resp.status_code in (400, 404, 405), resp.text
            assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
        spec = (await client.get("/openapi.json")).json()
        assert {"/v1/completions", "/v1/chat/completions", "/health", "/metrics"} <= set(spec["paths"])
        schema = spec["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert "messages" in schema["required"] and "$ref" not in json.dumps(schema)


@pytest.mark.parametrize("body, fragment", [
    (b'{"prompt": "x", "temperature": NaN}', "NaN"),
    (b'{"prompt": "x", "top_p": Infinity}', "Infinity"),
    (b'{"prompt": "x", "temperature": 1e999}', "out of range"),
    (b'{"prompt": "\\ud800"}', "surrogate"),
    (b'{"prompt": "x", "max_tokens": 9223372036854775808}', "64-bit"),
    (b'{"prompt": "x", "max_tokens": 4294967296}', "max_tokens"),
    (b'{"prompt": "x", "max_tokens": 5000}', "context length 4096"),
    (b'{"prompt": [1, -2]}', "prompt"),
    (b'{"prompt": "x", "top_p": 0}', "top_p"),
    (b'{"prompt": "x", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested"),
    (b'{"prompt": "x", "x": ' + b"[" * 70 + b"]" * 70 + b"}", "nested"),
    (b'{"prompt": "x", "n": 3}', "n > 1"),
])
async def test_odd_but_parseable_bodies_are_400(body: bytes, fragment: str) -> None:
    async with mock_proxy(pd_config(max_model_len=4096), Recorder()) as (client, proxy):
        resp = await client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        assert resp.status_code == 400, resp.text
        assert fragment in resp.json()["error"]["message"]
        assert_drained(proxy)


class Throwing:
    """A policy that raises on every tick; ``everywhere`` counts calls on it and its copies."""

    name = "throwing"
    everywhere = 0

    def __init__(self) -> None:
        self.calls = 0

    def assign(self, state, pool) -> Assignment:
        self.calls += 1
        Throwing.everywhere += 1
        raise RuntimeError("policy bug")


class Invalid(Throwing):
    """A policy that over-fills a replica."""

    def assign(self, state, pool) -> Assignment:
        self.calls += 1
        Throwing.everywhere += 1
        n = len(pool)
        return Assignment(pool_index=np.arange(n), replica=np.zeros(n, dtype=np.int64) + 10**6)


@pytest.mark.parametrize("policy_cls", [Throwing, Invalid])
async def test_a_throwing_policy_degrades_to_least_load_and_leases_still_expire(policy_cls) -> None:
    policy = policy_cls()
    async with mock_proxy(pd_config(), Recorder(), policy=policy) as (client, proxy):
        assert policy.calls == 0 and proxy.warm  # warm-up ran on a copy before the first request
        replies = await asyncio.gather(*(client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
                                         for _ in range(6)))
        assert [r.status_code for r in replies] == [200] * 6
        assert proxy.dispatcher.policy_errors >= 1 and policy.calls >= 1
        assert b"balanceroute_policy_errors" in proxy.metrics.render()
        assert_drained(proxy)
    # lease expiry runs even though every tick's policy throws
    await lease_expiry_scenario(policy=policy_cls())


async def test_not_ready_until_the_tick_is_warm() -> None:
    policy = Throwing()
    async with httpx.AsyncClient() as http:
        proxy = Proxy(pd_config(), http, policy)
        before = Throwing.everywhere
        assert not proxy.ready
        proxy.warm_up()
        assert proxy.ready and Throwing.everywhere == before + 1  # a copy of the policy ran ...
        assert policy.calls == 0 and proxy.ledger.accepted == 0  # ... on a scratch ledger


def test_ttft_slo_reaches_the_policy_parameters() -> None:
    config = pd_config(ttft_slo_s=2.0, policy_params={"s_greedy": 4})
    assert config.policy_parameters() == {"s_greedy": 4, "ttft_slo_s": 2.0}
    assert "ttft_slo_s" not in pd_config().policy_parameters()  # only when set
    try:
        policy = build_policy(config)
    except ValueError as exc:  # a policy without the knob says so
        assert "ttft_slo_s" in str(exc)
    else:
        assert policy.ttft_slo_s == 2.0
    with pytest.raises(ValueError, match="ttft_slo_s"):
        pd_config(ttft_slo_s=-1.0)


def test_health_probe_lines_are_debug_only() -> None:
    root = logging.getLogger()
    quiet = [logging.getLogger(name) for name in ("httpx", "httpcore")]
    before = (root.level, list(root.handlers), [q.level for q in quiet])
    try:
        configure_logging("info")
        assert not any(q.isEnabledFor(logging.INFO) for q in quiet)
        configure_logging("debug")
        assert all(q.isEnabledFor(logging.DEBUG) for q in quiet)
    finally:
        root.setLevel(before[0])
        root.handlers[:] = before[1]
        for q, level in zip(quiet, before[2]):
            q.setLevel(level)


# ------------------------------------------------------------------------------ fuzzing
_leaf = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.sampled_from([0, 1, -1, 2**31, 2**63])
         | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
         | st.sampled_from(["", "\ud800", "user", "hi"]))
_json = (_leaf | st.lists(_leaf, max_size=3)
         | st.dictionaries(st.sampled_from(["role", "content", "include_usage", "text", "type"]), _leaf, max_size=3)
         | st.lists(st.dictionaries(st.sampled_from(["role", "content"]), _leaf, max_size=2), max_size=2))
_fields = st.sampled_from(["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "min_tokens",
                           "n", "stream", "stream_options", "temperature", "top_p", "top_k", "seed",
                           "logprobs", "top_logprobs", "ignore_eos", "kv_transfer_params", "echo"])


@st.composite
def bodies(draw) -> tuple[str, bytes]:
    chat = draw(st.booleans())
    base: dict = ({"model": "m", "messages": [{"role": "user", "content": "hi"}]} if chat
                  else {"model": "m", "prompt": "hi"})
    base.update(draw(st.dictionaries(_fields, _json, max_size=3)))
    kind = draw(st.sampled_from(["json", "json", "json", "raw", "deep", "surrogate"]))
    if kind == "raw":
        data = draw(st.binary(max_size=64))
    elif kind == "deep":
        depth = draw(st.integers(1, 3000))
        data = json.dumps(base)[:-1].encode() + b', "x": ' + b"[" * depth + b"]" * depth + b"}"
    elif kind == "surrogate":
        data = json.dumps(base)[:-1].encode() + b', "y": "\\udc00x"}'
    else:
        data = json.dumps(base, allow_nan=True).encode()
    return ("/v1/chat/completions" if chat else "/v1/completions"), data


def test_fuzzed_bodies_never_get_a_5xx_and_the_load_returns_to_zero() -> None:
    """Through the default HTTP server (the native one) over a 127.0.0.1 socket."""
    rec = Recorder(n_tokens=2)
    config = pd_config(kv_dialect="none", prefill=[], decode=[{"url": f"http://d{g}:8000"} for g in range(4)],
                       slots=64, pool_capacity=512)
    assert config.http_server == "native"
    upstream = httpx.AsyncClient(transport=httpx.MockTransport(rec))
    app = create_proxy_app(config, client=upstream)
    loop = asyncio.new_event_loop()
    sock = bind_socket("127.0.0.1")
    server = NativeServer(app, max_body_bytes=config.max_body_bytes)
    serving = loop.create_task(server.serve([sock]))
    while not server.started:
        assert not serving.done(), serving
        loop.run_until_complete(asyncio.sleep(0.01))
    client = httpx.AsyncClient(base_url=url_of(sock), timeout=30)
    seen = {"n": 0, "ok": 0}

    @settings(max_examples=2000, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(bodies())
    def one(case: tuple[str, bytes]) -> None:
        path, data = case
        resp = loop.run_until_complete(client.post(path, content=data, headers={"content-type": "application/json"}))
        seen["n"] += 1
        assert resp.status_code < 500, (data[:200], resp.text)
        if resp.status_code != 200:
            assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
        else:
            seen["ok"] += 1

    try:
        one()
        proxy = app.state.proxy
        assert_drained(proxy)
        assert seen["n"] >= 2000 and seen["ok"] > 0
        assert not any(math.isnan(v) for v in proxy.ledger.loads.tolist())
    finally:
        loop.run_until_complete(client.aclose())
        server.should_exit = True
        loop.run_until_complete(serving)
        loop.run_until_complete(upstream.aclose())
        loop.close()
        sock.close()
