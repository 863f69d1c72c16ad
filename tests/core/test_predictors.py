"""Termination predictors: known answers, brute force, the shared contract, calibration metrics."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.core.predictors import (
    PREDICTORS,
    EmpiricalSurvival,
    ExactMatch,
    NoisePredictor,
    Oracle,
    RequestFeatures,
    auc,
    brier_score,
    evaluate_predictor,
    expected_calibration_error,
    fit_predictor,
    split_workload,
    training_tuples,
)
from balanceroute.core.workloads.base import Workload
from tests.factories import lognormal_workload


def _workload(output, prompt=None, prefix_hash=None, client=None):
    output = np.asarray(output, dtype=np.int64)
    return Workload(
        name="t",
        prompt_len=np.full(output.shape[0], 10, np.int64) if prompt is None else np.asarray(prompt, np.int64),
        output_len=output,
        prefix_hash=None if prefix_hash is None else np.asarray(prefix_hash, np.int64),
        client=None if client is None else np.asarray(client, np.int64),
    )


def _feats(n, **cols):
    return RequestFeatures(prompt_len=np.full(n, 10, np.int64), **{k: np.asarray(v, np.int64) for k, v in cols.items()})


# --- calibration metrics on known answers -------------------------------------------------


def test_auc_known_answers():
    # positives score 0.35, 0.8; negatives 0.1, 0.4: pairs (0.35>0.1, 0.35<0.4, 0.8>both) = 3/4
    assert auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    assert auc([0, 1], [0.2, 0.9]) == 1.0
    assert auc([1, 0], [0.2, 0.9]) == 0.0
    assert auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5  # ties count one half
    # one tie between a positive and a negative: (1 + 1 + 0.5 + 1) / 4
    assert auc([0, 0, 1, 1], [0.1, 0.6, 0.6, 0.9]) == pytest.approx(0.875)
    assert np.isnan(auc([1, 1], [0.1, 0.2]))


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), min_size=2, max_size=30))
def test_auc_equals_pair_counting(pairs):
    y = np.array([p for p, _ in pairs])
    s = np.array([v for _, v in pairs], dtype=float)
    pos, neg = s[y], s[~y]
    if pos.size == 0 or neg.size == 0:
        assert np.isnan(auc(y, s))
        return
    brute = np.mean((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :]))
    assert auc(y, s) == pytest.approx(brute)


def test_brier_and_ece_known_answers():
    assert brier_score([1, 0], [1.0, 0.0]) == 0.0
    assert brier_score([1, 0], [0.5, 0.5]) == 0.25
    assert brier_score([1, 0, 0], [0.8, 0.2, 0.5]) == pytest.approx((0.04 + 0.04 + 0.25) / 3)
    # perfectly calibrated bins: p = 0.25 on four rows with one positive
    assert expected_calibration_error([1, 0, 0, 0], [0.25] * 4) == pytest.approx(0.0)
    # bins: [0.1, 0.1] with labels (0, 1) → |0.5 − 0.1| · 2/4; [0.9, 0.95] with (1, 1) → |1 − 0.925| · 2/4
    ece = expected_calibration_error([0, 1, 1, 1], [0.1, 0.1, 0.9, 0.95])
    assert ece == pytest.approx(0.5 * 0.4 + 0.5 * 0.075)
    # p = 1 lands in the last bin, not out of range
    assert expected_calibration_error([1], [1.0]) == 0.0
    with pytest.raises(ValueError, match="bins"):
        expected_calibration_error([1], [0.5], bins=0)


# --- the data discipline ------------------------------------------------------------------


def test_split_workload_is_in_trace_order():
    w = _workload(np.arange(1, 11))
    train, test = split_workload(w, 0.3)
    assert train.output_len.tolist() == [1, 2, 3]
    assert test.output_len.tolist() == list(range(4, 11))
    assert split_workload(w, 0.01)[0].output_len.tolist() == [1]  # never empty
    assert split_workload(w, 0.99)[1].output_len.tolist() == [10]
    with pytest.raises(ValueError, match="train_fraction"):
        split_workload(w, 1.0)
    with pytest.raises(ValueError, match="split"):
        split_workload(_workload([3]), 0.5)


def test_training_tuples_sample_every_half_horizon():
    t = training_tuples(_workload([1, 9, 20]), horizon=8)  # ΔT = 4
    assert t.row.tolist() == [0, 1, 1, 1, 2, 2, 2, 2, 2]
    assert t.age.tolist() == [0, 0, 4, 8, 0, 4, 8, 12, 16]
    assert t.remaining.tolist() == [1, 9, 5, 1, 20, 16, 12, 8, 4]
    assert t.finished.tolist() == [True, False, True, True, False, False, False, True, True]
    sub = training_tuples(_workload([100] * 10), horizon=8, max_tuples=7, rng=np.random.default_rng(1))
    assert len(sub) == 7 and np.all(np.diff(sub.row * 1000 + sub.age) > 0)


# --- each predictor -----------------------------------------------------------------------


def test_survival_known_answers():
    pred = EmpiricalSurvival.fit(_workload(np.arange(1, 11)))  # outputs 1..10
    p, mu = pred.predict(_feats(4), np.array([0, 5, 9, 10]), 3)
    # a=0: o ∈ {1,2,3} of 10 → 0.3, mean 2; a=5: {6,7,8} of {6..10} → 0.6, mean 7 − 5 = 2
    # a=9: {10} of {10} → 1, remaining 1; a=10: nothing outlives it → p 0, mu H
    assert p.tolist() == pytest.approx([0.3, 0.6, 1.0, 0.0])
    assert mu.tolist() == pytest.approx([2.0, 2.0, 1.0, 3.0])


@settings(max_examples=60, deadline=None)
@given(
    outputs=st.lists(st.integers(1, 60), min_size=1, max_size=40),
    ages=st.lists(st.integers(0, 70), min_size=1, max_size=10),
    horizon=st.integers(1, 30),
)
def test_survival_equals_brute_force(outputs, ages, horizon):
    o = np.array(outputs)
    p, mu = EmpiricalSurvival.fit(_workload(o)).predict(_feats(len(ages)), np.array(ages), horizon)
    for a, pa, ma in zip(ages, p, mu, strict=True):
        alive = o[o > a]
        done = alive[alive <= a + horizon]
        assert pa == pytest.approx(done.size / alive.size if alive.size else 0.0)
        assert ma == pytest.approx(np.clip(done.mean() - a, 1, horizon) if done.size else horizon)


def test_exact_match_uses_the_memo_then_falls_back():
    train = _workload([5, 7, 100, 200, 300], prefix_hash=[11, 11, 22, 33, 44])
    pred = ExactMatch.fit(train)
    feats = _feats(4, prefix_hash=[11, 11, 99, 11])
    p, mu = pred.predict(feats, np.array([0, 5, 0, 7]), 10)
    # hash 11 saw {5, 7}: a=0 → both within 10 → p 1, mu 6; a=5 → {7} → p 1, mu 2
    assert p[:2].tolist() == [1.0, 1.0]
    assert mu[:2].tolist() == [6.0, 2.0]
    # unseen hash 99 and hash 11 at an age nothing in its memo outlived: the global ECDF
    p_s, mu_s = EmpiricalSurvival.fit(train).predict(_feats(2), np.array([0, 7]), 10)
    assert p[2:].tolist() == pytest.approx(p_s.tolist())
    assert mu[2:].tolist() == pytest.approx(mu_s.tolist())
    # no hash column anywhere: exactly survival
    bare = ExactMatch.fit(_workload([5, 7, 100]))
    np.testing.assert_allclose(
        bare.predict(_feats(2, prefix_hash=[1, 2]), np.array([0, 3]), 10),
        EmpiricalSurvival.fit(_workload([5, 7, 100])).predict(_feats(2), np.array([0, 3]), 10),
    )


def test_oracle_is_exact_and_needs_the_truth():
    p, mu = Oracle().predict(_feats(3, output_len=[10, 50, 4]), np.array([2, 2, 3]), 8)
    assert p.tolist() == [1.0, 0.0, 1.0]
    assert mu.tolist() == [8.0, 8.0, 1.0]  # r = 8, 48 (clipped), 1
    with pytest.raises(ValueError, match="true output"):
        Oracle().predict(_feats(1), np.array([0]), 8)


def test_noise_is_seeded_and_uninformative():
    a = NoisePredictor(seed=3).predict(_feats(1000), np.zeros(1000, np.int64), 40)
    b = NoisePredictor(seed=3).predict(_feats(1000), np.zeros(1000, np.int64), 40)
    np.testing.assert_array_equal(a[0], b[0])
    assert 0.45 < np.mean(a[0] >= 0.5) < 0.55
    assert a[1].min() >= 1 and a[1].max() <= 40


def test_registry_and_errors():
    with pytest.raises(ValueError, match="valid: oracle, survival"):
        fit_predictor("crystal_ball", _workload([1]), horizon=8)
    with pytest.raises(ValueError, match="horizon"):
        EmpiricalSurvival.fit(_workload([3])).predict(_feats(1), np.zeros(1, np.int64), 0)


CHEAP = [n for n in PREDICTORS if n != "learned"]


@pytest.mark.parametrize("name", CHEAP)
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 1000), horizon=st.integers(1, 200))
def test_every_predictor_keeps_the_contract(name, seed, horizon):
    rng = np.random.default_rng(seed)
    train = lognormal_workload(200, seed=seed, output_mu=4.0)
    w = lognormal_workload(50, seed=seed + 1, output_mu=4.0)
    ages = (rng.uniform(0, 1, 50) * w.output_len).astype(np.int64)  # running: a < o
    pred = fit_predictor(name, train, horizon=horizon, seed=seed)
    p, mu = pred.predict(RequestFeatures.from_workload(w), ages, horizon)
    assert p.shape == mu.shape == (50,)
    assert np.all((p >= 0) & (p <= 1)) and np.all((mu >= 1) & (mu <= horizon))


def test_held_out_calibration_ranks_the_predictors():
    train, test = split_workload(lognormal_workload(4000, seed=5, output_mu=5.0), 0.5)
    report = {n: evaluate_predictor(fit_predictor(n, train, horizon=40), test, 40) for n in CHEAP}
    assert report["oracle"]["auc"] == 1.0 and report["oracle"]["brier"] == 0.0
    assert report["oracle"]["ece"] == 0.0 and report["oracle"]["mae_mu_rem"] == 0.0
    assert 0.4 < report["noise"]["auc"] < 0.6 and report["noise"]["ece"] > 0.2
    # the ECDF is calibrated out of sample on an i.i.d. trace, and better than noise
    assert report["survival"]["ece"] < 0.03
    assert report["survival"]["brier"] < report["noise"]["brier"]
    assert report["exact_match"] == report["survival"]  # no prompt hashes here


def test_learned_predictor_trains_and_beats_noise():
    pytest.importorskip("torch", reason="the learned predictor needs the 'learned' extra (torch)")
    rng = np.random.default_rng(0)
    n = 2000
    client = rng.integers(0, 3, n)
    # client 0 writes short answers, clients 1 and 2 long ones: features carry real signal
    output = np.where(client == 0, rng.integers(5, 60, n), rng.integers(100, 400, n))
    w = _workload(output, prompt=rng.integers(10, 500, n), client=client)
    train, test = split_workload(w, 0.5)
    pred = fit_predictor("learned", train, horizon=40, seed=1, steps=200, batch=512)
    again = fit_predictor("learned", train, horizon=40, seed=1, steps=200, batch=512)
    feats = RequestFeatures.from_workload(test)
    ages = np.zeros(len(test), np.int64)
    np.testing.assert_array_equal(pred.predict(feats, ages, 40)[0], again.predict(feats, ages, 40)[0])
    learned = evaluate_predictor(pred, test, 40)
    survival = evaluate_predictor(fit_predictor("survival", train, horizon=40), test, 40)
    assert learned["auc"] > survival["auc"] + 0.1
    assert learned["brier"] < survival["brier"]
    with pytest.raises(ValueError, match="trained for H=40"):
        pred.predict(feats, ages, 80)


@pytest.mark.parametrize("compiled", [True, False])
def test_survival_table_lookup_equals_searchsorted(compiled, monkeypatch):
    # the O(1) count table must give exactly the searchsorted estimates, ages past the longest
    # output included, compiled (the fused look-up kernel) or in numpy
    from balanceroute.core.predictors import survival
    from balanceroute.core.predictors.survival import EmpiricalSurvival, survival_estimates

    monkeypatch.setattr(survival, "HAVE_NUMBA", compiled and survival.HAVE_NUMBA)
    rng = np.random.default_rng(4)
    out = rng.integers(1, 3000, size=500)
    model = EmpiricalSurvival.from_lengths(out)
    ages = np.concatenate([rng.integers(0, 3500, size=300), [0, 2999, 3000, 10_000]])
    for horizon in (1, 80, 160):
        p, mu = model.predict(None, ages, horizon)
        p2, mu2, _ = survival_estimates(model.sorted_out, model.prefix, 0, len(out), ages, horizon)
        np.testing.assert_array_equal(p, p2)
        np.testing.assert_array_equal(mu, mu2)


def test_online_survival_is_the_ecdf_of_what_it_observed():
    from balanceroute.core.predictors import OnlineSurvival

    online = OnlineSurvival(window=5, min_samples=3, refit_every=2)
    feats, ages = _feats(3), np.array([0, 4, 9])
    # not ready: no departure within the window (BR-H then ticks as without a predictor)
    online.observe(5)
    online.observe(10)
    assert not online.ready and online.samples == 2 and np.isnan(online.spread)
    p_fin, mu_rem = online.predict(feats, ages, 4)
    np.testing.assert_array_equal(p_fin, 0.0)
    np.testing.assert_array_equal(mu_rem, 4.0)
    online.observe(20)  # the third: fitted on [5, 10, 20]
    assert online.ready and online.spread == pytest.approx(np.std([5, 10, 20]) / np.mean([5, 10, 20]))
    want = EmpiricalSurvival.from_lengths(np.array([5, 10, 20])).predict(feats, ages, 4)
    np.testing.assert_array_equal(online.predict(feats, ages, 4)[0], want[0])
    online.observe(7)  # one new length: the fit waits for refit_every = 2
    np.testing.assert_array_equal(online.predict(feats, ages, 4)[0], want[0])
    online.observe(8)  # the second: refit on all five
    assert online.fitted.sorted_out.tolist() == [5, 7, 8, 10, 20]
    online.observe(9)  # the window keeps the last five: 9 replaces 5 (no refit yet)
    online.observe(11)  # 11 replaces 10, refit
    assert online.samples == 5 and online.fitted.sorted_out.tolist() == [7, 8, 9, 11, 20]
    online.observe(12)  # replaces 20: pending
    assert online.fitted.sorted_out.tolist() == [7, 8, 9, 11, 20]
    online.observe(13)  # replaces 7, refit
    assert online.fitted.sorted_out.tolist() == [8, 9, 11, 12, 13]
    for bad in (dict(window=0), dict(min_samples=0), dict(refit_every=1.5),
                dict(window=2, min_samples=3)):
        with pytest.raises(ValueError):
            OnlineSurvival(**bad)
    with pytest.raises(ValueError, match="output_len"):
        online.observe(-1)
