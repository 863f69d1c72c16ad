"""The online guard (core/guard.py): its structural cap on an unproved lookahead for any costs,
its bound against BR-0 when the lookahead is adversarially wrong, a worked simulation, and the
same guarded policy on the proxy's ledger."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.catalogue import build_policy
from balanceroute.core.guard import BR0_ARM, LOOKAHEAD_ARM, GuardLedger, OnlineGuard
from balanceroute.core.policies.br0 import BR0Policy
from balanceroute.core.policies.brh import BRHPolicy
from balanceroute.core.simulator import SimConfig, simulate
from tests.factories import ledger_tick, lognormal_workload

ENVELOPE = 1000.0


def drive(ledger: GuardLedger, steps: int, idle) -> tuple[float, float, list[tuple[int, int]]]:
    """Run ``ledger`` on a G = 2 cluster whose step k has idle fraction ``idle(arm, k)`` under
    the arm the guard picks: loads (M, M − 2M·f) give I = 2M·f, G·M = 2M. Returns the guarded
    run's Σ I, BR-0's Σ I (every step by arm 0: no carry-over here) and (arm, incumbent) per
    step."""
    realised = baseline = 0.0
    trace = []
    for k in range(steps):
        arm = ledger.arm(k)
        incumbent = ledger.incumbent  # as the block's arm was chosen (a pair may close in arm)
        f = idle(arm, k)
        ledger.observe(k, np.array([ENVELOPE, ENVELOPE - 2 * ENVELOPE * f]), np.zeros(2))
        realised += 2 * ENVELOPE * f
        baseline += 2 * ENVELOPE * idle(BR0_ARM, k)
        trace.append((arm, incumbent))
    return realised, baseline, trace


guards = st.builds(OnlineGuard, block_steps=st.integers(1, 12), probe_every=st.integers(2, 6),
                   min_pairs=st.integers(2, 6), max_probes=st.one_of(st.none(), st.integers(1, 8)))


@settings(max_examples=150, deadline=None)
@given(guard=guards, steps=st.integers(1, 600),
       costs=st.lists(st.floats(0.0, 0.49), min_size=2, max_size=40))
def test_an_unproved_lookahead_decides_at_most_one_block_in_m_and_max_probes(guard, steps, costs):
    # any costs at all (an adaptive adversary): while BR-0 is the incumbent the lookahead
    # decides at most one block in probe_every, and at most max_probes blocks in all
    def idle(arm, k):
        return costs[(2 * (k // guard.block_steps) + arm) % len(costs)]

    _, _, trace = drive(GuardLedger(guard), steps, idle)
    blocks = {k // guard.block_steps for k, (arm, inc) in enumerate(trace)
              if arm == LOOKAHEAD_ARM and inc == BR0_ARM}
    n_blocks = -(-steps // guard.block_steps)
    assert len(blocks) <= -(-n_blocks // guard.probe_every)
    if guard.max_probes is not None:
        assert len(blocks) <= guard.max_probes


@settings(max_examples=150, deadline=None)
@given(guard=guards, steps=st.integers(1, 800), base=st.floats(0.05, 0.3),
       delta=st.floats(0.01, 0.15), seed=st.integers(0, 2**31))
def test_an_adversarially_wrong_lookahead_costs_at_most_its_probes(guard, steps, base, delta, seed):
    # the lookahead is worse by delta on every step, block noise below delta / 2: every pair
    # shows it worse, so it never becomes the incumbent, and the guarded run's excess over BR-0
    # is at most delta on the probe blocks: 2M·delta·W·min(⌈blocks/m⌉, max_probes)
    noise = np.random.default_rng(seed).uniform(-delta / 2.1, delta / 2.1, size=steps + 1)

    def idle(arm, k):
        return base + noise[k // guard.block_steps] + (delta if arm == LOOKAHEAD_ARM else 0.0)

    ledger = GuardLedger(guard)
    realised, baseline, trace = drive(ledger, steps, idle)
    assert all(inc == BR0_ARM for _, inc in trace) and ledger.switches == 0
    n_blocks = -(-steps // guard.block_steps)
    probes = -(-n_blocks // guard.probe_every)
    if guard.max_probes is not None:
        probes = min(probes, guard.max_probes)
    assert realised - baseline <= 2 * ENVELOPE * delta * guard.block_steps * probes + 1e-6
    if len(ledger.pairs) >= guard.min_pairs and np.std(ledger.pairs) == 0:
        assert ledger.locked


def test_a_lookahead_proved_better_becomes_the_incumbent():
    # the lookahead is 0.05 better on every step: after min_pairs pairs it decides every block
    # but one check block in probe_every, which BR-0 plays
    guard = OnlineGuard(block_steps=4, probe_every=4, min_pairs=3)
    ledger = GuardLedger(guard)
    realised, baseline, trace = drive(ledger, 400, lambda arm, k: 0.2 - 0.05 * arm + 1e-4 * (k % 3))
    assert ledger.incumbent == LOOKAHEAD_ARM and not ledger.locked and ledger.switches == 1
    tail = [arm for arm, _ in trace[-64:]]
    assert tail.count(LOOKAHEAD_ARM) == 48  # three blocks in four
    assert realised < baseline


def test_a_new_run_clears_the_record():
    ledger = GuardLedger(OnlineGuard(block_steps=2, probe_every=2, min_pairs=2))
    drive(ledger, 100, lambda arm, k: 0.1 + 0.2 * arm)
    assert ledger.locked
    assert ledger.arm(0) == BR0_ARM and not ledger.locked and ledger.pairs == []


@pytest.mark.parametrize("bad", [dict(block_steps=0), dict(probe_every=1), dict(min_pairs=1),
                                 dict(level=1.0), dict(max_probes=0)])
def test_guard_constants_are_checked(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        OnlineGuard(**bad)


class Liar:
    """Forecasts the opposite of the truth: a request that outlives the window leaves next step,
    one that leaves within it stays the whole window."""

    name = "liar"

    def predict(self, features, ages, horizon):
        remaining = features.output_len.astype(np.int64) - np.asarray(ages, dtype=np.int64)
        outlives = remaining > horizon
        return outlives.astype(np.float64), np.where(outlives, 1.0, float(horizon))


def test_worked_example_the_guard_falls_back_from_a_lying_lookahead():
    # BR-H on the liar's forecast, unsafeguarded and nearly unpunished overflow (β = 0.05):
    # 2.55× BR-0's mean imbalance on this run; guarded, four pairs prove it worse (x̄ ≈ +0.07 of
    # idle), the guard locks after 255 of 5,172 steps on the lookahead and ends at 1.07× BR-0
    workload = lognormal_workload(1_500, seed=0, output_mu=5.0)
    config = SimConfig(num_replicas=4, slots=16)
    br0 = simulate(workload, BR0Policy(), config).metrics["mean_imbalance"]
    liar = BRHPolicy(predictor=Liar(), beta=0.05, safeguard=None, backlog_horizon=None).bind(workload)
    alone = simulate(workload, liar, config).metrics["mean_imbalance"]
    guarded = replace(liar, guard=OnlineGuard())
    m = simulate(workload, guarded, config).metrics
    record = guarded.guard_record
    assert alone / br0 > 2.0
    assert record.locked and record.incumbent == BR0_ARM
    assert len(record.pairs) == 4 and min(record.pairs) > 0
    cap = m["loaded_steps"] / OnlineGuard().probe_every + OnlineGuard().block_steps
    assert record.lookahead_steps <= cap
    assert m["mean_imbalance"] / br0 < 1.10


def test_guard_true_is_the_default_guard_and_runs_on_the_proxy_ledger():
    from balanceroute.serving.ledger import Ledger

    policy = build_policy("brh-survival", {"guard": True}, online=True)
    assert isinstance(policy, BRHPolicy) and policy.guard == OnlineGuard()
    assert BRHPolicy(guard=False).guard is None and BRHPolicy().guard_record is None
    with pytest.raises(ValueError, match="guard"):
        BRHPolicy(guard="yes")
    ledger = Ledger([2, 2], pool_capacity=8)
    placed = 0
    for k in range(6):
        ledger.enqueue(ledger.admit(f"r{k}"), 100 * (k + 1), 0.0, 30.0)
        placed += len(ledger_tick(ledger, policy, now=0.1 * k))
    assert placed == 4  # 4 slots
    assert policy.guard_record._block == 0 and policy.guard_record._last is not None
