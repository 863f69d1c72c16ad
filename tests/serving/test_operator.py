"""What an operator meets on day one, re-run on the emulator (127.0.0.1, bounded): readiness that
fails when nothing can be served, probes a busy proxy cannot turn into "down", SIGTERM drains
streams, hung prefill and decode servers are timed out and retried around, slow clients are
cut, and the proxy's own descriptor exhaustion is never charged to a replica."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from balanceroute.serving.config import ProxyConfig
from balanceroute.serving.proxy import Proxy
from balanceroute.serving.routes import create_proxy_app
from balanceroute.serving.runner import ServerThread, bind_socket, server_options

from .conftest import (
    ByteStream,
    assert_drained,
    chunk,
    mock_proxy,
    pd_config,
    prefill_reply,
    running_emulator,
    wait_until,
)

BIN = Path(sys.executable).with_name("balanceroute")


# ------------------------------------------------------------------------- helpers
@contextlib.contextmanager
def serving(mapping: dict[str, Any], **kwargs: Any) -> Iterator[tuple[str, Proxy, ServerThread]]:
    """The proxy on 127.0.0.1 with its configured server limits and drain (as ``serve`` runs it)."""
    config = ProxyConfig.from_mapping({"tick_interval_s": 0.01, "upstream_api_key_env": None, **mapping})
    app = create_proxy_app(config, **kwargs)
    options = server_options(config)
    server = ServerThread([(app, bind_socket("127.0.0.1"))], http_server=options.pop("http_server"),
                          max_body_bytes=options.pop("max_body_bytes"), options=options,
                          drain=lambda: app.state.proxy.drain(config.drain_timeout_s)).start()
    try:
        yield server.urls[0], app.state.proxy, server
    finally:
        server.stop()


def on_loop(server: ServerThread, fn: Any) -> Any:
    async def run() -> Any:
        return fn()
    return server.call(run)


def fault(emu: Any, role: str, index: int, action: str) -> None:
    resp = httpx.post(f"{emu.decode_urls[0]}/fault/{role}/{index}", json={"action": action}, timeout=10)
    assert resp.status_code == 200, resp.text


async def stream_one(http: httpx.AsyncClient, url: str, max_tokens: int, got_token: asyncio.Event | None = None
                     ) -> dict[str, Any]:
    """One streamed completion: its TTFT, tokens, whether it ended with ``[DONE]``, its error."""
    body = {"model": "m", "prompt": "a b c", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    t0 = time.monotonic()
    out: dict[str, Any] = {"ttft": None, "tokens": 0, "done": False, "error": None, "status": None, "end": None}
    async with http.stream("POST", url + "/v1/completions", json=body) as resp:
        out["status"] = resp.status_code
        if resp.status_code != 200:
            out["error"] = (await resp.aread()).decode()
            out["end"] = time.monotonic()
            return out
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                out["done"] = True
                break
            obj = json.loads(data)
            if "error" in obj:
                out["error"] = obj["error"]
                continue
            if any(c.get("text") for c in obj.get("choices", ())):
                out["tokens"] += 1
                if out["ttft"] is None:
                    out["ttft"] = time.monotonic() - t0
                    if got_token is not None:
                        got_token.set()
    out["end"] = time.monotonic()
    return out


# ------------------------------------------------------------------------- 1. health
def test_readiness_fails_within_one_probe_interval_of_the_last_decode_replica_going() -> None:
    interval = 0.5
    with running_emulator(num_replicas=2, num_prefill=1) as emu, \
            serving({**emu.proxy_mapping("nixl"), "policy": "least_load", "health_interval_s": interval}) as (url, proxy, server):
        wait_until(lambda: httpx.get(url + "/health").status_code == 200, what="ready")
        assert httpx.get(url + "/health/ready").json() == {"status": "ok"}
        assert httpx.get(url + "/health/live").json()["status"] == "alive"
        for g in range(2):
            fault(emu, "decode", g, "kill")
        t0 = time.monotonic()
        wait_until(lambda: httpx.get(url + "/health/ready").status_code == 503, timeout=10, what="not ready")
        took = time.monotonic() - t0
        body = httpx.get(url + "/health").json()
        assert body["status"] == "unavailable" and "no decode replica in service" in body["reason"], body
        assert httpx.get(url + "/health/live").status_code == 200  # alive: restarting would not help
        print(f"\nreadiness 503 {took:.2f} s after the last decode replica was killed (probe interval {interval} s)")
        assert took <= interval + 1.5, took  # one probe round (slack for a busy machine)
        fault(emu, "decode", 1, "revive")
        wait_until(lambda: httpx.get(url + "/health").status_code == 200, timeout=10, what="ready again")
        fault(emu, "prefill", 0, "kill")
        wait_until(lambda: httpx.get(url + "/health").status_code == 503, timeout=10, what="no prefill")
        assert "no prefill instance" in httpx.get(url + "/health").json()["reason"]


def _blocks_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # a call that never yields: every stream, probe and timer waits


@pytest.mark.anyio
async def test_a_stalled_loop_is_logged_counted_and_names_its_cause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A loop blocked past ``stall_s`` is a warning and a count; blocked past the watchdog, every
    thread's stack goes to stderr while it is still blocked, naming the blocking call (CI once
    saw a proxy answer nothing for two minutes and could not tell why)."""
    from balanceroute.serving import health

    config = pd_config(health_interval_s=5.0)  # probes on: the sampler runs while idle
    with (tmp_path / "stderr").open("w+") as err:
        monkeypatch.setattr(sys, "stderr", err)
        async with mock_proxy(config, lambda r: httpx.Response(200)) as (client, proxy):
            lag = proxy.members.lag
            assert lag.watchdog_s == health.WATCHDOG_S and lag.stall_s == health.STALL_S
            lag.watchdog_s = 0.5  # (the shipped 10 s would make this test slow)
            await asyncio.sleep(0.2)  # sampled and armed
            assert health._watchdog_owner is lag and lag.stalls == 0
            with caplog.at_level("WARNING", logger="balanceroute.serving.health"):
                _blocks_the_loop(2.0)
                await asyncio.sleep(0.2)  # the next sample sees it
            assert lag.stalls == 1, lag.samples
            assert any("event loop ran" in r.getMessage() for r in caplog.records), caplog.text
            text = (await client.get("/metrics")).text
            assert "balanceroute_loop_stalls_total 1.0" in text
        assert health._watchdog_owner is None  # stopped: disarmed
        err.seek(0)
        dump = err.read()
    assert "_blocks_the_loop" in dump, dump[-3000:]


