"""The ``ttft_slo_s`` knob in the proxy: it reaches the proxy's policy object through
``policy_params`` and moves that object's decision the expected way — a request that has waited
past the soft first-token deadline is placed before a larger one that fits better; with the knob
off the balance-only choice wins. End to end on the emulator, switching it on removes the
first-token tail that the hard deadline alone leaves."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from balanceroute.cli import build_parser
from balanceroute.core.dynamics import StepModel
from balanceroute.core.state import ClusterState, PoolView
from balanceroute.core.workloads.base import Workload
from balanceroute.serving.cli import serve_config
from balanceroute.serving.loadgen import LoadgenConfig, run_load_sync

from .conftest import mock_proxy, pd_config, running_emulator, running_proxy


def _tick(policy) -> list[int]:
    # replica 1 has one free slot and a 600-token margin; the pool holds a 50-token request that
    # has waited 3 s and a 550-token one that just arrived
    state = ClusterState(loads=np.array([1000, 400]), free_slots=np.array([0, 1]),
                         num_active=np.array([4, 3]))
    pool = PoolView(prompt_len=np.array([50, 550]), wait=np.array([3.0, 0.0]),
                    request_ids=np.array([7, 8]))
    return policy.assign(state, pool).pool_index.tolist()


async def _unused(request: httpx.Request) -> httpx.Response:  # pragma: no cover - no traffic
    return httpx.Response(500)


@pytest.mark.anyio
@pytest.mark.parametrize(("knob", "placed"), [(None, [1]), (10.0, [1]), (1.0, [0])])
async def test_the_knob_reaches_the_proxy_policy_and_moves_its_choice(knob, placed) -> None:
    config = pd_config(policy="br0", policy_params={"ttft_slo_s": knob})
    async with mock_proxy(config, _unused) as (_, proxy):
        assert proxy.policy.ttft_slo_s == knob
        # off, or a deadline far away (u = 550·3/10 = 165 < 550 − 50): balance first, the 550
        # fits. Past the deadline (u = 550·3/1 = 1650): the old request outranks the fit.
        assert _tick(proxy.policy) == placed


@pytest.mark.parametrize(("setting", "expected"), [("off", None), ("OFF", None), (2.5, 2.5), ("2.5", 2.5)])
def test_the_proxy_can_switch_the_urgency_term_off(setting, expected) -> None:
    config = pd_config(policy="br0", ttft_slo_s=setting)  # as a config file gives it
    assert config.policy_parameters()["ttft_slo_s"] == expected
    args = build_parser().parse_args(["serve", "--prefill", "http://p0:8000", "--decode", "http://d0:8000",
                                      "--ttft-slo", str(setting)])
    assert serve_config(args).policy_parameters()["ttft_slo_s"] == expected


@pytest.mark.parametrize("bad", [0, -1.0, "nan", "soon"])
def test_a_bad_ttft_slo_is_refused(bad) -> None:
    with pytest.raises(ValueError, match="seconds > 0 or 'off'"):
        pd_config(policy="br0", ttft_slo_s=bad)


def _bimodal(n: int, seed: int) -> Workload:
    """30 % tiny prompts (10–29 tokens) among large ones (1,500–4,000): a tiny one never fits a
    margin better than a large one, so balance alone leaves it in the pool until the deadline."""
    rng = np.random.default_rng(seed)
    tiny = rng.random(n) < 0.3
    prompt = np.where(tiny, rng.integers(10, 30, n), rng.integers(1_500, 4_000, n)).astype(np.int64)
    output = rng.integers(8, 24, n).astype(np.int64)
    return Workload(name="bimodal", prompt_len=prompt, output_len=output)


def _ttft_p99(knob, workload: Workload) -> tuple[float, float]:
    """TTFT P99 (s) through the proxy on an emulated G = 4, B = 1 cluster, and its deadline_s.
    The pool deadline is 3 s and the lease 10 s: the 7 s between them absorb event-loop delays
    on a busy machine (with a 1 s margin a loaded run once let requests expire, 503)."""
    with running_emulator(num_replicas=4, slots=1, num_prefill=2, time_scale=0.5,
                          step_model=StepModel(b=0.02, a=2e-6)) as emu, \
            running_proxy({**emu.proxy_mapping("nixl"), "policy": "br0", "pool_capacity": 64,
                           "health_interval_s": 0, "kv_lease_s": 10.0, "lease_margin_s": 7.0,
                           "ttft_slo_s": knob}) as (url, proxy, _):
        summary, records = run_load_sync(workload, LoadgenConfig(url=url, concurrency=16, timeout_s=120))
        assert summary["ok"] == len(workload), summary["error_kinds"]
        assert proxy.ledger.in_flight == 0 and not proxy.ledger.loads.any()
        deadline = proxy.policy.deadline_s
    return float(np.percentile([r.ttft for r in records], 99)), deadline


def test_the_knob_removes_the_first_token_tail_on_the_emulator() -> None:
    """Closed loop, 400 requests, 12 waiting in the pool at any time for 4 slots. With the knob
    off the tiny prompts wait for the hard deadline (3 s here), so TTFT P99 sits above it; with a
    0.05 s soft deadline a request that has waited goes first, and the P99 is ordinary queueing
    (about three service times). Measured at load average 8 on 2 cores: 3.24 s off vs 1.30 s on.
    Only the direction is asserted (and that the tail exists with the knob off), not a speed."""
    workload = _bimodal(400, seed=1)
    off, deadline = _ttft_p99("off", workload)
    on, _ = _ttft_p99(0.05, workload)
    assert deadline == pytest.approx(3.0)
    print(f"TTFT P99: knob off {off:.2f} s, on {on:.2f} s")
    assert off > deadline, (off, on)  # the tail this test is about is there
    assert on < off, (off, on)
