"""BF-IO (arXiv 2601.17855) from its definitions: the subset-sum search against brute force,
hand-computed ticks of both phases, the forecast projection, and the compared variants."""

from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.catalogue import CATALOGUE, build_policy
from balanceroute.core.policies import get_policy
from balanceroute.core.policies.bfio import BFIOPolicy, best_sum_subset
from balanceroute.core.predictors import Oracle, RequestFeatures, split_workload
from balanceroute.core.simulator import SimConfig, simulate
from balanceroute.core.state import ClusterState, PoolView, validate_assignment
from tests.factories import lognormal_workload


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 60), min_size=1, max_size=7), k=st.integers(1, 7),
       safe=st.integers(0, 200))
def test_subset_search_equals_brute_force(sizes, k, safe):
    found = best_sum_subset(sizes, k, safe)
    if k > len(sizes):
        assert found is None
        return
    sums = {sum(sizes[i] for i in q) for q in combinations(range(len(sizes)), k)}
    fitting = [s for s in sums if s <= safe]
    want = max(fitting) if fitting else min(sums)
    pos, total = found
    assert total == want
    assert len(pos) == k == len(set(pos)) and sum(sizes[i] for i in pos) == total


def _state(loads, free):
    loads = np.asarray(loads, dtype=np.int64)
    free = np.asarray(free, dtype=np.int64)
    return ClusterState(loads=loads, free_slots=free, num_active=np.full(loads.shape[0], 4) - free)


def _pool(prompts):
    n = len(prompts)
    return PoolView(prompt_len=np.asarray(prompts, dtype=np.int64), wait=np.zeros(n),
                    request_ids=np.arange(n, dtype=np.int64))


def test_fine_phase_fills_the_least_loaded_replica_with_the_best_fitting_pair():
    # 3 free slots (≤ 7: fine phase only). Heap: least loaded first → replica 1 (load 100,
    # margin 900, 2 free). Exactly 2 requests with the largest sum ≤ 900: 500 + 350 = 850.
    # Then replica 0 (margin 0 after? no: the envelope stays 1000, replica 0 is at it) takes the
    # single best F: all overflow, F(s) = s − 43 s → the smallest, 200.
    out = get_policy("bfio-h0").assign(_state([1000, 100], [1, 2]), _pool([500, 200, 350, 600]))
    validate_assignment(_state([1000, 100], [1, 2]), _pool([500, 200, 350, 600]), out)
    got = sorted(zip(out.replica.tolist(), out.pool_index.tolist()))
    assert got == [(0, 1), (1, 0), (1, 2)]


def test_greedy_phase_takes_the_emptiest_replica_and_the_best_f():
    # 10 free slots > 7: greedy. Replica 0 has most free (6): margin 400 → F(300) = 300 is the
    # best fit (F(500) = 500 − 43·100 < 0). Then replica 0 (5 free) again: margin 100 → F(50) = 50.
    state = _state([600, 1000], [6, 4])
    out = get_policy("bfio-h0", greedy_slots=7).assign(state, _pool([500, 300, 50]))
    assert out.pool_index.tolist()[:2] == [1, 2]
    assert out.replica.tolist()[:2] == [0, 0]


def test_the_pool_deadline_places_late_requests_first_when_set():
    # one free slot (fine phase): without a deadline the least loaded replica 1 (margin 900)
    # takes the largest sum ≤ 900, the 800; with deadline_s = 30 the request that waited 31 s,
    # the 50, goes first — and to replica 1, where it fits (F = 50; on replica 0 it overflows).
    state = _state([1000, 100], [1, 1])
    view = PoolView(prompt_len=np.array([800, 50]), wait=np.array([1.0, 31.0]),
                    request_ids=np.arange(2))
    assert get_policy("bfio-h0").assign(state, view).pool_index.tolist()[0] == 0
    late = get_policy("bfio-h0", deadline_s=30.0).assign(state, view)
    validate_assignment(state, view, late)
    assert (late.pool_index[0], late.replica[0]) == (1, 1)
    with pytest.raises(ValueError, match="deadline_s"):
        BFIOPolicy(deadline_s=0.0)


def test_forecast_departures_free_margin_ahead():
    # both replicas at the envelope 1000; replica 1's only request ends next step. With the
    # oracle and T = 72 (γ = 1) its margins are (0, 1000, …): F(S) = 73·S − 43·S > 0 grows with
    # S, so BF-IO takes 600; BF-IO-H0 sees margin 0, F(S) = S − 43·S, and takes the smaller 50.
    # (greedy phase, which maximises F; the fine phase's subset rule keys on min_t m(t) = 0)
    state = ClusterState(
        loads=np.array([1000, 1000]), free_slots=np.array([0, 1]), num_active=np.array([1, 1]),
        active_replica=np.array([0, 1]), active_prompt=np.array([950, 950]),
        active_age=np.array([50, 50]), active_ids=np.array([0, 1]),
    )
    table = RequestFeatures(prompt_len=np.array([950, 950, 50, 600]),
                            output_len=np.array([5000, 51, 9000, 9000]))
    view = PoolView(prompt_len=np.array([50, 600]), wait=np.zeros(2), request_ids=np.array([2, 3]))
    ahead = BFIOPolicy(horizon=72, predictor=Oracle(), features=table, gamma=1.0, greedy_slots=0)
    assert ahead.assign(state, view).pool_index.tolist() == [1]
    assert get_policy("bfio-h0", greedy_slots=0).assign(state, view).pool_index.tolist() == [0]
    assert ahead.assign(state, view).replica.tolist() == [1]


def test_parameters_are_validated_and_rows_are_registered():
    for bad in (dict(horizon=-1), dict(gamma=0.0), dict(beta=0.0), dict(max_candidates=0)):
        with pytest.raises(ValueError):
            BFIOPolicy(**bad)
    assert {"bfio-h0", "bfio"} <= {n for n, e in CATALOGUE.items() if e.default}
    assert get_policy("bfio-h0").horizon == 0


def test_bfio_variant_runs_with_exact_lengths_and_beats_fifo():
    w = lognormal_workload(1200, seed=3, output_mu=5.0)
    train, test = split_workload(w, 0.5)
    cfg = SimConfig(num_replicas=4, slots=8)
    rows = {n: simulate(test, build_policy(n, train=train, test=test), cfg).metrics
            for n in ("jsq", "bfio-h0", "bfio")}
    with pytest.raises(ValueError, match="training workload"):
        build_policy("bfio", train=None, test=test)
    for n in ("bfio-h0", "bfio"):
        assert rows[n]["mean_imbalance"] < rows["jsq"]["mean_imbalance"]