def test_only_the_sampler_that_armed_the_watchdog_disarms_it() -> None:
    """``faulthandler`` has one watchdog per process; proxies in one process (tests, embedding)
    must not cancel each other's."""
    from balanceroute.serving import health

    first, second = health.LoopLag(watchdog_s=30.0), health.LoopLag(watchdog_s=30.0)
    try:
        first._arm()
        second._disarm()  # parked without having armed: leaves the first one's timer
        assert health._watchdog_owner is first
        second._arm()
        first._disarm()
        assert health._watchdog_owner is second
    finally:
        second._disarm()
    assert health._watchdog_owner is None


@pytest.mark.anyio
@pytest.mark.parametrize("blocking", [True, False])
async def test_probes_that_time_out_while_the_proxys_loop_lags_are_not_counted(blocking: bool) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if blocking:
            time.sleep(0.4)  # the proxy's own event loop is what is slow
        raise httpx.ReadTimeout("timed out", request=request)

    config = pd_config(health_timeout_s=1.0, outlier={"probe_failure_threshold": 1})
    async with mock_proxy(config, handler) as (_, proxy):
        await asyncio.sleep(0.2)  # the lag monitor has a baseline
        await proxy.members.probe_all()
        hosts = proxy.members.outliers.hosts + proxy.prefills.detector.hosts
        if blocking:  # a busy proxy: inconclusive, nobody goes down, still ready
            assert all(h.probe_up for h in hosts) and proxy.members.inconclusive == 4
            assert proxy.unready_reason() is None
        else:  # a replica that does not answer: down, and the proxy is not ready
            assert not any(h.probe_up for h in hosts) and proxy.members.inconclusive == 0
            assert "no decode replica" in (proxy.unready_reason() or "")


