"""The emulated decode replicas enforce their KV budget as the simulator's engines do
(``core.replica_engine``, vLLM v1's FCFS scheduler): a worked example by hand, and the same
routed requests step by step through both (Hypothesis; steps driven directly, no sleeping).
Then the proxy in front of them: BR-0, told the budgets, causes no preemption."""

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.core.dynamics import StepModel
from balanceroute.core.replica_engine import ReplicaEngine
from balanceroute.core.workloads.base import Workload
from balanceroute.serving.emulator import EmulatedCluster, EmulatedRequest, EmulatorConfig
from balanceroute.serving.loadgen import LoadgenConfig, run_load_sync

from .conftest import running_emulator, running_proxy

STEP = StepModel(b=0.01, a=1e-4, c=2e-3)


def _request(i: int, prompt: int, output: int, g: int) -> EmulatedRequest:
    return EmulatedRequest(rid=str(i), prompt=prompt, output=output, replica=g, event=asyncio.Event(),
                           limit=output)


def test_a_full_replica_preempts_its_newest_request_which_recomputes_later() -> None:
    """One replica of 32 tokens (blocks of one token: the simulator's model), two requests of 10
    prompt and 20 output tokens.
    Both start (20 ≤ 32) and grow by 2 a step; at step 7 the running KV is 34 > 32, so the newer
    one, b, is preempted (KV 17: prompt 10 + age 7) and waits at the head of the queue while a
    runs alone (17 + 18 > 32). When a finishes b is admitted again and recomputes its 17 tokens in
    that step, which lasts p·17 longer."""
    p = 1e-3
    cluster = EmulatedCluster(EmulatorConfig(num_replicas=1, slots=64, num_prefill=0, step_model=STEP,
                                             kv_capacity_tokens=32, block_size=1, recompute_s_per_token=p))
    a, b = _request(0, 10, 20, 0), _request(1, 10, 20, 0)
    cluster.submit(a)
    cluster.submit(b)
    loads, taus = [], []
    while (ran := cluster.step()) is not None:
        loads.append(int(ran[0][0]))
        taus.append(ran[1])
    assert loads[:8] == [20, 22, 24, 26, 28, 30, 32, 17]  # step 7: b preempted, a alone at 17
    assert cluster.counts["preempted"] == 1 and cluster.replicas[0].preempted == 1
    assert a.age == b.age == 20 and a.done and b.done and not b.recompute
    # a ran steps 0–19 (alone from step 7: loads 17, 18, …, 29); b comes back at step 20 with 17
    assert loads[7:20] == list(range(17, 30))
    assert loads[20] == 17 and cluster.counts["recomputed_tokens"] == 17
    assert taus[20] == pytest.approx(STEP.b + STEP.a * 17 + STEP.c * 1 + p * 17)
    assert taus[21] == pytest.approx(STEP.b + STEP.a * 18 + STEP.c * 1)
    assert len(loads) == 20 + 13  # b's remaining 13 tokens
    assert cluster.counts["admitted"] == 2  # a preempted request is not admitted twice


def test_a_request_larger_than_the_budget_runs_alone() -> None:
    """vLLM's rule as the engine has it: a replica with nothing running admits its head request
    whatever its size, and never preempts a lone request."""
    cluster = EmulatedCluster(EmulatorConfig(num_replicas=1, slots=64, num_prefill=0, step_model=STEP,
                                             kv_capacity_tokens=16, block_size=1))
    big, small = _request(0, 40, 3, 0), _request(1, 2, 2, 0)
    cluster.submit(big)
    cluster.submit(small)
    loads = []
    while (ran := cluster.step()) is not None:
        loads.append(int(ran[0][0]))
    assert loads == [40, 41, 42, 2, 3]
    assert cluster.counts["preempted"] == 0


def test_kv_is_allocated_in_whole_blocks_per_request() -> None:
    """vLLM's allocation: each request holds whole blocks. Two 20-token prompts in 48 tokens
    (three blocks of 16) do not fit together — two blocks each — where a token count (40 ≤ 48)
    says they do; the second starts once the first has left. With 12 tokens each (one block) two
    fit; at 17 tokens (age 5) each needs a second block: four blocks, so the newer is preempted."""
    def run(prompt: int, output: int) -> tuple[list[int], EmulatedCluster]:
        cluster = EmulatedCluster(EmulatorConfig(num_replicas=1, slots=64, num_prefill=0, step_model=STEP,
                                                 kv_capacity_tokens=48, block_size=16))
        cluster.submit(_request(0, prompt, output, 0))
        cluster.submit(_request(1, prompt, output, 0))
        running = []  # per step, the requests it runs
        while (begun := cluster.begin_step()) is not None:
            running.append(len(cluster.replicas[0].running))
            cluster.end_step(begun[2])
        return running, cluster

    running, cluster = run(20, 4)
    assert running == [1] * 8 and cluster.counts["preempted"] == 0
    running, cluster = run(12, 8)
    assert running[:5] == [2] * 5 and running[5] == 1  # step 5: 17 tokens each, four blocks
    assert cluster.counts["preempted"] == 1 and cluster.counts["recomputed_tokens"] == 17


@settings(max_examples=150, deadline=None)
@given(g_count=st.integers(1, 3), blocks=st.integers(2, 12),
       requests=st.lists(st.tuples(st.integers(1, 120), st.integers(1, 40), st.integers(0, 2),
                                   st.integers(0, 25)), min_size=1, max_size=14),
       recompute=st.sampled_from([0.0, 5e-5, 2e-3]))
