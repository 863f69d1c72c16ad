"""End to end on 127.0.0.1: the official ``openai`` client → ``serve`` → ``emulate``."""

from __future__ import annotations

import asyncio
import contextlib
import random

import httpx
import openai
import pytest

from balanceroute.serving.emulator import emulated_text

from .conftest import assert_drained, running_emulator, running_proxy, wait_until


def _stream_text(stream, chat: bool) -> tuple[str, object]:
    text, usage = "", None
    for part in stream:
        if part.choices:
            text += (part.choices[0].delta.content or "") if chat else part.choices[0].text
        if part.usage is not None:
            usage = part.usage
    return text, usage


@pytest.mark.parametrize("dialect, layout", [("nixl", "ports"), ("mooncake", "dp"), ("none", "ports")])
def test_openai_client_through_proxy(dialect: str, layout: str) -> None:
    with running_emulator(layout=layout, prefill_dp=2) as emu, \
            running_proxy(emu.proxy_mapping(dialect)) as (url, proxy, server):
        wait_until(lambda: server.call(_ready(proxy)), what="proxy ready")
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
        assert [m.id for m in client.models.list().data] == ["balanceroute-emulator"]
        for n in (1, 9):
            stream = client.chat.completions.create(
                model="balanceroute-emulator", max_tokens=n, stream=True,
                messages=[{"role": "user", "content": "three little words"}],
                stream_options={"include_usage": True})
            text, usage = _stream_text(stream, chat=True)
            assert text == emulated_text(n)
            assert (usage.prompt_tokens, usage.completion_tokens) == (3 + 4, n)
            stream = client.completions.create(model="balanceroute-emulator", prompt="a b c d e", max_tokens=n,
                                               stream=True)
            text, usage = _stream_text(stream, chat=False)
            assert text == emulated_text(n) and usage is None  # usage was not asked for
        reply = client.completions.create(model="balanceroute-emulator", prompt=[7] * 11, max_tokens=4)
        assert reply.choices[0].text == emulated_text(4) and reply.usage.prompt_tokens == 11
        reply = client.chat.completions.create(model="balanceroute-emulator", max_tokens=5,
                                               messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == emulated_text(5)
        assert reply.usage.completion_tokens == 5
        wait_until(lambda: server.call(_idle(proxy)), what="proxy idle")
        server.call(_check_drained(proxy))
        stats = emu.stats()
        if dialect != "none":
            assert stats["kv"]["misses"] == 0 and stats["kv"]["hits"] == 6
        assert stats["running"] == 0


def _ready(proxy):
    async def check() -> bool:
        return proxy.ready
    return check


def _idle(proxy):
    async def check() -> bool:
        return proxy.ledger.in_flight == 0
    return check


def _check_drained(proxy):
    async def check() -> None:
        assert_drained(proxy)
    return check


def test_emulator_endpoints() -> None:
    with running_emulator(num_replicas=2, num_prefill=1, layout="dp") as emu:
        decode, prefill = emu.decode_urls[0], emu.prefill_urls[0]
        with httpx.Client(timeout=10) as http:
            r = http.post(decode + "/v1/completions", headers={"X-data-parallel-rank": "1"},
                          json={"prompt": "a b c", "max_tokens": 3, "ignore_eos": True})
            assert r.json()["usage"] == {"prompt_tokens": 3, "total_tokens": 6, "completion_tokens": 3}
            assert http.get(decode + "/get_load", headers={"X-data-parallel-rank": "1"}).json() == {"load": 0}
            metrics = http.get(decode + "/metrics").text
            for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                         "vllm:generation_tokens_total", "vllm:request_success_total"):
                assert name in metrics
            assert 'vllm:generation_tokens_total{engine="1",model_name="balanceroute-emulator"} 3.0' in metrics
            assert http.get(prefill + "/query").json()["0"]["engine_id"] == "emu-prefill-0-dp0"
            assert http.post(decode + "/fault/decode/0", json={"action": "kill"}).status_code == 200
            assert http.get(decode + "/health", headers={"X-data-parallel-rank": "0"}).status_code == 503
            assert http.get(decode + "/health", headers={"X-data-parallel-rank": "1"}).status_code == 200
            stats = http.get(decode + "/stats").json()
            assert stats["generated_tokens"] == 3 and stats["steps"] == 3
            # one replica with 3 + a tokens, the other empty: I = 2·M − M = M
            assert stats["mean_imbalance_all"] == pytest.approx((3 + 4 + 5) / 3)