@pytest.mark.anyio
@pytest.mark.parametrize("blocking", [True, False])
@pytest.mark.parametrize("where", ["connect", "mid_stream"])
async def test_decode_timeouts_while_the_proxys_loop_lags_charge_no_replica(where: str, blocking: bool) -> None:
    """The probes' rule for every timeout that would charge a decode replica: one that fires
    while the proxy's own loop ran late (here: blocked 0.4 s, a tenth of the 1 s bound is
    0.1 s) says nothing of the replica. Before it, a busy machine could eject a healthy one."""
    def stall() -> None:
        if blocking:
            time.sleep(0.4)

    async def broken_after_one_token():
        yield chunk(" t0", 1)
        stall()
        raise httpx.ReadTimeout("timed out")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host.startswith("p"):
            return prefill_reply()
        if where == "connect":
            stall()
            raise httpx.ConnectTimeout("timed out", request=request)
        return httpx.Response(200, stream=ByteStream(broken_after_one_token()))

    config = pd_config(connect_timeout_s=1.0, decode_read_timeout_s=1.0, max_attempts=2,
                       outlier={"consecutive_failures": 100})
    async with mock_proxy(config, handler) as (client, proxy):
        await asyncio.sleep(0.2)  # the lag monitor has a baseline
        body = {"prompt": "x", "max_tokens": 4, "stream": where == "mid_stream"}
        resp = await client.post("/v1/completions", json=body)
        charged = [h.consecutive for h in proxy.members.outliers.hosts]
        if where == "connect":
            assert resp.status_code == 502  # both replicas tried, neither answered
        else:
            assert resp.status_code == 200 and b'"error"' in resp.content  # broken after a token
        assert sum(charged) == (0 if blocking else 2 if where == "connect" else 1), charged
        assert_drained(proxy)


# ---------------------------------------------------------------------- 2. drain
def _start_serve(tmp_path: Path, mapping: dict[str, Any], *, prlimit: str | None = None
                 ) -> tuple[subprocess.Popen, str, list[str]]:
    """``balanceroute serve`` in a subprocess (optionally under a lowered open-file limit);
    returns (process, its URL, its stderr lines so far, filled by a thread)."""
    path = tmp_path / "proxy.json"
    path.write_text(json.dumps({"port": 0, "upstream_api_key_env": None, **mapping}))
    cmd = [str(BIN), "serve", "--config", str(path)]
    if prlimit is not None:
        cmd = ["prlimit", f"--nofile={prlimit}", "--", *cmd]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            m = re.search(r"balanceroute serve: (http://\S+)", line)
            if m:
                found.append(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(180) or not found:
        proc.kill()
        raise AssertionError("serve did not start:\n" + "".join(lines[-30:]))
    return proc, found[0], lines


@pytest.mark.parametrize("http_server", ["native", "uvicorn"])
def test_sigterm_lets_streams_that_finish_within_the_grace_finish_and_ends_the_rest(
        tmp_path: Path, http_server: str) -> None:
    grace = 5.0
    # 20 ms steps: a 40-token stream takes ~0.8 s, a 100,000-token one forever
    with running_emulator(num_replicas=4, slots=16, num_prefill=1, time_scale=1.0) as emu:
        proc, url, log = _start_serve(tmp_path, {
            **emu.proxy_mapping("nixl"), "policy": "least_load", "drain_timeout_s": grace,
            "health_interval_s": 0.5, "http_server": http_server, "log_level": "info"})
        try:
            wait_until(lambda: httpx.get(url + "/health").status_code == 200, timeout=30, what="ready")

            async def run() -> tuple[list[dict], list[dict], float]:
                async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=40)) as http:
                    firsts = [asyncio.Event() for _ in range(32)]
                    tasks = [asyncio.ensure_future(stream_one(http, url, 40 if k % 2 else 100_000, firsts[k]))
                             for k in range(32)]
                    async with asyncio.timeout(30):
                        await asyncio.gather(*(e.wait() for e in firsts))
                    proc.send_signal(signal.SIGTERM)
                    sent = time.monotonic()
                    await asyncio.sleep(0.5)
                    with pytest.raises(OSError):  # the listener is closed
                        socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=2).close()
                    results = await asyncio.gather(*tasks)
                    return results[1::2], results[0::2], sent

            short, long, sent = asyncio.run(run())
            rc = proc.wait(timeout=grace + 20)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = "".join(log)
    print(f"\nSIGTERM ({http_server}): {sum(r['done'] and r['error'] is None for r in short)}/16 short streams "
          f"complete, {sum(bool(r['error']) for r in long)}/16 long ones ended with an error event after "
          f"{max(r['end'] - sent for r in long):.2f} s (grace {grace} s), exit {rc}")
    assert rc == 0, text[-3000:]
    for r in short:  # finished within the grace: complete, no error
        assert r["done"] and r["error"] is None and r["tokens"] == 40, r
    for r in long:  # cut at the grace's end: an error event, then [DONE]
        assert r["done"] and r["error"]["code"] == "shutting_down", r
        assert grace - 1.0 <= r["end"] - sent <= grace + 5.0, r["end"] - sent
    assert "SIGTERM received" in text and "drain: grace of" in text, text[-3000:]
    assert "Traceback" not in text and "CancelledError" not in text, text[-3000:]


