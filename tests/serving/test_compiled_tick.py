"""The proxy's compiled tick (serving/compiled_tick.py) decides exactly as the policy's
``assign`` does on the state the ledger builds, and runs only where it may."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.core._jit import HAVE_NUMBA
from balanceroute.core.policies.br0 import BR0Policy
from balanceroute.core.policies.brh import BRHPolicy
from balanceroute.core.policies.least_load import LeastLoadPolicy
from balanceroute.core.predictors import EmpiricalSurvival
from balanceroute.serving.compiled_tick import CompiledTickRunner
from balanceroute.serving.dispatch import Dispatcher
from balanceroute.serving.ledger import Ledger

pytestmark = pytest.mark.skipif(not HAVE_NUMBA, reason="the compiled tick needs numba")


@st.composite
def ledgers(draw) -> tuple[Ledger, float]:
    """A ledger mid-run: G ≤ 6 replicas of 1–6 slots (some out of service), requests running with
    some tokens made, a pool of 1–40 requests that joined over the last 0–40 s (so the lease's
    and the relative deadline fire in some draws); and the clock."""
    slots = draw(st.lists(st.integers(1, 6), min_size=1, max_size=6))
    led = Ledger(slots, pool_capacity=512)
    now = 100.0
    for g in range(len(slots)):
        for _ in range(draw(st.integers(0, slots[g]))):
            t = led.admit("run")
            led.enqueue(t, draw(st.integers(1, 20_000)), now=now - 50.0, lease_s=1e9)
            led.place([len(led.pool) - 1], [g])
            led.progress(t, draw(st.integers(0, 3_000)))
    for _ in range(draw(st.integers(1, 40))):
        led.enqueue(led.admit("pooled"), draw(st.integers(1, 30_000)),
                    now=now - draw(st.floats(0.0, 40.0)), lease_s=1e9)
    for g in draw(st.sets(st.integers(0, len(slots) - 1), max_size=len(slots) - 1)):
        led.set_available(g, False)
    return led, now


policies = st.builds(
    BR0Policy,
    deadline_s=st.sampled_from([float("inf"), 30.0, 8.0]),
    ttft_slo_s=st.sampled_from([None, 4.0, 0.5]),
    deadline_factor=st.sampled_from([None, 3.0, 1.0]),
    r_max=st.sampled_from([0, 1, 2]),
    s_greedy=st.sampled_from([0, 2, 8]),
    stage1=st.sampled_from(["fit", "paper"]),
    lpt_batches=st.booleans(),
    beta_per_replica=st.sampled_from([1.0, 0.05, 4.0]),
)


@settings(max_examples=400, deadline=None, database=None)
@given(ledgers(), policies)
def test_the_compiled_tick_decides_as_assign_on_the_built_state(drawn, policy) -> None:
    led, now = drawn
    inputs = led.build_tick(now)
    got = CompiledTickRunner(policy, led.num_replicas).decide(led, now)
    if inputs is None:  # no free slot: nothing to decide, on either path
        assert got is None
        return
    want = policy.assign(*inputs)
    assert got == (want.pool_index.tolist(), want.replica.tolist())


def test_the_compiled_tick_reuses_the_kernel_assign_loaded() -> None:
    # the runner hands the kernel the very argument types two_stage_assign does: a warm proxy
    # compiles nothing (a new specialisation would cost a minute on the first request)
    from balanceroute.core._tick_kernels import two_stage_tick

    led = Ledger([4, 4, 4], pool_capacity=16)
    for k in range(5):
        led.enqueue(led.admit(f"r{k}"), 100 * (k + 1), now=0.0, lease_s=30.0)
    policy = BR0Policy()
    policy.assign(*led.build_tick(1.0))
    before = len(two_stage_tick.signatures)
    assert CompiledTickRunner(policy, 3).decide(led, 1.0) is not None
    assert len(two_stage_tick.signatures) == before


def _dispatch_once(policy, led: Ledger) -> Dispatcher:
    async def run() -> Dispatcher:
        dispatcher = Dispatcher(led, policy, tick_interval_s=1.0, clock=lambda: 1.0)
        for k in range(3):
            led.enqueue(led.admit(f"r{k}"), 50 * (k + 1), now=0.0, lease_s=30.0)
        assert dispatcher.tick() == 3
        return dispatcher

    return asyncio.run(run())


def test_the_dispatcher_runs_the_compiled_tick_only_where_it_decides_the_same() -> None:
    assert _dispatch_once(BR0Policy(), Ledger([2, 2], pool_capacity=8)).compiled_ticks == 1
    # BR-H and the FIFO baselines keep their assign; so does a state the engines add to
    assert _dispatch_once(BRHPolicy(predictor=EmpiricalSurvival.from_lengths([10, 20, 40])), Ledger([2, 2], pool_capacity=8)).compiled_ticks == 0
    assert _dispatch_once(LeastLoadPolicy(), Ledger([2, 2], pool_capacity=8)).compiled_ticks == 0
    led = Ledger([2, 2], pool_capacity=8)
    led.reconcile, led.reconciles = (lambda state: None), (lambda: True)  # e.g. a KV budget known
    assert _dispatch_once(BR0Policy(), led).compiled_ticks == 0
    led = Ledger([2, 2], pool_capacity=8)
    led.reconcile, led.reconciles = (lambda state: None), (lambda: False)  # engine state off
    assert _dispatch_once(BR0Policy(), led).compiled_ticks == 1
    off = Ledger([2, 2], pool_capacity=8)

    async def generic() -> int:
        dispatcher = Dispatcher(off, BR0Policy(), tick_interval_s=1.0, clock=lambda: 1.0, compiled=False)
        off.enqueue(off.admit("r"), 10, now=0.0, lease_s=30.0)
        dispatcher.tick()
        return dispatcher.compiled_ticks

    assert asyncio.run(generic()) == 0


def test_a_failing_compiled_tick_falls_back_to_assign_for_good() -> None:
    led = Ledger([2, 2], pool_capacity=8)

    async def run() -> Dispatcher:
        dispatcher = Dispatcher(led, BR0Policy(), tick_interval_s=1.0, clock=lambda: 1.0)

        def broken(ledger, now):
            raise RuntimeError("kernel fault")

        dispatcher._runner.decide = broken
        led.enqueue(led.admit("a"), 10, now=0.0, lease_s=30.0)
        assert dispatcher.tick() == 1  # decided by assign instead, the request placed
        led.enqueue(led.admit("b"), 10, now=0.0, lease_s=30.0)
        assert dispatcher.tick() == 1
        return dispatcher

    dispatcher = asyncio.run(run())
    assert dispatcher.policy_errors == 1 and dispatcher.compiled_ticks == 0 and dispatcher._runner is None
    assert led.num_active.sum() == 2


def test_signals_say_when_they_add_to_the_ledgers_state() -> None:
    # adds_state() is False exactly where reconcile changes nothing: then the ledger's state is
    # the whole state and the compiled tick may decide
    import copy

    from balanceroute.serving.signals import Signals
    from balanceroute.serving.speed_fit import SpeedFit

    led = Ledger([2, 2, 2], pool_capacity=8)
    led.enqueue(led.admit("a"), 10, now=0.0, lease_s=30.0)
    sig = Signals(led, [])
    led.reconcile, led.reconciles = sig.reconcile, sig.adds_state
    state, _ = led.build_tick(1.0)  # (reconciled already)
    bare = copy.deepcopy(state)
    sig.reconcile(state)
    assert not sig.adds_state() and led.own_state()
    assert state.kv_budget is None and state.step_a is None
    assert all((getattr(state, f) == getattr(bare, f)).all() for f in ("loads", "free_slots", "num_active"))
    sig.set_budget(1, 5_000)  # a configured (or reported) KV budget: reconcile hands it to the state
    assert sig.adds_state() and not led.own_state()
    state, _ = led.build_tick(1.0)
    assert state.kv_budget is not None and state.kv_budget[1] == 5_000
    sig.set_budget(1, 5_000, block=16)  # whole blocks of 16 per request: 15 tokens a slot held back
    state, _ = led.build_tick(1.0)
    assert state.kv_budget[1] == 5_000 - 2 * 15 and sig.replica_status(1)["kv_budget_planned"] == 4_970
    sig.set_budget(1, 20, block=16)  # less than the reserve: the tick still gets a budget of 1 token
    state, _ = led.build_tick(1.0)
    assert state.kv_budget[1] == 1
    sig.set_budget(1, -1)
    assert not sig.adds_state()
    sig.speed_fit = SpeedFit(num_replicas=3)  # fitted speeds: reconcile hands them to the state
    assert sig.adds_state()
    state, _ = led.build_tick(1.0)
    assert state.step_a is not None


def test_a_decision_the_ledger_cannot_apply_is_refused() -> None:
    from balanceroute.core.state import check_decisions as _check

    _check([1, 0], [0, 1], 2, [1, 1])  # valid: each position once, within the free slots
    for index, replica, free in (([0, 0], [0, 1], [1, 1]),  # a position twice
                                 ([2], [0], [1, 1]),  # no such position
                                 ([0, 1], [1, 1], [1, 1]),  # replica 1 has one free slot
                                 ([0], [-1], [1, 1]), ([0], [2], [1, 1]),  # no such replica
                                 ([0, 1], [0], [1, 1])):  # a position without a replica
        with pytest.raises(ValueError):
            _check(index, replica, 2, free)
