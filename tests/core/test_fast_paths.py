"""The compiled paths change nothing but speed: the fused simulation loop equals the generic one,
the tick kernel equals the numpy path and the literal reference, the projection kernels equal
their numpy expressions, the naive per-request simulator agrees, and the proxy's tick runs the
same kernel."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.core import fused, projection, simulator, two_stage
from balanceroute.core._tick_kernels import (
    _fill_proposals,
    _guard_scale,
    _largest_contribution,
    _pick_k,
    _pool_setup,
)
from balanceroute.core.dynamics import StepModel
from balanceroute.core.policies import get_policy
from balanceroute.core.policies.br0 import BR0Policy
from balanceroute.core.policies.jsq import JSQPolicy
from balanceroute.core.simulator import SimConfig, simulate
from benchmarks.reference import naive_simulate, reference_tick
from tests.factories import ledger_tick, lognormal_workload

FUSED = ("br0", "jsq", "least_load", "round_robin")
needs_numba = pytest.mark.skipif(not fused.HAVE_NUMBA, reason="numba is not installed")


def _assert_same(a, b):
    assert a.metrics == b.metrics
    for name in ("replica", "start_step", "finish_step", "ttft_s", "tpot_s", "pool_wait_s"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    if a.series is not None or b.series is not None:
        assert a.series.keys() == b.series.keys()
        for key in a.series:
            np.testing.assert_array_equal(a.series[key], b.series[key], err_msg=key)


# --- fused loop == generic loop ------------------------------------------------------------

CASES = [
    dict(num_replicas=4, slots=8),
    dict(num_replicas=3, slots=2, pool_size=20, record_series=True),
    dict(num_replicas=5, slots=4, mode="open_loop", rate_scale=4.0, prefill_delay_s=0.1,
         record_series=True),
    dict(num_replicas=2, slots=16, step_model=StepModel(b=0.01, a=1e-6, c=2e-3)),
    dict(num_replicas=1, slots=3, pool_size=1),
]


@needs_numba
@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_fused_loop_equals_generic_loop(name, case):
    w = lognormal_workload(700, seed=case, prompt_mu=5.0, output_mu=3.5, rate=30.0)
    cfg = SimConfig(**CASES[case])
    _assert_same(simulate(w, get_policy(name), cfg, engine="fused"),
                 simulate(w, get_policy(name), cfg, engine="generic"))


@needs_numba
@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(FUSED), seed=st.integers(0, 10_000), replicas=st.integers(1, 6),
       slots=st.integers(1, 6), pool=st.integers(1, 16), open_loop=st.booleans())
def test_fused_loop_equals_generic_loop_on_random_clusters(name, seed, replicas, slots, pool,
                                                           open_loop):
    w = lognormal_workload(120, seed=seed, prompt_mu=4.0, output_mu=2.5, rate=50.0)
    cfg = SimConfig(num_replicas=replicas, slots=slots, pool_size=pool, record_series=True,
                    mode="open_loop" if open_loop else "saturated")
    _assert_same(simulate(w, get_policy(name), cfg, engine="fused"),
                 simulate(w, get_policy(name), cfg, engine="generic"))


@needs_numba
def test_fused_br0_places_late_requests_first_like_the_generic_loop():
    # a deadline shorter than a step: Stage 0 (oldest first) runs in most ticks
    w = lognormal_workload(400, seed=3, output_mu=3.0, rate=200.0)
    cfg = SimConfig(num_replicas=3, slots=4, mode="open_loop")
    policy = dict(deadline_s=0.05, s_greedy=2, r_max=3)
    _assert_same(simulate(w, get_policy("br0", **policy), cfg, engine="fused"),
                 simulate(w, get_policy("br0", **policy), cfg, engine="generic"))


@needs_numba
@pytest.mark.parametrize("mode", ["saturated", "open_loop"])
@pytest.mark.parametrize("factor", [1.0, 3.0])
def test_fused_br0_keeps_the_relative_deadline_like_the_generic_loop(mode, factor):
    # the relative deadline (f·θ, θ = min(ttft_slo_s, 2·median wait)) fires in many ticks here:
    # the fused loop computes it in its own kernel, the generic loop in ``pool_deadline``
    w = lognormal_workload(600, seed=5, prompt_mu=6.0, output_mu=3.5, rate=80.0)
    cfg = SimConfig(num_replicas=4, slots=4, mode=mode, pool_size=24)
    policy = dict(deadline_factor=factor, ttft_slo_s=2.0)
    fused = simulate(w, get_policy("br0", **policy), cfg, engine="fused")
    _assert_same(fused, simulate(w, get_policy("br0", **policy), cfg, engine="generic"))
    if mode == "saturated":  # (open loop, this trace's pool stays small: the rule may not fire)
        off = simulate(w, get_policy("br0", ttft_slo_s=2.0, deadline_factor=None), cfg,
                       engine="fused")
        assert not np.array_equal(fused.replica, off.replica)  # the rule changed decisions here


@needs_numba
def test_round_robin_cursor_carries_over_like_the_generic_loop():
    w = lognormal_workload(50, seed=1, output_mu=2.0)
    cfg = SimConfig(num_replicas=3, slots=2)
    a, b = get_policy("round_robin"), get_policy("round_robin")
    for _ in range(2):  # the second run starts where the first left the cursor
        _assert_same(simulate(w, a, cfg, engine="fused"), simulate(w, b, cfg, engine="generic"))
        assert a.cursor == b.cursor


def test_engine_choice():
    w = lognormal_workload(30, seed=0, output_mu=2.0)
    cfg = SimConfig(num_replicas=2, slots=2)
    with pytest.raises(ValueError, match="no fused loop"):
        simulate(w, get_policy("power_of_two"), cfg, engine="fused")
    with pytest.raises(ValueError, match="engine"):
        simulate(w, get_policy("jsq"), cfg, engine="turbo")

    class Tweaked(JSQPolicy):  # a subclass may change the rule: it must take the generic path
        def choose(self, free, loads, active):
            return int(np.flatnonzero(free > 0)[-1])

    assert fused.compiled_tick(Tweaked(), 2) is None

    class Reassigned(BR0Policy):  # overriding assign drops the inherited compiled tick too
        def assign(self, state, pool):
            return BR0Policy.assign(self, state, pool)

    assert fused.compiled_tick(Reassigned(), 2) is None
    def wrapped(*args, **kwargs):  # an injected tick_fn decides instead of the kernel
        return two_stage.two_stage_assign(*args, **kwargs)

    assert fused.compiled_tick(BR0Policy(tick_fn=wrapped), 2) is None
    assert fused.compiled_tick(get_policy("power_of_two"), 2) is None
    for name in FUSED:  # each declares its tick; the engine recognises no class
        assert fused.compiled_tick(get_policy(name), 2) is not None or not fused.HAVE_NUMBA
    assert simulate(w, Tweaked(), cfg).replica.max() == 1


@needs_numba
def test_fused_loop_reports_progress_and_step_limit():
    w = lognormal_workload(200, seed=2, output_mu=3.0)
    seen: list[int] = []
    simulate(w, get_policy("br0"), SimConfig(num_replicas=2, slots=4), progress=seen.append)
    assert seen and seen[-1] == 200 and seen == sorted(seen)
    for engine in ("fused", "generic"):
        with pytest.raises(RuntimeError, match="exceeded 5 steps"):
            simulate(w, get_policy("br0"), SimConfig(num_replicas=2, slots=4, max_steps=5),
                     engine=engine)


def test_without_numba_the_numpy_paths_give_the_same_results(monkeypatch):
    w = lognormal_workload(300, seed=4, output_mu=3.0)
    cfg = SimConfig(num_replicas=3, slots=4, record_series=True)
    want = simulate(w, get_policy("br0"), cfg)
    monkeypatch.setattr(fused, "HAVE_NUMBA", False)
    monkeypatch.setattr(two_stage, "HAVE_NUMBA", False)
    monkeypatch.setattr(projection, "HAVE_NUMBA", False)
    monkeypatch.setattr(simulator, "HAVE_NUMBA", False)
    assert fused.compiled_tick(get_policy("br0"), 4) is None
    _assert_same(simulate(w, get_policy("br0"), cfg), want)


# --- the tick kernel == the numpy path == the reference ---------------------------------------

tick_instances = st.integers(1, 7).flatmap(
    lambda g: st.tuples(
        st.lists(st.integers(0, 30_000), min_size=g, max_size=g),
        st.lists(st.integers(0, 5), min_size=g, max_size=g),
        st.lists(st.tuples(st.integers(1, 6000), st.sampled_from([0.0, 0.5, 31.0, 45.0])),
                 max_size=20),
        st.integers(0, 10),
        st.integers(0, 6),  # r_max; 0 is the fill
        st.integers(0, 3),
    )
)


@needs_numba
@settings(max_examples=300, deadline=None)
@given(tick_instances, st.data())
def test_tick_kernel_equals_numpy_path_and_reference(instance, data):
    loads, free, pool, s_greedy, r_max, horizon = instance
    prompt = np.array([p for p, _ in pool], dtype=np.int64)
    wait = np.array([w for _, w in pool])
    width = horizon + 1
    # integer loads and power-of-two discounts: every operation is exact, so any summation
    # order gives the same scores and all three must decide identically
    steps = data.draw(st.lists(st.integers(-400, 400), min_size=len(loads) * width,
                               max_size=len(loads) * width))
    proj = np.array(loads, dtype=float)[:, None] + np.array(steps, dtype=float).reshape(-1, width) \
        * np.arange(width)
    dep = np.array(data.draw(st.lists(st.integers(1, width), min_size=len(pool), max_size=len(pool))),
                   dtype=np.int64)
    growth = projection.placement_growth(prompt, dep, horizon) if horizon else None
    # every tick option: the score, Stage 1's rule and growth window, the urgency term, the
    # fill's replica order
    options = data.draw(st.fixed_dictionaries({
        "score": st.sampled_from(["exact", "paper"]), "stage1": st.sampled_from(["fit", "paper"]),
        "growth_steps": st.sampled_from([0.0, 64.0]), "ttft_slo_s": st.sampled_from([None, 2.0]),
        "fill_order": st.sampled_from(["level", "margin"]), "lpt_batches": st.booleans(),
    }))
    kwargs = dict(d=0.5 ** np.arange(width), alpha=1.0, beta=float(2 * len(loads)),
                  s_greedy=s_greedy, r_max=r_max, deadline_s=30.0, **options)
    got = two_stage.two_stage_assign(proj, np.array(free), prompt, wait, growth=growth, **kwargs)
    alt = two_stage._two_stage_numpy(proj, np.array(free), prompt, wait, growth=growth, **kwargs)
    want = reference_tick(proj.tolist(), free, prompt.tolist(), wait.tolist(),
                          growth=None if growth is None else growth.tolist(),
                          **{**kwargs, "d": kwargs["d"].tolist()})
    pairs = list(zip(got.pool_index.tolist(), got.replica.tolist()))
    assert pairs == want
    assert pairs == list(zip(alt.pool_index.tolist(), alt.replica.tolist()))


@needs_numba
def test_tick_kernel_handles_odd_arguments_like_the_numpy_path():
    loads, free = np.array([[5.0], [9.0]]), np.array([3, 2])
    prompt, wait = np.array([4, 4, 4, 1]), np.zeros(4)
    for s_greedy, r_max in itertools.product((-1, 1 << 40), (4, 0)):  # Stage 1 / 2 only
        kwargs = dict(d=np.ones(1), alpha=1.0, beta=2.0, s_greedy=s_greedy, r_max=r_max,
                      deadline_s=30.0)
        a = two_stage.two_stage_assign(loads, free, prompt, wait, **kwargs)
        b = two_stage._two_stage_numpy(loads, free, prompt, wait, **kwargs)
        assert a.pool_index.tolist() == b.pool_index.tolist()
        assert a.replica.tolist() == b.replica.tolist()
    empty = two_stage.two_stage_assign(loads, free, np.zeros(0, np.int64), np.zeros(0), **kwargs)
    assert len(empty) == 0
    with pytest.raises(ValueError, match="r_max"):
        two_stage.two_stage_assign(loads, free, prompt, wait, **{**kwargs, "r_max": -1})


@needs_numba
@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 40), cap=st.integers(1, 8), hi_q=st.integers(1, 4096))
def test_fill_kernel_proposals_equal_the_python_programme(data, n, cap, hi_q):
    # the kernel's subset-sum programme (bitset words + first-reached items) and the Python-int
    # one rebuild the same sets, on sums spanning up to 65 words and on many equal sizes (ties)
    qsize = data.draw(st.lists(st.integers(1, hi_q) | st.sampled_from([1, 63, 64, 65]),
                               min_size=n, max_size=n))
    qsize = [min(s, hi_q) for s in qsize]
    cap = min(cap, n)
    k_lo = data.draw(st.integers(1, cap))
    safe_q = data.draw(st.integers(0, hi_q))
    prop = np.empty((2 * cap, cap), dtype=np.int64)
    prop_len = np.empty(2 * cap, dtype=np.int64)
    count = _fill_proposals(np.arange(n, dtype=np.int64), np.array(qsize, dtype=np.int64), n,
                            k_lo, cap, safe_q, hi_q, prop, prop_len)
    got = [prop[p, : prop_len[p]].tolist() for p in range(count)]
    assert got == two_stage.fill_proposals(qsize, k_lo, cap, safe_q, hi_q)


# --- the best-first pool search == the pool scan --------------------------------------------
# With a horizon the kernel visits the pool in the order of each request's no-overflow bound and
# stops at the first bound below the best score; the scan scores every request. Same inputs,
# float margins and discounts (inexact arithmetic), many equal requests (ties), dead requests.

search_states = st.fixed_dictionaries({
    "replicas": st.integers(1, 4),
    "width": st.integers(2, 10),
    "n": st.integers(1, 40),
    "gamma": st.sampled_from([0.86, 0.5, 1.0]),
    "alpha": st.sampled_from([1.0, 0.7]),
    "beta": st.sampled_from([0.0, 3.0, 16.0]),
    "exact": st.booleans(),
    "slo": st.sampled_from([np.inf, 2.0]),
    "generic_growth": st.booleans(),  # any growth, not only (s + h)·[h < r] − s
})


@needs_numba
@settings(max_examples=250, deadline=None)
@given(search_states, st.data())
def test_best_first_search_picks_what_the_pool_scan_picks(case, data):
    g_count, width, n = case["replicas"], case["width"], case["n"]
    def ints(lo, hi, size):
        return np.array(data.draw(st.lists(st.integers(lo, hi), min_size=size, max_size=size)),
                        dtype=np.int64)

    sizes = np.array(data.draw(st.lists(st.sampled_from([1, 7, 50, 300, 2000]) | st.integers(1, 3000),
                                        min_size=n, max_size=n)), dtype=np.float64)
    if case["generic_growth"]:
        growth = ints(-50, 400, n * width).reshape(n, width).astype(np.float64)
    else:
        growth = projection.placement_growth(sizes.astype(np.int64), ints(1, width, n), width - 1)
    wait = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=n, max_size=n)))
    loads = (ints(0, 3000, g_count * width) + 0.1 * ints(0, 9, g_count * width)).reshape(g_count, width)
    d = case["gamma"] ** np.arange(width)
    d[ints(0, width - 1, data.draw(st.integers(0, 2)))] = 0.0  # zero weights: overflow counts 0
    alpha, beta, exact = case["alpha"], case["beta"], case["exact"]
    ad = alpha * _sequential_sum(d)  # α·Σ d, summed as the kernel sums it
    env = loads.max(axis=0)
    lin, bonus, ub_buf, cmax, spare = np.empty(n), np.empty(n), np.empty(n), np.empty(width), np.empty(n)
    order, count = np.empty((2, n), dtype=np.int64), np.empty(2, dtype=np.int64)
    theta = _guard_scale(case["slo"], wait, spare)
    ub, prune = _pool_setup(sizes, growth, wait, d, alpha, ad, beta, exact, theta, lin, bonus,
                            ub_buf, cmax, order, count)
    assert prune
    _largest_contribution(sizes, growth, exact, cmax)
    tot, f1, marg = np.empty(n), np.empty(n), np.empty(width)
    for _ in range(3):  # the order's prefix persists across pops, as in a tick
        alive = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        if not alive.any():
            continue
        g = data.draw(st.integers(0, g_count - 1))
        args = (alive, sizes, growth, exact, lin, cmax, loads, env, g, d, alpha, ad, beta, bonus,
                tot, f1, marg)
        # k = 1 (the best single request: Stage 1, the fill) and any k (Stage 2's candidates):
        # the same requests and the same scores, bit for bit
        for k in (1, data.draw(st.integers(1, int(alive.sum())))):
            picked = []
            for prune_now in (True, False):
                cand, cand_f = np.empty(k, np.int64), np.empty(k)
                _pick_k(prune_now, k, order, count, ub, *args, cand, cand_f,
                        (np.ones(g_count), np.ones(g_count), np.zeros((g_count, 0)),
                         np.zeros((n, 0))))
                picked.append((cand.tolist(), cand_f.tolist()))
            assert picked[0] == picked[1]



@needs_numba
@pytest.mark.parametrize("s_greedy, r_max", [(-1, 0), (8, 1), (8, 2), (8, 0)])
def test_best_first_search_keeps_a_tie_with_a_request_of_smaller_bound(s_greedy, r_max):
    # replica 0's margins are (10, 10); request 1 (11 tokens) has the larger bound 22 but
    # overflows by 1 at both steps, F = 22 − 2 = 20; request 0 (10 tokens) fits, F = its bound 20.
    # The tie goes to the earlier request, which the search meets second: it must not stop at a
    # bound equal to the best score (Stage 1, the paper's Stage 2 with 1 and 2 candidates, fill)
    loads, free = np.array([[0.0, 0.0], [10.0, 10.0]]), np.array([1, 0])
    prompt, wait, growth = np.array([10, 11]), np.zeros(2), np.zeros((2, 2))
    kwargs = dict(d=np.ones(2), alpha=1.0, beta=1.0, s_greedy=s_greedy, r_max=r_max,
                  deadline_s=30.0, ttft_slo_s=None)
    got = two_stage.two_stage_assign(loads, free, prompt, wait, growth=growth, **kwargs)
    assert got.pool_index.tolist() == [0] and got.replica.tolist() == [0]
    want = reference_tick(loads.tolist(), free.tolist(), prompt.tolist(), wait.tolist(),
                          growth=growth.tolist(), **{**kwargs, "d": [1.0, 1.0]})
    assert want == [(0, 0)]

def _sequential_sum(values):
    total = 0.0
    for v in values.tolist():
        total += v
    return total


@needs_numba
@settings(max_examples=120, deadline=None)
@given(st.integers(1, 5), st.integers(1, 12), st.integers(0, 8), st.integers(0, 4), st.data())
def test_brh_tick_with_inexact_scores_equals_the_reference(g_count, horizon, s_greedy, r_max, data):
    # BR-H's shape (γ = 0.86, fractional loads, departures inside the window) on pools with many
    # equal requests: the kernel's best-first search decides as the literal reference's scan
    width = horizon + 1
    n = data.draw(st.integers(1, 36))
    prompt = np.array(data.draw(st.lists(st.sampled_from([3, 40, 700, 2500]) | st.integers(1, 4000),
                                         min_size=n, max_size=n)), dtype=np.int64)
    wait = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 31.0]), min_size=n, max_size=n)))
    dep = np.array(data.draw(st.lists(st.integers(1, width), min_size=n, max_size=n)), dtype=np.int64)
    free = np.array(data.draw(st.lists(st.integers(0, 4), min_size=g_count, max_size=g_count)))
    base = np.array(data.draw(st.lists(st.integers(0, 20_000), min_size=g_count, max_size=g_count)))
    slope = np.array(data.draw(st.lists(st.integers(-300, 300), min_size=g_count, max_size=g_count)))
    proj = (base[:, None] + slope[:, None] * np.arange(width)) * 1.1 + 0.3
    growth = projection.placement_growth(prompt, dep, horizon)
    options = data.draw(st.fixed_dictionaries({
        "score": st.sampled_from(["exact", "paper"]), "ttft_slo_s": st.sampled_from([None, 4.0]),
        "beta": st.sampled_from([2.0 * g_count, 0.5]),
    }))
    kwargs = dict(d=0.86 ** np.arange(width), alpha=1.0, s_greedy=s_greedy, r_max=r_max,
                  deadline_s=30.0, growth_steps=float(64), **options)
    got = two_stage.two_stage_assign(proj, free, prompt, wait, growth=growth, **kwargs)
    want = reference_tick(proj.tolist(), free.tolist(), prompt.tolist(), wait.tolist(),
                          growth=growth.tolist(), **{**kwargs, "d": kwargs["d"].tolist()})
    assert list(zip(got.pool_index.tolist(), got.replica.tolist())) == want


# --- projection kernels == numpy expressions ------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(data=st.data(), replicas=st.integers(1, 6), n=st.integers(0, 40), horizon=st.integers(0, 30))
def test_projection_kernels_equal_the_numpy_expressions(data, replicas, n, horizon):
    rep = np.array(data.draw(st.lists(st.integers(0, replicas - 1), min_size=n, max_size=n)), np.int64)
    base = np.array(data.draw(st.lists(st.integers(1, 9000), min_size=n, max_size=n)), np.int64)
    dep = np.array(data.draw(st.lists(st.integers(1, horizon + 1), min_size=n, max_size=n)), np.int64)
    loads = np.bincount(rep, weights=base, minlength=replicas) + 7
    np.testing.assert_array_equal(projection.project_loads(loads, rep, base, dep, horizon),
                                  projection._project_loads_numpy(loads, rep, base, dep, horizon))
    np.testing.assert_array_equal(projection.placement_growth(base, dep, horizon),
                                  projection._placement_growth_numpy(base, dep, horizon))
    p = np.array(data.draw(st.lists(st.floats(0, 1) | st.just(float("nan")), min_size=n, max_size=n)))
    mu = np.array(data.draw(st.lists(st.floats(-5, 200), min_size=n, max_size=n)))
    if horizon:
        np.testing.assert_array_equal(projection.departure_steps(p, mu, horizon, gate=0.4),
                                      projection._departure_steps_numpy(p, mu, horizon, gate=0.4))


def test_projection_rejects_out_of_range_like_numpy():
    with pytest.raises(ValueError):
        projection.project_loads(np.zeros(2), np.array([0, 5]), np.array([1, 1]), np.array([1, 1]), 3)


# --- the naive per-request simulator agrees -------------------------------------------------


@pytest.mark.parametrize("name", ["br0", "jsq", "least_load", "round_robin", "power_of_two"])
@pytest.mark.parametrize("mode", ["saturated", "open_loop"])
def test_naive_reference_simulator_gives_the_same_results(name, mode):
    w = lognormal_workload(300, seed=5, prompt_mu=5.0, output_mu=3.0, rate=40.0)
    cfg = SimConfig(num_replicas=3, slots=4, mode=mode, step_model=StepModel(c=1e-3))
    got = simulate(w, get_policy(name, seed=1), cfg)
    want = naive_simulate(w, get_policy(name, seed=1), cfg)
    assert got.metrics == want["metrics"]
    for key in ("replica", "start_step", "finish_step", "ttft_s", "tpot_s", "pool_wait_s"):
        np.testing.assert_array_equal(getattr(got, key), want[key], err_msg=key)


# --- the proxy's tick is the same kernel ----------------------------------------------------


@needs_numba
def test_serving_ledger_tick_runs_the_compiled_kernel(monkeypatch):
    from balanceroute.serving.ledger import Ledger

    calls = []
    kernel = two_stage._two_stage_tick

    def counting(*args):
        calls.append(args[0].shape)
        return kernel(*args)

    monkeypatch.setattr(two_stage, "_two_stage_tick", counting)
    led = Ledger([2, 2, 2], pool_capacity=16)
    for i, s in enumerate((300, 40, 60, 500, 90)):
        led.enqueue(led.admit(f"r{i}"), s, now=0.0, lease_s=30.0)
    placed = ledger_tick(led, get_policy("br0"), now=0.5)
    assert len(placed) == 5 and calls == [(3, 1)]