@pytest.mark.anyio
async def test_after_the_grace_pooled_requests_get_503_and_streams_an_error_event() -> None:
    from .conftest import chunk

    async def hang_forever() -> Any:
        yield chunk(" t0", 1)
        await asyncio.sleep(3600)


    def handler(request: httpx.Request) -> httpx.Response:
        if b'"max_tokens":1,' in request.content or b'"max_tokens": 1,' in request.content:
            return prefill_reply()
        return httpx.Response(200, stream=ByteStream(hang_forever()),
                              headers={"content-type": "text/event-stream"})

    async with mock_proxy(pd_config(slots=1), handler) as (client, proxy):
        body = {"model": "m", "prompt": "x", "max_tokens": 50, "stream": True}
        # two streams hold the two slots; the third waits in the pool
        streams = [asyncio.ensure_future(client.post("/v1/completions", json=body)) for _ in range(2)]
        await asyncio.sleep(0.3)
        pooled = asyncio.ensure_future(client.post("/v1/completions", json={**body, "stream": False}))
        await asyncio.sleep(0.3)
        assert len(proxy.ledger.pool) == 1
        async with asyncio.timeout(10):
            await proxy.drain(0.3)
            resp = await pooled
            assert resp.status_code == 503 and resp.json()["error"]["code"] == "shutting_down"
            assert resp.headers["retry-after"]
            for s in streams:
                text = (await s).text
                assert '"code":"shutting_down"' in text.replace(" ", "") and text.rstrip().endswith("[DONE]")
        assert_drained(proxy)
        assert proxy.members.outliers.hosts[0].consecutive == 0  # nobody charged
        assert (await client.post("/v1/completions", json=body)).status_code == 503  # draining


# -------------------------------------------------------------------- 3. deadlines
def test_a_hung_prefill_costs_new_requests_at_most_the_deadline() -> None:
    deadline = 1.0
    with running_emulator(num_replicas=4, slots=8, num_prefill=2) as emu, \
            serving({**emu.proxy_mapping("nixl"), "policy": "least_load", "prefill_timeout_s": deadline, "prefill_timeout_per_token_s": 0,
                     "health_interval_s": 0.5}) as (url, proxy, server):
        wait_until(lambda: httpx.get(url + "/health").status_code == 200, what="ready")
        fault(emu, "prefill", 0, "hang")
        start = on_loop(server, lambda: asyncio.get_running_loop().time())

        async def run() -> list[dict]:
            async with httpx.AsyncClient(timeout=60) as http:
                sem = asyncio.Semaphore(8)

                async def one() -> dict:
                    async with sem:
                        return await stream_one(http, url, 4)
                return await asyncio.gather(*(one() for _ in range(24)))

        results = asyncio.run(run())
        # how late the proxy's own loop ran meanwhile: a process that gets no CPU keeps no
        # deadline (a machine loaded far beyond its cores), and the bound allows for that only
        lag = on_loop(server, lambda: proxy.members.lag.max_since(start))
        fault(emu, "prefill", 0, "thaw")
        ttfts = sorted(r["ttft"] for r in results if r["ttft"] is not None)
        wait_until(lambda: on_loop(server, lambda: proxy.ledger.in_flight == 0), what="idle")
        charged = on_loop(server, lambda: proxy.prefills.detector.hosts[0].ejections
                          + proxy.prefills.detector.hosts[0].consecutive)
    print(f"\nhung prefill: TTFT max {ttfts[-1]:.2f} s, p50 {ttfts[len(ttfts) // 2]:.2f} s, loop lag {lag:.2f} s")
    assert all(r["done"] and r["error"] is None for r in results), results
    assert len(ttfts) == 24 and ttfts[-1] <= deadline + 2.0 + lag, (ttfts, lag)
    assert charged >= 1  # the timeouts counted against the hung instance