def test_the_emulator_schedules_as_the_simulators_engine(g_count, blocks, requests, recompute) -> None:
    """The same requests routed at the same steps to the same replicas: every step's running
    loads and τ, who finishes when, the preemptions and the recomputed tokens are the engine's
    (``ReplicaEngine``, the simulator's reference, itself held to the compiled engine)."""
    requests = [(s, o, g % g_count, k) for s, o, g, k in requests]
    budget = 16 * blocks
    prompt = np.array([s for s, _, _, _ in requests], dtype=np.int64)
    output = np.array([o for _, o, _, _ in requests], dtype=np.int64)
    engine = ReplicaEngine(prompt, output, g_count, np.full(g_count, budget, dtype=np.int64),
                           (STEP,) * g_count, recompute_s_per_token=recompute)
    cluster = EmulatedCluster(EmulatorConfig(num_replicas=g_count, slots=1000, num_prefill=0, step_model=STEP,
                                             kv_capacity_tokens=budget, block_size=1,
                                             recompute_s_per_token=recompute))
    emulated = [_request(i, s, o, g) for i, (s, o, g, _) in enumerate(requests)]
    last = max(k for *_, k in requests)
    k = 0
    while True:
        now = [i for i, r in enumerate(requests) if r[3] == k]
        if now:
            engine.route(np.array(now, dtype=np.int64), np.array([requests[i][2] for i in now], dtype=np.int64))
            for i in now:
                cluster.submit(emulated[i])
        ran = cluster.step()
        if ran is None:  # nothing routed and unfinished: the engine holds nothing either
            assert not engine.is_running.any() and not any(engine.waiting)
            if k >= last:
                break
            k += 1
            continue
        ref = engine.step()
        loads, tau = ran
        assert (int(loads.max()), int(loads.sum())) == (ref.envelope, ref.total), k
        assert tau == pytest.approx(ref.tau, rel=1e-12, abs=1e-15), k
        finished = {i for i, r in enumerate(emulated) if r.done and r.age == r.output}
        assert finished == {i for i in range(len(requests)) if engine.replica[i] < 0 and engine.has_run[i]}, k
        assert cluster.counts["preempted"] == engine.preemptions, k
        assert cluster.counts["recomputed_tokens"] == engine.recomputed_tokens, k
        k += 1
    assert all(r.done for r in emulated)


@pytest.mark.parametrize("policy", ["br0", "least_load"])
def test_through_the_proxy_br0_never_fills_a_replica_past_its_budget(policy: str) -> None:
    """The proxy in front of emulated replicas whose KV binds (48 requests at once of 100–400
    prompt and 300–900 output tokens against budgets of 4,096 a replica): told the budgets,
    BR-0 bounds every output by its request's ``max_tokens`` and places a request only where the
    KV holds until every request there has ended — the emulator preempts nothing. Least-load,
    routing on slots as a token-blind baseline does, is preempted there; and so is BR-0 when the
    proxy does not give it the requests' cap (its 256-step window then misses outputs longer than
    the window: 20–22 preemptions a run, tried)."""
    g_count, budget, n = 4, 4096, 80
    rng = np.random.default_rng(5)
    workload = Workload(name="kv-bound", prompt_len=rng.integers(100, 400, n).astype(np.int64),
                        output_len=rng.integers(300, 900, n).astype(np.int64))
    with running_emulator(num_replicas=g_count, slots=16, num_prefill=2, time_scale=0.2,
                          kv_capacity_tokens=budget) as emu:
        mapping = emu.proxy_mapping("nixl")
        mapping.update(policy=policy, pool_capacity=256, health_interval_s=0,
                       decode=[{**d, "kv_budget": budget} for d in mapping["decode"]])
        with running_proxy(mapping) as (url, proxy, _):
            summary, _ = run_load_sync(workload, LoadgenConfig(url=url, concurrency=48, timeout_s=120))
            assert summary["ok"] == n, summary["error_kinds"]
            stats = emu.stats()
    preempted = stats["requests"]["preempted"]
    assert stats["requests"]["completed"] == n
    if policy == "br0":
        assert preempted == 0, stats["per_replica"]
    else:  # the budget binds: the same load preempts without the rule
        assert preempted > 0, stats["per_replica"]


def test_through_the_proxy_br0_keeps_room_for_the_engines_whole_blocks() -> None:
    """vLLM allocates whole blocks per request, so a replica holds up to ``block − 1`` tokens
    more per request than their KV. Budgets of 1,024 tokens (64 blocks of 16), 80 requests of
    50 prompt and 64 output tokens each (113 tokens at most: 8 blocks, 128 tokens): planned in
    tokens against the whole budget, nine fit where the blocks hold eight, and the emulator
    preempts (3–4 a run with ``kv_block_size = 1``, tried); against the budget less 15 tokens a
    slot (``kv_block_size`` 16, the default) it preempts nothing."""
    g_count, budget, n = 4, 1024, 80
    workload = Workload(name="blocks", prompt_len=np.full(n, 50, dtype=np.int64),
                        output_len=np.full(n, 64, dtype=np.int64))
    with running_emulator(num_replicas=g_count, slots=16, num_prefill=2, time_scale=0.2,
                          kv_capacity_tokens=budget, block_size=16) as emu:
        mapping = emu.proxy_mapping("nixl")
        mapping.update(policy="br0", pool_capacity=256, health_interval_s=0,
                       decode=[{**d, "kv_budget": budget} for d in mapping["decode"]])
        with running_proxy(mapping) as (url, proxy, _):
            summary, _ = run_load_sync(workload, LoadgenConfig(url=url, concurrency=48, timeout_s=120))
            assert summary["ok"] == n, summary["error_kinds"]
            assert proxy.signals.replica_status(0)["kv_budget_planned"] == budget - 16 * 15
            stats = emu.stats()
    assert stats["requests"]["completed"] == n
    assert stats["requests"]["preempted"] == 0, stats["per_replica"]
