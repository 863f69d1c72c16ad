"""The ``ttft_slo_s`` knob through the proxy on the emulator: a tighter soft first-token deadline
must shorten the TTFT tail of br0 (closed loop, pool ≈ 2G, heavy-tailed prompts where small
prompts otherwise wait for a margin)."""

from __future__ import annotations

import numpy as np

from balanceroute.core.simulator import StepModel
from balanceroute.core.workloads.base import Workload
from balanceroute.serving.loadgen import LoadgenConfig, run_load_sync

from .conftest import running_emulator, running_proxy


def _workload(n: int, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    prompt = np.clip(rng.lognormal(6.0, 1.4, n), 20, 12_000).astype(np.int64)
    output = rng.integers(20, 121, n).astype(np.int64)
    return Workload(name="ttft-knob", prompt_len=prompt, output_len=output)


def _ttft_p99(ttft_slo_s: float | None, workload: Workload) -> float:
    g_count, slots = 4, 4
    params = {"ttft_slo_s": ttft_slo_s}
    with running_emulator(num_replicas=g_count, slots=slots, num_prefill=2, time_scale=0.5,
                          step_model=StepModel(b=0.03, a=2e-6)) as emu, \
            running_proxy({**emu.proxy_mapping("nixl"), "policy": "br0", "policy_params": params,
                           "pool_capacity": 256}) as (url, proxy, _):
        assert proxy.policy.ttft_slo_s == ttft_slo_s  # the knob reached the policy object
        config = LoadgenConfig(url=url, concurrency=g_count * slots + 2 * g_count, timeout_s=60)
        summary, _ = run_load_sync(workload, config)
    assert summary["ok"] == len(workload), summary
    return float(summary["ttft_s_p99"])


def test_tighter_ttft_slo_shortens_the_ttft_tail() -> None:
    workload = _workload(120, seed=5)
    off = _ttft_p99(None, workload)
    tight = _ttft_p99(0.05, workload)
    assert tight < 0.8 * off, (tight, off)