def test_a_hung_decode_replica_freezes_no_stream_longer_than_the_stall_timeout() -> None:
    first_token, stall = 2.0, 2.0
    with running_emulator(num_replicas=4, slots=4, num_prefill=1) as emu, \
            serving({**emu.proxy_mapping("nixl"), "policy": "least_load", "decode_first_token_timeout_s": first_token,
                     "decode_read_timeout_s": stall, "health_interval_s": 0.5}) as (url, proxy, server):
        wait_until(lambda: httpx.get(url + "/health").status_code == 200, what="ready")

        async def run() -> tuple[list[dict], list[dict], float, int]:
            async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=40)) as http:
                firsts = [asyncio.Event() for _ in range(8)]
                long = [asyncio.ensure_future(stream_one(http, url, 100_000, firsts[k])) for k in range(8)]
                async with asyncio.timeout(30):
                    await asyncio.gather(*(e.wait() for e in firsts))
                running = [r["running"] for r in emu.stats()["per_replica"]]
                g = max(range(4), key=lambda k: running[k])
                fault(emu, "decode", g, "hang")
                hung_at = time.monotonic()
                await asyncio.sleep(0.2)
                sem = asyncio.Semaphore(6)

                async def short() -> dict:
                    async with sem:
                        return await stream_one(http, url, 4)
                after = await asyncio.gather(*(short() for _ in range(16)))
                await asyncio.sleep(max(0.0, hung_at + stall + 2.0 - time.monotonic()))
                frozen = [t.result() for t in long if t.done()]
                for t in long:
                    t.cancel()
                await asyncio.gather(*long, return_exceptions=True)
                return frozen, after, hung_at, running[g]

        frozen, after, hung_at, on_hung = asyncio.run(run())
        fault(emu, "decode", 0, "thaw")
        for g in range(4):
            fault(emu, "decode", g, "thaw")
        wait_until(lambda: on_loop(server, lambda: proxy.ledger.in_flight == 0), timeout=20, what="idle")
    ttfts = sorted(r["ttft"] for r in after if r["ttft"] is not None)
    print(f"\nhung decode: {len(frozen)} frozen streams ended, after: TTFT max {ttfts[-1]:.2f} s")
    assert len(frozen) == on_hung >= 1
    for r in frozen:  # ended by the stall timeout, with an error event and [DONE]
        assert r["done"] and r["error"] is not None and r["end"] - hung_at <= stall + 2.0, r
    assert all(r["done"] and r["error"] is None for r in after), after
    assert len(ttfts) == 16 and ttfts[-1] <= first_token + 2.0, ttfts