async def _storm_client(url: str, rng: random.Random, http: httpx.AsyncClient, outcomes: list) -> None:
    chat = rng.random() < 0.5
    stream = rng.random() < 0.7
    n = rng.randint(1, 30)
    body: dict = {"model": "m", "max_tokens": n, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": "w " * rng.randint(1, 60)}]
    else:
        body["prompt"] = "w " * rng.randint(1, 60)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    leave_after = rng.choice([None, None, None, 0, 2])  # chunks read before hanging up
    early = rng.random() < 0.08  # hang up before any answer
    try:
        if early:
            with contextlib.suppress(httpx.TimeoutException):  # a fast answer may beat the hang-up
                await http.post(url + path, json=body, timeout=rng.uniform(0.001, 0.05))
            outcomes.append("early_hangup")
            return
        async with http.stream("POST", url + path, json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                assert resp.status_code in (429, 502, 503), resp.text
                assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
                outcomes.append(resp.status_code)
                return
            seen = 0
            tail = b""
            async for part in resp.aiter_bytes():
                seen += 1
                tail = (tail + part)[-400:]
                if stream and leave_after is not None and seen > leave_after:
                    outcomes.append("hangup")
                    return
            if stream:
                assert tail.endswith(b"data: [DONE]\n\n")
                outcomes.append("error_event" if b'"error"' in tail else "ok")
            else:
                outcomes.append("ok")
    except httpx.HTTPError as exc:  # the proxy never cuts a client off
        raise AssertionError(f"client saw {exc!r}") from exc


def test_fault_storm_keeps_exactly_once_and_zero_load() -> None:
    with running_emulator(num_replicas=4, slots=3, time_scale=0.05, prefill_fail_rate=0.15,
                          decode_fail_rate=0.1, stream_break_rate=0.15) as emu, \
            running_proxy({**emu.proxy_mapping("nixl"), "health_interval_s": 0.1, "pool_capacity": 10,
                           "kv_lease_s": 4.0, "lease_margin_s": 1.0}) as (url, proxy, server):
        outcomes: list = []

        async def storm() -> None:
            rng = random.Random(7)
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
            async with httpx.AsyncClient(timeout=30, limits=limits) as http:
                tasks = []
                for i in range(160):
                    tasks.append(asyncio.ensure_future(_storm_client(url, rng, http, outcomes)))
                    if i == 40:
                        await http.post(emu.decode_urls[1] + "/fault/decode/1", json={"action": "kill"})
                    if i == 90:
                        await http.post(emu.decode_urls[1] + "/fault/decode/1", json={"action": "revive"})
                    await asyncio.sleep(rng.uniform(0, 0.02))
                await asyncio.gather(*tasks)

        asyncio.run(storm())
        wait_until(lambda: server.call(_idle(proxy)), timeout=20, what="every request to end")
        server.call(_check_drained(proxy))
        finished = server.call(_finished(proxy))
        assert len(outcomes) == 160
        assert finished["ok"] > 0 and outcomes.count("ok") > 0
        assert finished["client_disconnect"] > 0 and outcomes.count("error_event") > 0
        assert any(k.startswith("decode") for k in finished) or outcomes.count(502) > 0
        wait_until(lambda: emu.stats()["running"] == 0 and emu.stats()["waiting"] == 0, timeout=10,
                   what="the emulator to see every abort")


def _finished(proxy):
    async def read() -> dict:
        return dict(proxy.ledger.finished)
    return read
