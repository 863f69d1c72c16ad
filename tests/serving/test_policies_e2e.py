"""br0 vs round_robin through the same proxy on an emulated G = 8 cluster (saturated closed loop,
decode-heavy workload): br0 must leave less imbalance and decode faster, as the emulator
measures it. A small version of ``benchmarks/bench_proxy.py --section policies``."""

from __future__ import annotations

import numpy as np

from balanceroute.core.simulator import StepModel
from balanceroute.core.workloads.base import Workload
from balanceroute.serving.loadgen import LoadgenConfig, run_load_sync

from .conftest import running_emulator, running_proxy


def _decode_heavy(n: int, seed: int) -> Workload:
    """Heavy-tailed prompts (lognormal, 20..12k tokens), outputs 20..120 tokens."""
    rng = np.random.default_rng(seed)
    prompt = np.clip(rng.lognormal(6.0, 1.4, n), 20, 12_000).astype(np.int64)
    output = rng.integers(20, 121, n).astype(np.int64)
    return Workload(name="decode-heavy", prompt_len=prompt, output_len=output)


def _run(policy: str, workload: Workload) -> dict:
    g_count, slots = 8, 4
    with running_emulator(num_replicas=g_count, slots=slots, num_prefill=2, time_scale=0.5,
                          step_model=StepModel(b=0.03, a=2e-6)) as emu, \
            running_proxy({**emu.proxy_mapping("nixl"), "policy": policy, "pool_capacity": 256}) as (url, _, _):
        config = LoadgenConfig(url=url, concurrency=g_count * slots + 2 * g_count,
                               emulator_stats=emu.decode_urls[0] + "/stats", timeout_s=60)
        summary, _ = run_load_sync(workload, config)
    assert summary["ok"] == len(workload)
    return summary["emulator"]


def test_br0_beats_round_robin_through_the_proxy() -> None:
    workload = _decode_heavy(160, seed=3)
    rr = _run("round_robin", workload)
    br = _run("br0", workload)
    assert br["mean_imbalance"] < 0.8 * rr["mean_imbalance"], (br, rr)
    assert br["loaded_throughput_tok_s"] > rr["loaded_throughput_tok_s"], (br, rr)
