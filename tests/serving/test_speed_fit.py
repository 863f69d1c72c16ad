"""The online speed fit: known answers on the emulator's step model, bounded noise, the tick."""

from __future__ import annotations

import numpy as np
import pytest

from balanceroute.core.dynamics import StepModel
from balanceroute.core.policies.br0 import BR0Policy
from balanceroute.core.state import ClusterState, PoolView
from balanceroute.serving.emulator import EmulatorConfig
from balanceroute.serving.speed_fit import SpeedFit, TokenClock

SLOW = ((2, 1.5), (5, 1.5))


def _lockstep_intervals(seed: int, steps: int, g_count: int = 8):
    """What the proxy relays from an emulated lock-stepped group with two slow ranks: each step
    τ = b + max_g(slow_g·a·L_g) (the emulator's own step model, ±3 % noise), seen on one random
    replica's stream with that replica's load."""
    config = EmulatorConfig(num_replicas=g_count, slow=SLOW)
    slow = np.ones(g_count)
    for g, f in config.slow:
        slow[g] = f
    rng = np.random.default_rng(seed)
    loads = rng.uniform(50_000, 250_000, g_count)
    for _ in range(steps):
        loads = np.clip(loads + rng.normal(0, 8_000, g_count), 20_000, 300_000)
        tau = config.step_model.step_time(loads, np.zeros(g_count), slow) * rng.uniform(0.97, 1.03)
        g = int(rng.integers(g_count))
        yield g, tau, loads[g]


def test_the_fit_finds_the_two_slow_replicas_and_the_tick_avoids_them():
    prior = EmulatorConfig(num_replicas=8).step_model
    fit = SpeedFit(num_replicas=8, prior=prior)
    for g, tau, load in _lockstep_intervals(0, 8_000):
        fit.observe(g, tau, load, 64)
    a, b, c = fit.coefficients()
    ratio = a / prior.a
    assert np.all(ratio[[2, 5]] > 1.35), ratio  # the truth is 1.5
    assert np.all(np.delete(ratio, [2, 5]) < 1.2), ratio  # the truth is 1
    # the tick uses it: equal token loads, a late request goes to a fast replica
    state = ClusterState(loads=np.full(8, 100_000), free_slots=np.full(8, 4),
                         num_active=np.full(8, 60), step_a=a, step_b=b, step_c=c)
    pool = PoolView(prompt_len=np.array([8_000]), wait=np.array([40.0]), request_ids=np.arange(1))
    tokens = BR0Policy(s_greedy=100).assign(
        ClusterState(loads=state.loads, free_slots=state.free_slots, num_active=state.num_active),
        pool)
    timed = BR0Policy(s_greedy=100).assign(state, pool)
    assert tokens.replica.tolist() == [0]  # a token tie: the lowest index
    assert timed.replica[0] not in (2, 5)


def test_noise_is_bounded():
    fit = SpeedFit(num_replicas=2)
    for _ in range(200):
        fit.observe(0, 0.05, 100_000, 10)
        fit.observe(1, 0.05, 100_000, 10)
    before = fit.coefficients()[0].copy()
    fit.observe(0, 1e6, 100_000, 10)  # a client stall: a million seconds
    after = fit.coefficients()[0]
    assert np.all(np.abs(after / before - 1) < 0.01)
    many = SpeedFit(num_replicas=1)
    for _ in range(10_000):
        many.observe(0, 1e6, 100_000, 10)
    assert many.coefficients()[0][0] <= many.prior.a * many.max_ratio


def test_independent_replicas_are_fitted_each_to_its_own_line():
    truth = [StepModel(b=0.02, a=1e-7), StepModel(b=0.04, a=4e-7)]
    fit = SpeedFit(num_replicas=2, lockstep=False, prior_weight=5.0, forget=1.0)
    rng = np.random.default_rng(1)
    for _ in range(3_000):
        g = int(rng.integers(2))
        load = rng.uniform(10_000, 200_000)
        fit.observe(g, truth[g].b + truth[g].a * load, load, 0)
    a, b, _ = fit.coefficients()
    np.testing.assert_allclose(a, [1e-7, 4e-7], rtol=0.05)
    np.testing.assert_allclose(b, [0.02, 0.04], rtol=0.05)


def test_token_clock_gives_seconds_per_token():
    clock = TokenClock(capacity=2)
    assert clock.interval(7, 1, 10.0) is None
    assert clock.interval(7, 3, 10.1) == pytest.approx(0.1 / 2)
    assert clock.interval(7, 3, 10.2) is None  # no new token
    clock.interval(8, 1, 0.0)
    clock.interval(9, 1, 0.0)  # capacity 2: stream 7 is forgotten
    assert clock.interval(7, 4, 11.0) is None


@pytest.mark.anyio
async def test_the_proxy_feeds_the_fit_from_its_relay_and_shows_it() -> None:
    from tests.serving.conftest import assert_drained, mock_proxy, pd_config
    from tests.serving.test_proxy_unit import Recorder

    async with mock_proxy(pd_config(speed_fit=True), Recorder()) as (client, proxy):
        for _ in range(3):
            reply = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
            assert reply.status_code == 200
        assert proxy.speed_fit is not None and proxy.signals.speed_fit is proxy.speed_fit
        assert proxy.speed_fit.observations.sum() > 0  # intervals came in through _speed_progress
        status = proxy.status()  # (the /status endpoint needs the admin token)
        assert {"step_a_us_per_token", "step_b_ms"} <= set(status["replicas"][0]["speed"])
        text = (await client.get("/metrics")).text
        assert "balanceroute_replica_step_a_seconds_per_token" in text
        assert_drained(proxy)


@pytest.mark.anyio
async def test_a_configured_kv_budget_reaches_the_tick() -> None:
    from balanceroute.core.state import ClusterState
    from tests.serving.conftest import mock_proxy, pd_config
    from tests.serving.test_proxy_unit import Recorder

    config = pd_config(decode=[{"url": "http://d0:8000", "kv_budget": 5_000},
                               {"url": "http://d1:8000"}])
    async with mock_proxy(config, Recorder()) as (_, proxy):
        state = ClusterState(loads=np.zeros(2, np.int64), free_slots=np.full(2, 4),
                             num_active=np.zeros(2, np.int64))
        proxy.signals.reconcile(state)
        # planned: the budget less each of d0's 4 slots' unused part of a 16-token block (the
        # default kv_block_size); d1: unbounded
        assert state.kv_budget[0] == 5_000 - 4 * 15 and state.kv_budget[1] > 10**12


def test_the_emulator_steps_at_its_slowest_replica():
    from balanceroute.serving.emulator import EmulatedCluster

    steps = (StepModel(b=0.01, a=1e-6), StepModel(b=0.02, a=3e-6))
    cluster = EmulatedCluster(EmulatorConfig(num_replicas=2, slots=4, replica_steps=steps))
    cluster.inject(0, 1000, 5)
    cluster.inject(1, 1000, 5)
    loads, tau = cluster.step()
    assert tau == 0.02 + 3e-6 * 1000  # max(0.011, 0.023)
