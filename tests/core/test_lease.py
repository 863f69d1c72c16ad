"""The KV lease rule (core/lease.py): known answers and validation."""

import numpy as np
import pytest

from balanceroute.core.lease import DEFAULT_LEASE, LeaseRule


def test_defaults_give_the_policies_25_s():
    assert DEFAULT_LEASE.forward_by_s == 28.0
    assert DEFAULT_LEASE.deadline_s == 25.0
    assert DEFAULT_LEASE.max_reprefills == 1


def test_expired_at_forward_by_not_before():
    rule = LeaseRule(lease_s=10.0, margin_s=1.0, priority_s=2.0)
    assert rule.deadline_s == 7.0
    assert not rule.expired(9.0 - 1e-9)
    assert rule.expired(9.0)
    assert rule.expired(np.array([0.0, 8.99, 9.0, 40.0])).tolist() == [False, False, True, True]


@pytest.mark.parametrize("kw", [{"lease_s": 0.0}, {"lease_s": float("inf")}, {"margin_s": 30.0},
                                {"margin_s": -1.0}, {"priority_s": 28.0}, {"max_reprefills": -1}])
def test_rejects_bad_values(kw):
    with pytest.raises(ValueError, match="must"):
        LeaseRule(**kw)


def _lease_run(engine, lease):
    from balanceroute.core.dynamics import StepModel
    from balanceroute.core.policies import get_policy
    from balanceroute.core.simulator import SimConfig, simulate
    from balanceroute.core.workloads.base import Workload

    w = Workload(name="t", prompt_len=np.array([5, 5, 5]), output_len=np.array([10, 1, 1]))
    cfg = SimConfig(num_replicas=1, slots=1, pool_size=2, step_model=StepModel(b=1.0, a=0.0),
                    lease=lease)
    return simulate(w, get_policy("jsq"), cfg, engine=engine)


@pytest.mark.parametrize("engine", ["auto", "generic"])
def test_simulator_reprefills_then_fails_and_never_places_expired(engine):
    # one slot held by r0 for 10 one-second steps; r1 (pooled at 0 s) and r2 (at 1 s) reach
    # forward_by = 4 s at 4 s / 5 s, are prefilled again (wait restarts), reach it again at
    # 8 s / 9 s and fail: never placed
    res = _lease_run(engine, LeaseRule(lease_s=5.0, margin_s=1.0, priority_s=1.0))
    m = res.metrics
    assert (m["kv_lease_reprefilled"], m["kv_lease_failed"]) == (2.0, 2.0)
    assert m["kv_lease_missed"] == pytest.approx(2 / 3)
    assert res.replica.tolist() == [0, -1, -1]
    assert m["ttft_s_p50"] == pytest.approx(1.0)  # only r0 was served


def test_simulator_without_lease_places_everyone():
    res = _lease_run("generic", None)
    assert res.replica.tolist() == [0, 0, 0]
    assert res.metrics["kv_lease_failed"] == 0.0
