"""Outlier detection: known answers on an injected clock, and through the proxy over a mock."""

from __future__ import annotations

import json

import httpx
import pytest

from balanceroute.serving.outlier import OutlierConfig, OutlierDetector

from .conftest import assert_drained, mock_proxy, pd_config, prefill_reply, sse_stream


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def detector(n: int = 4, **overrides) -> tuple[OutlierDetector, Clock]:
    clock = Clock()
    return OutlierDetector(n, OutlierConfig(**overrides), clock=clock), clock


def test_consecutive_failures_eject_for_a_growing_time_then_probation() -> None:
    det, clock = detector(consecutive_failures=3, base_ejection_s=10, max_ejection_s=25, success_threshold=2)
    assert det.record(0, False) is None and det.record(0, False) is None
    det.record(0, True)  # a success resets the streak
    assert [det.record(0, False) for _ in range(3)] == [None, None, "consecutive"]
    assert det.ejected(0) and det.next_expiry() == pytest.approx(10)
    assert det.usable()[0] == [False, True, True, True]
    clock.t += 10
    assert not det.ejected(0)
    assert det.record(0, False) == "probation"  # one failure on probation ejects again ...
    assert det.next_expiry() == pytest.approx(20)  # ... for 2 × base
    clock.t += 20
    det.record(0, False)
    assert det.next_expiry() == pytest.approx(25)  # capped at max_ejection_s
    clock.t += 25
    det.record(0, True), det.record(0, True)  # success_threshold successes close it
    assert not det.hosts[0].probation
    assert det.ejections_total == {"consecutive": 1, "failure_rate": 0, "probation": 2}


def test_failure_rate_over_the_window() -> None:
    det, clock = detector(consecutive_failures=100, failure_rate=0.5, min_requests=10, window_s=30)
    for k in range(9):
        assert det.record(1, k % 2 == 0) is None  # 4 failures of 9: too few results
    assert det.record(1, False) == "failure_rate"  # 5 of 10
    det2, clock2 = detector(consecutive_failures=100, failure_rate=0.5, min_requests=10, window_s=30)
    for k in range(10):
        det2.record(1, k % 2 == 0)
        clock2.t += 5  # results older than 30 s leave the window
    assert not det2.ejected(1)


def test_max_ejected_share_and_panic() -> None:
    det, _ = detector(n=4, consecutive_failures=1, max_ejected_fraction=0.5, panic_threshold=0.5)
    assert det.record(0, False) == "consecutive" and det.record(1, False) == "consecutive"
    assert det.record(2, False) is None and det.ejections_refused == 1  # at most 2 of 4
    assert det.usable() == ([False, False, True, True], False)
    # probes take a third one down: 1 of 4 usable < 50 % → panic routes to all
    for _ in range(3):
        det.probe(3, False)
    assert det.usable() == ([True, True, True, True], True)
    # drained replicas are not candidates
    assert det.usable([True, True, True, False]) == ([True, True, True, False], True)
    one, _ = detector(n=1, consecutive_failures=1, max_ejected_fraction=0.0)
    assert one.record(0, False) == "consecutive"  # at least one host may always be ejected


def test_probes_need_consecutive_evidence_both_ways() -> None:
    det, _ = detector(probe_failure_threshold=3, probe_success_threshold=2)
    assert not det.probe(0, False) and not det.probe(0, False)
    assert not det.probe(0, True)  # a pass resets the failure streak
    assert [det.probe(0, False) for _ in range(3)] == [False, False, True]
    assert not det.hosts[0].probe_up
    assert [det.probe(0, True) for _ in range(2)] == [False, True]


@pytest.mark.parametrize("bad", [{"consecutive_failures": 0}, {"failure_rate": 1.5},
                                 {"base_ejection_s": 10, "max_ejection_s": 5}, {"window_s": float("nan")}])
def test_bad_outlier_configs(bad) -> None:
    with pytest.raises(ValueError, match="outlier|max_ejection"):
        OutlierConfig(**bad)
    with pytest.raises(ValueError, match="unknown outlier key"):
        OutlierConfig.from_mapping({"consecutive": 1})


@pytest.mark.anyio
async def test_a_broken_replica_is_ejected_and_a_poison_request_ejects_nobody() -> None:
    seen: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host.startswith("p"):
            return prefill_reply()
        seen.append(host)
        if host == "d0" or json.loads(request.content)["prompt"] == "poison":
            return httpx.Response(500, json={"error": {"message": "boom", "type": "internal"}})
        return httpx.Response(200, content=b"".join(sse_stream(2)))

    config = pd_config(decode=[{"url": f"http://d{g}:8000"} for g in range(4)], policy="least_load",
                       outlier={"consecutive_failures": 3})
    async with mock_proxy(config, handler) as (client, proxy):
        for _ in range(6):  # an empty cluster: least_load tries d0 first, then steers away
            assert (await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})).status_code == 200
        assert proxy.members.outliers.ejected(0) and not proxy.ledger.available[0]
        assert seen.count("d0") == 3  # ejected after its third attributed failure
        for _ in range(5):
            resp = await client.post("/v1/completions", json={"prompt": "poison", "max_tokens": 2})
            assert resp.status_code == 502 and resp.json()["error"]["code"] == "decode_failed"
        assert [proxy.members.outliers.ejected(g) for g in range(4)] == [True, False, False, False]
        assert proxy.members.outliers.ejections_total["consecutive"] == 1
        assert b'balanceroute_poison_requests_total{stage="decode"} 5.0' in proxy.metrics.render()
        assert_drained(proxy)


@pytest.mark.anyio
async def test_a_broken_prefill_instance_is_ejected_after_repeated_evidence() -> None:
    hits: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host.startswith("p"):
            hits.append(host)
            return httpx.Response(503, text="overloaded") if host == "p0" else prefill_reply()
        return httpx.Response(200, content=b"".join(sse_stream(1)))

    async with mock_proxy(pd_config(outlier={"consecutive_failures": 2}), handler) as (client, proxy):
        for _ in range(8):
            assert (await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})).status_code == 200
        assert proxy.prefills.detector.ejected(0) and not proxy.prefills.detector.ejected(1)
        assert hits.count("p0") == 2  # round robin sent it two, then it was out
        assert b'balanceroute_ejections_total{reason="consecutive",stage="prefill"} 1.0' in proxy.metrics.render()
        assert_drained(proxy)
