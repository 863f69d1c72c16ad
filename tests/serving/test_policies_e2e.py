"""The policy runs unchanged through the proxy: every tick the proxy ran on an emulated G = 8
cluster is decided again, from the recorded state and pool, by a fresh policy object, and must
give the identical assignment; the proxy must have applied exactly that assignment. BR-0 runs
both ways: through ``assign`` (wrapped, so the generic path decides) and through its compiled
tick on the ledger's arrays (:mod:`balanceroute.serving.compiled_tick`), whose every decision is
checked against ``assign`` on the state the generic path would have built.

Nothing here depends on wall-clock speed: *which* states the ticks see depends on timing, but
the checks hold for whatever states they were. The speed-dependent comparison (br0 leaves less
imbalance and decodes faster than round_robin through the proxy) lives in
``benchmarks/bench_proxy.py --section policies``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from balanceroute.core.dynamics import StepModel
from balanceroute.core.policies import get_policy
from balanceroute.core.state import Assignment, ClusterState, PoolView
from balanceroute.core.workloads.base import Workload
from balanceroute.serving.loadgen import LoadgenConfig, run_load_sync

from .conftest import running_emulator, running_proxy


def _decode_heavy(n: int, seed: int) -> Workload:
    """Heavy-tailed prompts (lognormal, 20..12k tokens), outputs 20..80 tokens."""
    rng = np.random.default_rng(seed)
    prompt = np.clip(rng.lognormal(6.0, 1.4, n), 20, 12_000).astype(np.int64)
    output = rng.integers(20, 81, n).astype(np.int64)
    return Workload(name="decode-heavy", prompt_len=prompt, output_len=output)


class Recording:
    """Wraps a policy: records each tick's inputs (deep copies) and its decision."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.name = getattr(policy, "name", type(policy).__name__)
        self.ticks: list[tuple[ClusterState, PoolView, Assignment]] = []

    def assign(self, state: ClusterState, pool: PoolView) -> Assignment:
        out = self.policy.assign(state, pool)
        self.ticks.append((copy.deepcopy(state), copy.deepcopy(pool), copy.deepcopy(out)))
        return out

    def __getattr__(self, item):  # deadline_s and friends, as the proxy reads them
        if item == "compiled_tick":  # recorded: the proxy must call assign
            raise AttributeError(item)
        return getattr(self.policy, item)


def _record_compiled(runner, ticks: list) -> None:
    """Record each decision of the dispatcher's compiled tick with the state and pool the
    generic path would have built for it (``build_tick`` at the same clock)."""
    decide = runner.decide

    def recording_decide(ledger, now):
        inputs = ledger.build_tick(now)
        out = decide(ledger, now)
        if out is not None:
            state, view = inputs
            ticks.append((copy.deepcopy(state), copy.deepcopy(view), Assignment(
                pool_index=np.array(out[0], dtype=np.int64), replica=np.array(out[1], dtype=np.int64))))
        return out

    runner.decide = recording_decide


@pytest.mark.parametrize("name, compiled", [("br0", False), ("br0", True), ("round_robin", False)],
                         ids=["br0-assign", "br0-compiled", "round_robin"])