def test_without_a_prefill_stage_a_first_token_timeout_as_long_as_the_pool_wait_is_retried() -> None:
    """``kv_dialect: none`` holds no KV: a request's bound is a pool wait of ``kv_lease_s``.
    With the first-token timeout that long (the defaults: 30 s and 30 s), a request placed on
    a hung replica must be retried on the other, not answered 503 ``kv_lease_expired`` for a
    wait it spent in the failed attempt (a starved real vLLM did that in CI)."""
    limit = 3.0  # seconds: the healthy replica answers the retry within it on a busy box too
    with running_emulator(num_replicas=2, slots=4) as emu, \
            serving({**emu.proxy_mapping("none"), "policy": "least_load", "kv_lease_s": limit, "lease_margin_s": 0.2,
                     "decode_first_token_timeout_s": limit, "health_interval_s": 0}) as (url, proxy, server):
        fault(emu, "decode", 0, "hang")

        async def run() -> list[dict]:
            async with httpx.AsyncClient(timeout=30) as http:
                return await asyncio.gather(*(stream_one(http, url, 3) for _ in range(4)))

        results = asyncio.run(run())
        retried = on_loop(server, lambda: proxy.metrics.retries.labels("decode")._value.get())
        fault(emu, "decode", 0, "thaw")
    assert retried >= 1, "no request was placed on the hung replica: the test proves nothing"
    assert all(r["status"] == 200 and r["done"] and r["error"] is None and r["tokens"] == 3
               for r in results), results


def test_the_stall_timeout_bounds_a_stream_after_its_first_token_not_before() -> None:
    """Up to the first token only ``decode_first_token_timeout_s`` applies: a replica that
    prefills for 1.5 s before it answers (no prefill stage) is not cut by a 0.5 s stall
    timeout (before, the read timeout fired on the response's head and every attempt failed).
    After the first token the stall timeout does apply: a stream frozen then ends within it."""
    stall, limit = 0.5, 10.0
    with running_emulator(num_replicas=2, slots=4, time_scale=0.1, prefill_b=15.0) as emu, \
            serving({**emu.proxy_mapping("none"), "policy": "least_load", "decode_read_timeout_s": stall,
                     "decode_first_token_timeout_s": limit, "health_interval_s": 0}) as (url, proxy, server):

        async def run() -> tuple[dict, dict, float]:
            async with httpx.AsyncClient(timeout=60) as http:
                slow = await stream_one(http, url, 3)
                got = asyncio.Event()
                frozen = asyncio.ensure_future(stream_one(http, url, 100_000, got))
                await asyncio.wait_for(got.wait(), 30)
                g = next(t.replica for t in proxy.ledger.tickets.values())
                fault(emu, "decode", g, "hang")
                t_hang = time.monotonic()
                return slow, await frozen, t_hang

        slow, frozen, t_hang = asyncio.run(run())
        retried = on_loop(server, lambda: proxy.metrics.retries.labels("decode")._value.get())
        for g in range(2):
            fault(emu, "decode", g, "thaw")
    assert slow["status"] == 200 and slow["done"] and slow["tokens"] == 3 and slow["ttft"] >= 1.4, slow
    assert retried == 0, "the first attempt was cut before its first token"
    assert frozen["error"] is not None and frozen["end"] - t_hang <= stall + 2.5, (frozen, frozen["end"] - t_hang)


