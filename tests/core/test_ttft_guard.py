"""The first-token guard's scale (two_stage.urgency_scale) and bfio-h0-lease held to it."""

import math

import numpy as np

from balanceroute.core.policies import get_policy
from balanceroute.core.state import ClusterState, PoolView
from balanceroute.core.two_stage import urgency_scale


def test_scale_is_the_smaller_of_the_knob_and_twice_the_median_wait():
    assert urgency_scale(4.0, np.array([0.0, 0.2, 0.6, 30.0])) == 0.8  # median 0.4, not the mean
    assert urgency_scale(4.0, np.array([5.0, 7.0])) == 4.0  # FIFO's wait is longer: the knob
    assert urgency_scale(4.0, np.zeros(3)) == 4.0  # nobody has waited
    assert urgency_scale(4.0, np.zeros(0)) == 4.0
    assert math.isinf(urgency_scale(None, np.array([1.0, 2.0])))  # the guard off


def test_bfio_h0_lease_places_a_request_past_the_scale_first():
    # one replica, one free slot; BF-IO alone takes the 90-token prompt (it fits the margin);
    # the 500-token one has waited 3 s, past θ = min(4, 2·median(0.1, 3.0, 0.1)) = 0.2 s
    state = ClusterState(loads=np.array([100, 0]), free_slots=np.array([0, 1]),
                         num_active=np.array([1, 0]))
    pool = PoolView(prompt_len=np.array([90, 500, 95]), wait=np.array([0.1, 3.0, 0.1]),
                    request_ids=np.arange(3))
    assert get_policy("bfio-h0").assign(state, pool).pool_index.tolist() == [2]
    assert get_policy("bfio-h0-lease").assign(state, pool).pool_index.tolist() == [1]
    assert get_policy("bfio-h0-lease").deadline_s == 25.0  # the lease's deadline (core/lease.py)