def test_proxy_applies_exactly_what_the_policy_decides(name: str, compiled: bool) -> None:
    g_count, slots = 8, 4
    workload = _decode_heavy(96, seed=3)
    recorder = None if compiled else Recording(get_policy(name))
    ticks = [] if recorder is None else recorder.ticks
    with running_emulator(num_replicas=g_count, slots=slots, num_prefill=2, time_scale=0.2,
                          step_model=StepModel(b=0.03, a=2e-6)) as emu, \
            running_proxy({**emu.proxy_mapping("nixl"), "policy": name, "pool_capacity": 256,
                           "health_interval_s": 0},
                          policy=recorder or get_policy(name)) as (url, proxy, _):
        if compiled:
            _record_compiled(proxy.dispatcher._runner, ticks)
        applied = []
        ledger = proxy.ledger
        original_place = ledger.place

        def recording_place(index, replica):
            before, n_before = ledger.loads.copy(), ledger.num_active.copy()
            placed = original_place(index, replica)
            applied.append((before, ledger.loads.copy(), n_before, ledger.num_active.copy()))
            return placed

        ledger.place = recording_place
        config = LoadgenConfig(url=url, concurrency=g_count * slots + 2 * g_count, timeout_s=120)
        summary, _ = run_load_sync(workload, config)
        assert summary["ok"] == len(workload), summary["error_kinds"]
        assert ledger.in_flight == 0 and not ledger.loads.any()
        assert proxy.dispatcher.compiled_ticks == (len(ticks) if compiled else 0)

    placed = sum(len(out) for _, _, out in ticks)
    assert placed == len(workload)  # every request placed exactly once, no retries here
    assert any(len(pool) > 1 for _, pool, _ in ticks)  # some ticks had a choice
    fresh = get_policy(name)
    for state, pool, out in ticks:
        again = fresh.assign(copy.deepcopy(state), copy.deepcopy(pool))
        np.testing.assert_array_equal(again.pool_index, out.pool_index)
        np.testing.assert_array_equal(again.replica, out.replica)
        # the decision respects the state it was made on
        counts = np.bincount(out.replica, minlength=g_count)
        assert (counts <= state.free_slots).all()
        assert len(set(out.pool_index.tolist())) == len(out)
    # the proxy applied each decision: right after apply, the ledger's loads are the state's
    # loads plus the prompts placed on each replica, and its active counts grew likewise
    assert len(applied) == len(ticks)
    for (before, after, n_before, n_after), (state, pool, out) in zip(applied, ticks):
        np.testing.assert_array_equal(before, state.loads)
        added = np.bincount(out.replica, weights=pool.prompt_len[out.pool_index],
                            minlength=g_count).astype(np.int64)
        np.testing.assert_array_equal(after, before + added)
        np.testing.assert_array_equal(n_after, n_before + np.bincount(out.replica, minlength=g_count))


def test_brh_survival_learns_its_forecast_from_the_requests_it_served() -> None:
    # the online row: BR-H whose survival forecast is the ECDF of the outputs the proxy saw
    # finish; after the run it holds exactly the workload's lengths (the emulator decodes
    # max_tokens = the request's output length), and /status says so
    from balanceroute.catalogue import build_policy
    from balanceroute.core.policies.brh import BRHPolicy
    from balanceroute.core.predictors import OnlineSurvival

    online = build_policy("brh-survival", online=True)
    assert isinstance(online, BRHPolicy) and isinstance(online.predictor, OnlineSurvival)
    assert online.name == "brh-survival" and not online.predictor.ready
    g_count, slots = 4, 4
    workload = _decode_heavy(48, seed=5)
    learner = OnlineSurvival(min_samples=16, refit_every=8)
    recorder = Recording(BRHPolicy(predictor=learner, name="brh-survival"))
    with running_emulator(num_replicas=g_count, slots=slots, num_prefill=1, time_scale=0.2,
                          step_model=StepModel(b=0.03, a=2e-6)) as emu, \
            running_proxy({**emu.proxy_mapping("nixl"), "policy": "brh-survival",
                           "pool_capacity": 256, "health_interval_s": 0},
                          policy=recorder) as (url, proxy, _):
        assert proxy.status()["predictor"] == {"name": "survival-online", "samples": 0,
                                               "ready": False, "spread": None}
        config = LoadgenConfig(url=url, concurrency=g_count * slots + 2 * g_count, timeout_s=120)
        summary, _ = run_load_sync(workload, config)
        assert summary["ok"] == len(workload), summary["error_kinds"]
        status = proxy.status()["predictor"]
    assert learner.samples == len(workload) and learner.ready
    np.testing.assert_array_equal(learner.fitted.sorted_out, np.sort(workload.output_len))
    want = float(workload.output_len.std() / workload.output_len.mean())
    assert status == {"name": "survival-online", "samples": len(workload), "ready": True,
                      "spread": pytest.approx(want)}
    assert sum(len(out) for _, _, out in recorder.ticks) == len(workload)
