"""Aggregations of the reproduction's tidy CSV rows, shared by the figures and the report.

Everything here takes rows as read back from the CSVs (:func:`~.sweep.read_csv`) and returns
plain dicts. Throughput gains use the loaded-phase throughput (tokens generated / time, over the
steps up to the last assignment), the analogue of a saturated measurement window; the
simulator's all-steps throughput also counts the drain of the last requests, which is the same
for every policy and dilutes the differences.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from balanceroute.core.policies import BASELINES  # the policies "best baseline" ranges over

__all__ = [
    "BASELINES",
    "THROUGHPUT",
    "add_gains",
    "gap_summary",
    "mean_sd",
    "policy_summary",
    "ratio_summary",
    "sigma_estimate",
    "step_model_summary",
    "tick_summary",
]


THROUGHPUT = "throughput_loaded_tok_s"
"""The throughput column gains are computed from."""


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def mean_sd(values: Iterable[Any]) -> tuple[float, float, int]:
    """(mean, sample standard deviation (0 for one value), count) of the finite values."""
    arr = np.array([_num(v) for v in values], dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return math.nan, math.nan, 0
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0, int(arr.size)


def add_gains(rows: Sequence[dict], by: Sequence[str], metric: str = THROUGHPUT) -> list[dict]:
    """Copies of ``rows`` with, within each group of equal ``by`` fields, ``best_baseline``,
    ``gain_vs_best_baseline_pct`` = 100·(x / max over baselines − 1), ``gain_vs_jsq_pct`` and
    ``imbalance_vs_jsq`` = I_jsq / I (how many times less imbalance than JSQ)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[tuple(row.get(k) for k in by)].append(dict(row))
    out: list[dict] = []
    for members in groups.values():
        base = [(_num(r[metric]), r["policy"]) for r in members if r["policy"] in BASELINES]
        best_x, best_name = max(base) if base else (math.nan, None)
        jsq = next((r for r in members if r["policy"] == "jsq"), None)
        for r in members:
            x = _num(r[metric])
            r["best_baseline"] = best_name
            r["gain_vs_best_baseline_pct"] = 100.0 * (x / best_x - 1.0) if best_x else math.nan
            if jsq is not None:
                r["gain_vs_jsq_pct"] = 100.0 * (x / _num(jsq[metric]) - 1.0)
                imb = _num(r["mean_imbalance"])
                r["imbalance_vs_jsq"] = _num(jsq["mean_imbalance"]) / imb if imb > 0 else math.inf
            else:
                r["gain_vs_jsq_pct"] = r["imbalance_vs_jsq"] = math.nan
            out.append(r)
    return out


_SUMMARY_METRICS = (
    "mean_imbalance", "tpot_ms_p95", THROUGHPUT, "throughput_tok_s", "gain_vs_best_baseline_pct",
    "gain_vs_jsq_pct", "imbalance_vs_jsq", "barrier_idle_fraction", "load_std_mean",
    "load_gap_mean", "envelope_mean", "mean_step_ms", "test_requests", "pool_wait_p99_s",
    "pool_wait_mean_s", "ttft_s_p99",
)


def policy_summary(rows: Sequence[dict], by: Sequence[str]) -> list[dict]:
    """Mean and sd over seeds of each metric, per ``by`` + policy (gains added per seed
    first, within ``by`` + seed). Keys: ``<metric>`` (mean), ``<metric>_sd``, ``seeds``;
    ``best_baseline`` is the most frequent one (ties: the one of the lowest seed)."""
    gained = add_gains(rows, by=(*by, "seed"))
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in gained:
        groups[(*(r.get(k) for k in by), r["policy"])].append(r)
    out = []
    for key, members in groups.items():
        rec: dict[str, Any] = dict(zip((*by, "policy"), key, strict=False))
        for m in _SUMMARY_METRICS:
            mean, sd, _ = mean_sd(r.get(m) for r in members)
            rec[m], rec[f"{m}_sd"] = mean, sd
        names = [r["best_baseline"] for r in members if r.get("best_baseline")]
        # the most frequent; a tie goes to the one met first (the lowest seed), not to a set's
        # order, which changes with the interpreter's string hashing from run to run
        rec["best_baseline"] = Counter(names).most_common(1)[0][0] if names else None
        rec["seeds"] = len(members)
        out.append(rec)
    return out


def sigma_estimate(rows: Sequence[dict], *, workload: str, policy: str = "random",
                   fit_replicas: Sequence[int] = (4, 8)) -> float:
    """σ̂_L: the mean cross-replica standard deviation of the loads (``load_std_mean``) of
    ``policy`` at the small G in ``fit_replicas`` — the only input of the independent-loads
    prediction E[I] = G·σ·e_G."""
    vals = [_num(r["load_std_mean"]) for r in rows
            if r["workload"] == workload and r["policy"] == policy and r["replicas"] in fit_replicas]
    return mean_sd(vals)[0]