# ----------------------------------------------------------------- 4. client limits
@pytest.mark.parametrize("http_server", ["native", "uvicorn"])
@pytest.mark.parametrize("sent", [b"P", b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-length: 100\r\n\r\n{"])
def test_a_client_that_goes_silent_is_closed_within_the_timeout(http_server: str, sent: bytes) -> None:
    limit = 0.5
    mapping = {"kv_dialect": "none", "decode": [{"url": "http://127.0.0.1:9"}], "health_interval_s": 0, "policy": "least_load",
               "header_timeout_s": limit, "body_timeout_s": limit, "http_server": http_server}
    with serving(mapping) as (url, _, _):
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            t0 = time.monotonic()
            sock.sendall(sent)
            sock.settimeout(limit + 5.0)
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
            took = time.monotonic() - t0
    assert limit * 0.8 <= took <= limit + 2.0, took
    assert not data or data.startswith(b"HTTP/1.1 408"), data


@pytest.mark.parametrize("http_server", ["native", "uvicorn"])
def test_oversized_request_headers_get_431(http_server: str) -> None:
    mapping = {"kv_dialect": "none", "decode": [{"url": "http://127.0.0.1:9"}], "health_interval_s": 0, "policy": "least_load",
               "http_server": http_server}
    with serving(mapping) as (url, _, _):
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=10) as sock:
            with contextlib.suppress(OSError):  # the server may close before it has read it all
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 431")


@pytest.mark.parametrize("http_server", ["native", "uvicorn"])
def test_a_client_that_reads_nothing_is_disconnected_after_the_write_stall_timeout(http_server: str) -> None:
    gone: list[float] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.append(time.monotonic())

        watcher = asyncio.ensure_future(watch())
        data = b"x" * 65536
        for _ in range(4000):  # at most 256 MB
            if gone:
                break
            await send({"type": "http.response.body", "body": data, "more_body": True})
            await asyncio.sleep(0)  # a send to a gone client returns at once: let the watcher run
        watcher.cancel()

    stall = 0.5
    server = ServerThread([(app, bind_socket("127.0.0.1"))], http_server=http_server,  # type: ignore[arg-type]
                          options={"write_stall_timeout_s": stall}).start()
    try:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", int(server.urls[0].rsplit(":", 1)[1])))
            sock.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            t0 = time.monotonic()
            wait_until(lambda: bool(gone), timeout=30, what="the server to drop the stalled client")
    finally:
        server.stop()
    assert gone[0] - t0 <= 15.0


# ------------------------------------------------------------------ 6. descriptors
@pytest.mark.parametrize("raise_soft", [True, False])
def test_a_thousand_clients_under_a_1024_descriptor_limit_eject_no_replica(tmp_path: Path, raise_soft: bool) -> None:
    """Soft limit 1024: raised to the hard one at start, every request is served. Hard limit 1024
    too: clients beyond what leaves room for upstream get 503 + Retry-After, upstream connects
    that hit EMFILE get 503 + Retry-After, and no replica is charged or ejected."""
    import resource

    n = 1000
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if raise_soft and hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the hard open-file limit ({hard}) leaves nothing to raise to")
    limit = "1024:" + ("unlimited" if hard == resource.RLIM_INFINITY else str(hard)) if raise_soft else "1024:1024"
    with running_emulator(num_replicas=4, slots=64, num_prefill=0) as emu:
        proc, url, log = _start_serve(tmp_path, {**emu.proxy_mapping("none"), "policy": "least_load",
                                                 "pool_capacity": 2048, "health_interval_s": 0.5},
                                      prlimit=limit)
        try:
            wait_until(lambda: httpx.get(url + "/health").status_code == 200, timeout=30, what="ready")

            async def run() -> list[tuple[int, str | None]]:
                limits = httpx.Limits(max_connections=n + 16, max_keepalive_connections=0)
                async with httpx.AsyncClient(timeout=120, limits=limits) as http:
                    async def one(k: int) -> tuple[int, str | None]:
                        try:
                            resp = await http.post(url + "/v1/completions", json={
                                "model": "m", "prompt": "w " * (1 + k % 9), "max_tokens": 2, "ignore_eos": True})
                        except httpx.HTTPError as exc:
                            return -1, type(exc).__name__
                        return resp.status_code, resp.headers.get("retry-after")
                    return await asyncio.gather(*(one(k) for k in range(n)))

            results = asyncio.run(run())
            metrics = httpx.get(url + "/metrics", timeout=30).text
        finally:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            if proc.poll() is None:
                proc.kill()
    statuses: dict[Any, int] = {}
    for status, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    text = "".join(log)
    print(f"\n{n} clients, open-file limit {limit}: {statuses}")
    ejections = [line for line in metrics.splitlines()
                 if line.startswith("balanceroute_ejections_total") and not line.endswith(" 0.0")]
    assert not ejections and "ejected" not in text, (ejections, text[-3000:])
    assert not re.search(r'balanceroute_errors_total\{kind="decode_connect"\} [1-9]', metrics), metrics
    assert "open-file limit: soft" in text
    if raise_soft:
        assert statuses == {200: n}, (statuses, text[-3000:])
    else:
        assert set(statuses) <= {200, 503}, (statuses, text[-3000:])
        assert all(retry for status, retry in results if status == 503)
        assert statuses.get(200, 0) >= n // 3, statuses
