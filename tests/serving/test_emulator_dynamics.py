"""The emulated cluster runs the simulator's dynamics: given the simulator's assignments, the
emulator's per-step loads, step times, imbalance and metrics are the simulator's (its steps
are driven directly, no sleeping, so nothing depends on the wall clock)."""

import asyncio

import numpy as np
import pytest

from balanceroute.core.dynamics import StepModel, barrier, replica_loads_at
from balanceroute.core.policies import get_policy
from balanceroute.core.simulator import SimConfig, simulate
from balanceroute.core.workloads.base import Workload
from balanceroute.serving.emulator import EmulatedCluster, EmulatedRequest, EmulatorConfig

METRICS = ("steps", "loaded_steps", "generated_tokens", "mean_imbalance", "mean_imbalance_all",
           "barrier_idle_fraction", "throughput_tok_s", "throughput_loaded_tok_s", "busy_time_s",
           "mean_step_ms")


def _replay(workload: Workload, policy: str, step: StepModel, g_count: int, slots: int):
    """Simulate, then feed the emulator the simulator's assignments step by step."""
    res = simulate(workload, get_policy(policy), SimConfig(num_replicas=g_count, slots=slots,
                                                            step_model=step, record_series=True))
    cluster = EmulatedCluster(EmulatorConfig(num_replicas=g_count, slots=slots, step_model=step,
                                             num_prefill=0))
    loads, taus = [], []
    for k in range(int(res.metrics["steps"])):
        for i in np.flatnonzero(res.start_step == k).tolist():
            cluster.submit(EmulatedRequest(rid=str(i), prompt=int(workload.prompt_len[i]),
                                           output=int(workload.output_len[i]),
                                           replica=int(res.replica[i]), event=asyncio.Event()))
        ran = cluster.step()
        assert ran is not None  # a saturated run never idles
        loads.append(ran[0])
        taus.append(ran[1])
    assert cluster.step() is None  # everything finished when the simulator's run did
    return res, cluster, np.array(loads), np.array(taus)


@pytest.mark.parametrize("policy, step", [
    ("jsq", StepModel(b=0.01, a=1e-4)),
    ("br0", StepModel(b=0.02, a=3e-5, c=2e-3)),  # c > 0: the max over replicas of a·L + c·n
])
def test_emulator_and_simulator_agree_on_a_trace(policy, step):
    rng = np.random.default_rng(7)
    n, g_count, slots = 120, 3, 4
    workload = Workload(name="t", prompt_len=rng.integers(1, 500, n), output_len=rng.integers(1, 30, n))
    res, cluster, loads, taus = _replay(workload, policy, step, g_count, slots)
    k = np.arange(loads.shape[0])
    want = replica_loads_at(res.replica, res.start_step, res.finish_step,
                            workload.prompt_len.astype(np.float64), k, g_count)
    np.testing.assert_array_equal(loads, want)
    np.testing.assert_array_equal(loads.max(axis=1), res.series["envelope"])
    np.testing.assert_array_equal([barrier(row)[2] for row in loads], res.series["imbalance"])
    np.testing.assert_allclose(taus, res.series["step_time"], rtol=1e-12)
    stats = cluster.stats()
    for name in METRICS:
        assert stats[name] == pytest.approx(res.metrics[name], rel=1e-12), name
    assert stats["requests"]["completed"] == n


def test_barrier_of_a_hand_computed_step():
    # L = (10, 4, 7): M = 10, Σ L = 21, I = 3·10 − 21 = 9
    assert barrier(np.array([10, 4, 7])) == (10, 21, 9)
