"""The exact policies (exact-tick, mpc) honour the Policy contract and run in the simulator."""

from __future__ import annotations

import numpy as np

from balanceroute.core.simulator import SimConfig, simulate
from balanceroute.core.state import ClusterState, PoolView, validate_assignment
from balanceroute.core.workloads.base import Workload
from balanceroute.solvers.policies import ExactTickPolicy, MPCPolicy
from tests.solvers.extras import needs

pytestmark = needs("ortools")



def test_exact_tick_places_the_hand_optimum() -> None:
    # test_tick_known: loads 10,7,6,5, one free slot each, pool 4,5,3,2,6 → I* = 3 leaving out 3.
    state = ClusterState(loads=np.array([10, 7, 6, 5]), free_slots=np.ones(4, dtype=np.int64),
                         num_active=np.zeros(4, dtype=np.int64))
    pool = PoolView(prompt_len=np.array([4, 5, 3, 2, 6]), wait=np.zeros(5),
                    request_ids=np.arange(5))
    out = ExactTickPolicy().assign(state, pool)
    validate_assignment(state, pool, out)
    assert len(out) == 4 and 2 not in out.pool_index.tolist()
    after = state.loads.copy()
    np.add.at(after, out.replica, pool.prompt_len[out.pool_index])
    assert 4 * after.max() - after.sum() == 3


def test_mpc_sees_departures_exact_tick_does_not() -> None:
    # G = 2: replica 0 runs a 10-token request on its last step, replica 1 a 9-token one that
    # stays; one pooled 9-token request (o = 8). Per tick: onto replica 0 → loads (19, 9), I = 10;
    # onto replica 1 → (10, 18), I = 8: exact-tick takes replica 1. Over the window: replica 0
    # empties at h = 1, so joining it gives I = 10 then (9+h, 9+h), I = 0; joining replica 1
    # leaves replica 0 empty, I = 18 + 2h per step: mpc takes replica 0.
    wl = Workload(name="w", prompt_len=np.array([10, 9, 9]), output_len=np.array([1, 20, 8]))
    state = ClusterState(loads=np.array([10, 9]), free_slots=np.array([1, 1]),
                         num_active=np.array([1, 1]), active_replica=np.array([0, 1]),
                         active_prompt=np.array([10, 9]), active_age=np.array([0, 0]),
                         active_ids=np.array([0, 1]))
    pool = PoolView(prompt_len=np.array([9]), wait=np.zeros(1), request_ids=np.array([2]))
    assert ExactTickPolicy().assign(state, pool).replica.tolist() == [1]
    assert MPCPolicy(window=8, stride=1).bind(wl).assign(state, pool).replica.tolist() == [0]


def test_both_run_in_the_simulator() -> None:
    rng = np.random.default_rng(3)
    wl = Workload(name="w", prompt_len=rng.integers(1, 200, 30), output_len=rng.integers(1, 30, 30))
    cfg = SimConfig(num_replicas=2, slots=2, pool_size=4)
    for policy in (ExactTickPolicy(), MPCPolicy(window=16).bind(wl)):
        res = simulate(wl, policy, cfg)
        assert (res.replica >= 0).all() and res.metrics["mean_imbalance"] >= 0
