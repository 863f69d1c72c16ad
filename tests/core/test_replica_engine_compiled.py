"""The compiled replica engine runs exactly as the Python one (queues, preemptions, step times)."""

from __future__ import annotations

import numpy as np
import pytest

from balanceroute.core import simulator
from balanceroute.core._jit import HAVE_NUMBA
from balanceroute.core.dynamics import StepModel
from balanceroute.core.policies import get_policy
from balanceroute.core.policies.br0 import BR0Policy
from balanceroute.core.replica_engine import CompiledReplicaEngine, ReplicaEngine
from balanceroute.core.simulator import SimConfig, simulate
from balanceroute.core.workloads.base import Workload
from tests.factories import lognormal_workload

pytestmark = pytest.mark.skipif(not HAVE_NUMBA, reason="the compiled engine needs numba")

CASES = [
    ("jsq", dict(kv_budget=6_000)),  # binding: queues and many preemptions
    ("power_of_two", dict(kv_budget=(5_000, 9_000, 7_000))),
    ("br0", dict(kv_budget=8_000, output_cap=400)),
    ("br0-window", dict(kv_budget=6_000)),
    ("least_load", dict(replica_steps=(StepModel(), StepModel(b=0.045, a=3e-7), StepModel()))),
    ("br0", dict(replica_steps=(StepModel(b=0.02, a=1e-7), StepModel(), StepModel(c=2e-4)),
                 kv_budget=7_000, recompute_s_per_token=1e-4)),
]


def _policy(name):
    if name == "br0-window":
        return BR0Policy(kv_growth_steps=16, kv_until_end=False)
    return get_policy(name, seed=3)


@pytest.mark.parametrize(("name", "options"), CASES)
def test_compiled_engine_equals_the_python_engine(name, options, monkeypatch):
    w = lognormal_workload(400, seed=11, prompt_mu=6.0, output_mu=4.5)
    w = Workload(name=w.name, prompt_len=np.minimum(w.prompt_len, 3_000),
                 output_len=np.minimum(w.output_len, 400))
    cfg = SimConfig(num_replicas=3, slots=12, record_series=True, **options)
    monkeypatch.setattr(simulator, "engine_class", lambda: ReplicaEngine)
    ref = simulate(w, _policy(name), cfg)
    monkeypatch.setattr(simulator, "engine_class", lambda: CompiledReplicaEngine)
    got = simulate(w, _policy(name), cfg)
    assert got.metrics.keys() == ref.metrics.keys()
    for key, value in ref.metrics.items():
        assert got.metrics[key] == value or (np.isnan(value) and np.isnan(got.metrics[key])), key
    for field in ("replica", "start_step", "finish_step", "ttft_s", "tpot_s", "pool_wait_s"):
        np.testing.assert_array_equal(getattr(got, field), getattr(ref, field), err_msg=field)
    for key in ref.series:
        np.testing.assert_array_equal(got.series[key], ref.series[key], err_msg=key)
    if "kv_budget" in options and name in ("jsq", "power_of_two"):
        assert ref.metrics["preemptions"] > 0  # the case exercises preemption
