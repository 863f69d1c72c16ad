"""Fault acceptance on the emulator (127.0.0.1, bounded loops): injected prefill/decode failures
and a poison request must not take capacity away."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx

from .conftest import assert_drained, running_emulator, running_proxy, wait_until


def _call(server, fn):
    async def run():
        return fn()
    return server.call(run)


async def _closed_loop(url: str, n: int, concurrency: int, statuses: Counter, stop: asyncio.Event | None = None
                       ) -> None:
    queue = iter(range(n))
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        async def client() -> None:
            for k in queue:
                if stop is not None and stop.is_set():
                    return
                body = {"model": "m", "prompt": "w " * (1 + k % 17), "max_tokens": 2 + k % 7, "ignore_eos": True,
                        "stream": k % 3 != 0}
                resp = await http.post(url + "/v1/completions", json=body)
                ok = resp.status_code == 200 and (not body["stream"] or b'"error"' not in resp.content)
                statuses["ok" if ok else resp.status_code] += 1

        await asyncio.gather(*(client() for _ in range(concurrency)))


def test_five_percent_prefill_and_decode_failures_leave_99_percent_served(capsys, caplog) -> None:
    with running_emulator(num_replicas=4, slots=8, time_scale=0.05, prefill_fail_rate=0.05,
                          decode_fail_rate=0.05, seed=1) as emu, \
            running_proxy({**emu.proxy_mapping("nixl"), "health_interval_s": 0.5}) as (url, proxy, server):
        statuses: Counter = Counter()
        asyncio.run(_closed_loop(url, 400, 32, statuses))
        wait_until(lambda: _call(server, lambda: proxy.ledger.in_flight == 0), what="idle")
        _call(server, lambda: assert_drained(proxy))
        ejections = _call(server, lambda: dict(proxy.members.outliers.ejections_total))
        injected = emu.stats()["requests"]["failed_injected"]
    with capsys.disabled():
        print(f"\n5%/5% faults: {dict(statuses)} of 400, injected failures {injected}, ejections {ejections}")
    assert sum(statuses.values()) == 400 and injected > 0
    assert statuses["ok"] >= 396
    assert statuses[503] == 0 and sum(ejections.values()) == 0, _why(caplog)


def _why(caplog) -> str:
    """The proxy's warnings (which replica failed, how, whether charged) for a failure message."""
    lines = [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    return f"{len(lines)} proxy warnings, the last 40:\n" + "\n".join(lines[-40:])


def test_a_poison_request_once_a_second_costs_nobody_else_a_503(capsys, caplog) -> None:
    with running_emulator(num_replicas=4, slots=8, time_scale=0.05, poison_word="POISON") as emu, \
            running_proxy({**emu.proxy_mapping("nixl"), "health_interval_s": 0.5}) as (url, proxy, server):
        statuses: Counter = Counter()
        poison: Counter = Counter()

        async def run() -> None:
            stop = asyncio.Event()
            others = asyncio.ensure_future(_closed_loop(url, 100_000, 16, statuses, stop))
            async with httpx.AsyncClient(timeout=60) as http:
                for _ in range(5):
                    resp = await http.post(url + "/v1/completions",
                                           json={"prompt": "a POISON b", "max_tokens": 4})
                    poison[resp.status_code] += 1
                    await asyncio.sleep(1.0)
            stop.set()
            await others

        asyncio.run(run())
        wait_until(lambda: _call(server, lambda: proxy.ledger.in_flight == 0), what="idle")
        _call(server, lambda: assert_drained(proxy))
        ejections = _call(server, lambda: dict(proxy.members.outliers.ejections_total))
    total = sum(statuses.values())
    with capsys.disabled():
        print(f"\npoison 1/s: poison {dict(poison)}, others {dict(statuses)}, ejections {ejections}")
    assert poison == {502: 5}
    assert total > 50 and statuses[503] <= 0.01 * total and statuses["ok"] >= 0.99 * total
    assert sum(ejections.values()) == 0, _why(caplog)
