"""The step-synchronous simulator: a hand-computed run, conservation and invariants."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.core.dynamics import StepModel
from balanceroute.core.policies import get_policy, policy_names
from balanceroute.core.simulator import SimConfig, simulate
from balanceroute.core.workloads.base import Workload
from tests.factories import lognormal_workload


def _workload(prompt, output, arrival=None):
    return Workload(
        name="t", prompt_len=np.array(prompt, dtype=np.int64), output_len=np.array(output, dtype=np.int64),
        arrival_s=None if arrival is None else np.array(arrival, dtype=float),
    )


def test_hand_computed_run():
    # G = 2, B = 1, pool 2, round robin; requests (s, o) = (10, 2), (4, 1), (6, 1).
    # step 0: r0 → g0, r1 → g1; L = (10, 4), I = 20 - 14 = 6; r1 finishes.
    # step 1: r2 → g1 (g0 full); L = (11, 6), I = 22 - 17 = 5; r0 and r2 finish.
    step = StepModel(b=0.05, a=0.001, c=0.0)
    cfg = SimConfig(num_replicas=2, slots=1, pool_size=2, step_model=step, record_series=True)
    res = simulate(_workload([10, 4, 6], [2, 1, 1]), get_policy("round_robin"), cfg)
    m = res.metrics
    assert res.series["imbalance"].tolist() == [6, 5]
    assert res.series["envelope"].tolist() == [10, 11]
    assert m["steps"] == 2 and m["loaded_steps"] == 2
    assert m["mean_imbalance"] == pytest.approx(5.5)
    tau0, tau1 = 0.05 + 0.010, 0.05 + 0.011
    assert m["busy_time_s"] == pytest.approx(tau0 + tau1)
    assert m["throughput_tok_s"] == pytest.approx(4 / (tau0 + tau1))
    assert m["throughput_loaded_tok_s"] == pytest.approx(4 / (tau0 + tau1))  # no drain here
    assert res.replica.tolist() == [0, 1, 1]
    assert res.start_step.tolist() == [0, 0, 1]
    assert res.finish_step.tolist() == [1, 0, 1]
    assert res.tpot_s[0] == pytest.approx(tau1)  # one token after the first, one step apart
    assert np.isnan(res.tpot_s[1])  # o = 1 has no TPOT
    assert res.ttft_s.tolist() == pytest.approx([tau0, tau0, tau1])
    assert res.pool_wait_s.tolist() == pytest.approx([0.0, 0.0, 0.0])
    assert m["barrier_idle_fraction"] == pytest.approx(11 / (20 + 22))
    assert m["kv_lease_missed"] == 0.0


def test_kv_lease_missed_counts_waits_that_reach_the_lease():
    from balanceroute.core.dynamics import KV_LEASE_S, request_metrics

    wait = np.array([0.0, KV_LEASE_S - 1e-9, KV_LEASE_S, 45.0])
    m, *_ = request_metrics(np.full(4, 2), np.ones(4), np.full(4, 2.0), np.zeros(4), wait, np.zeros(4))
    assert m["kv_lease_missed"] == 0.5


def test_loaded_phase_ends_at_the_last_assignment():
    # one replica, one slot: r0 (o=3) then r1 (o=1) at step 3; the drain after is excluded
    cfg = SimConfig(num_replicas=2, slots=1, pool_size=1, record_series=True)
    res = simulate(_workload([5, 5, 1], [1, 1, 6]), get_policy("least_load"), cfg)
    last_assign = int(res.start_step.max())
    assert res.metrics["loaded_steps"] == last_assign + 1
    series = res.series["imbalance"]
    assert res.metrics["mean_imbalance"] == pytest.approx(series[: last_assign + 1].mean())
    assert res.metrics["mean_imbalance_all"] == pytest.approx(series.mean())
    k = last_assign + 1
    loaded_rate = res.series["active"][:k].sum() / res.series["step_time"][:k].sum()
    assert res.metrics["throughput_loaded_tok_s"] == pytest.approx(loaded_rate)
    assert res.metrics["throughput_loaded_tok_s"] != pytest.approx(res.metrics["throughput_tok_s"])


@pytest.mark.parametrize("name", policy_names())
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), replicas=st.integers(1, 5), slots=st.integers(1, 4),
       pool=st.integers(1, 12), open_loop=st.booleans())
def test_invariants_for_every_policy(name, seed, replicas, slots, pool, open_loop):
    w = lognormal_workload(60, seed=seed, prompt_mu=4.0, output_mu=2.5, rate=20.0)
    cfg = SimConfig(num_replicas=replicas, slots=slots, pool_size=pool, record_series=True,
                    mode="open_loop" if open_loop else "saturated")
    res = simulate(w, get_policy(name, seed=seed), cfg)
    # every request assigned exactly once, and finishes after exactly o_i steps
    assert (res.start_step >= 0).all()
    np.testing.assert_array_equal(res.finish_step - res.start_step + 1, w.output_len)
    # tokens conserved: Σ over steps of active requests = Σ o_i
    assert res.series["active"].sum() == w.output_len.sum() == res.metrics["generated_tokens"]
    # slots never exceeded: running requests per replica per step ≤ B
    steps = int(res.metrics["steps"])
    occupancy = np.zeros((replicas, steps + 1), dtype=np.int64)
    np.add.at(occupancy, (res.replica, res.start_step), 1)
    np.add.at(occupancy, (res.replica, res.finish_step + 1), -1)
    assert occupancy.cumsum(axis=1).max() <= slots
    assert (res.series["imbalance"] >= 0).all()
    if open_loop:  # nobody starts before it arrives
        assert (res.ttft_s >= 0).all()


def test_deterministic_for_a_seed():
    w = lognormal_workload(400, seed=1)
    cfg = SimConfig(num_replicas=4, slots=8)
    a = simulate(w, get_policy("power_of_two", seed=3), cfg).metrics
    b = simulate(w, get_policy("power_of_two", seed=3), cfg).metrics
    assert a == b


def test_permuting_the_trace_of_identical_requests_changes_nothing():
    w = _workload([100] * 20, [7] * 20)
    cfg = SimConfig(num_replicas=3, slots=2)
    a = simulate(w, get_policy("br0"), cfg).metrics
    b = simulate(w.take(np.arange(20)[::-1]), get_policy("br0"), cfg).metrics
    assert a == b


def test_open_loop_waits_for_arrivals_and_idles_between():
    # r0 at t=0 (o=2), r1 at t=100 s: the cluster idles in between, steps = 3
    cfg = SimConfig(num_replicas=1, slots=1, mode="open_loop", step_model=StepModel(b=1.0, a=0.0))
    res = simulate(_workload([5, 5], [2, 1], arrival=[0.0, 100.0]), get_policy("jsq"), cfg)
    assert res.metrics["steps"] == 3
    assert res.metrics["makespan_s"] == pytest.approx(101.0)
    assert res.metrics["busy_time_s"] == pytest.approx(3.0)
    assert res.ttft_s.tolist() == pytest.approx([1.0, 1.0])


def test_open_loop_rate_scale_and_prefill_delay():
    cfg = SimConfig(num_replicas=1, slots=1, mode="open_loop", rate_scale=2.0, prefill_delay_s=0.5,
                    step_model=StepModel(b=1.0, a=0.0))
    res = simulate(_workload([5, 5], [1, 1], arrival=[0.0, 10.0]), get_policy("jsq"), cfg)
    # r1 arrives at 10/2 = 5 s, is ready at 5.5 s, first token at 6.5 s: TTFT 1.5 s
    assert res.ttft_s.tolist() == pytest.approx([1.5, 1.5])


def test_step_model_with_per_sequence_cost():
    step = StepModel(b=0.01, a=0.001, c=0.1)
    # max(0.001*100 + 0.1*1, 0.001*10 + 0.1*3) = max(0.2, 0.31)
    assert step.step_time(np.array([100, 10]), np.array([1, 3])) == pytest.approx(0.32)


@pytest.mark.parametrize(
    ("text", "match"),
    [("b=x", "not a number"), ("q=1", "expected a="), ("a=-1", "must be a finite number"),
     ("a=0,b=0,c=0", "cannot all be 0")],
)
def test_step_model_parse_errors(text, match):
    with pytest.raises(ValueError, match=match):
        StepModel.parse(text)


def test_config_and_input_errors():
    with pytest.raises(ValueError, match="num_replicas"):
        SimConfig(num_replicas=0)
    with pytest.raises(ValueError, match="mode"):
        SimConfig(mode="closed")
    with pytest.raises(ValueError, match="no timestamps"):
        simulate(_workload([1], [1]), get_policy("jsq"), SimConfig(mode="open_loop"))
    with pytest.raises(ValueError, match="non-decreasing"):
        simulate(_workload([1, 1], [1, 1], [2.0, 1.0]), get_policy("jsq"), SimConfig(mode="open_loop"))
    assert StepModel.parse("b=0.02, a=1e-7") == StepModel(b=0.02, a=1e-7)