def step_model_summary(rows: Sequence[dict]) -> list[dict]:
    """Per step model (a, b) and policy: throughput gain over the best baseline and over JSQ,
    the load-dependent share φ = a·M̄/(b + a·M̄) of the best baseline's mean step, and
    the gain predicted from the default-model run's envelopes (``theory.step_time_gain``)."""
    from .theory import step_time_gain

    gained = add_gains(rows, by=("workload", "step_a", "step_b", "seed"))
    ref = [r for r in gained if _num(r.get("a_over_b_rel")) == 1.0]
    out = []
    for r in gained:
        a, b = _num(r["step_a"]), _num(r["step_b"])
        best = next((x for x in gained if x["policy"] == r["best_baseline"]
                     and x["step_a"] == r["step_a"] and x["step_b"] == r["step_b"]
                     and x["workload"] == r["workload"]), None)
        env_best = _num(best["envelope_mean"]) if best else math.nan
        share = a * env_best / (b + a * env_best) if best else math.nan
        pred = math.nan
        me = next((x for x in ref if x["policy"] == r["policy"] and x["workload"] == r["workload"]), None)
        if me is not None and ref:
            base = [x for x in ref if x["policy"] in BASELINES and x["workload"] == r["workload"]]
            # predicted best baseline under (a, b): the baseline with the smallest mean step
            cands = [step_time_gain(_num(x["envelope_mean"]), _num(me["envelope_mean"]), a=a, b=b,
                                    tokens_ratio=_num(me["active_mean"]) / _num(x["active_mean"]))
                     for x in base]
            pred = 100.0 * min(cands) if cands else math.nan
        out.append({"workload": r["workload"], "policy": r["policy"], "step_a": a, "step_b": b,
                    "a_over_b_rel": _num(r.get("a_over_b_rel")),
                    "load_share": share, "gain_vs_best_baseline_pct": r["gain_vs_best_baseline_pct"],
                    "gain_vs_jsq_pct": r["gain_vs_jsq_pct"], "predicted_gain_pct": pred,
                    "best_baseline": r["best_baseline"], "mean_step_ms": _num(r["mean_step_ms"])})
    return out


def tick_summary(rows: Sequence[dict]) -> list[dict]:
    """The tick-timing rows as they are (one per policy × G × pool × measure × regime), with
    milliseconds added."""
    out = []
    for r in rows:
        rec = dict(r)
        rec["p50_ms"] = _num(r["p50_us"]) / 1e3
        rec["p99_ms"] = _num(r["p99_us"]) / 1e3
        out.append(rec)
    return out


def gap_summary(rows: Sequence[dict], by: Sequence[str]) -> list[dict]:
    """Per ``by`` + policy: instances, how many references are proven optima, mean / median /
    P95 / worst relative gap and the share of instances where the policy matched the reference
    (|gap| ≤ 1e-9)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(*(r.get(k) for k in by), r["policy"])].append(r)
    out = []
    for key, members in groups.items():
        gaps = np.array([_num(r["rel_gap"]) for r in members])
        ok = gaps[np.isfinite(gaps)]
        rec: dict[str, Any] = dict(zip((*by, "policy"), key, strict=False))
        rec.update({
            "instances": len(members),
            "proven": sum(r.get("reference") == "optimum" for r in members),
            "mean_rel_gap": float(ok.mean()) if ok.size else math.nan,
            "median_rel_gap": float(np.median(ok)) if ok.size else math.nan,
            "p95_rel_gap": float(np.percentile(ok, 95)) if ok.size else math.nan,
            "worst_rel_gap": float(ok.max()) if ok.size else math.nan,
            "share_matched": float((np.abs(ok) <= 1e-9).mean()) if ok.size else math.nan,
            "mean_capacity_gap": mean_sd(r.get("capacity_gap") for r in members)[0],
            "placed_mean": mean_sd(r.get("placed") for r in members)[0],
        })
        out.append(rec)
    return out


def ratio_summary(rows: Sequence[dict]) -> list[dict]:
    """Per G and policy: mean and worst online/clairvoyant ratio of Σ_k M(k), instances, proven,
    next to 2 − 1/G."""
    from .theory import online_temporary_tasks_bound

    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["replicas"], r["policy"])].append(r)
    out = []
    for (g, policy), members in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        ratios = np.array([_num(r["ratio"]) for r in members])
        ok = ratios[np.isfinite(ratios)]
        out.append({"replicas": g, "policy": policy, "instances": len(members),
                    "proven": sum(r.get("reference") == "optimum" for r in members),
                    "mean_ratio": float(ok.mean()) if ok.size else math.nan,
                    "worst_ratio": float(ok.max()) if ok.size else math.nan,
                    "bound": float(online_temporary_tasks_bound(int(g)))})
    return out
