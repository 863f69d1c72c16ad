"""Replicas as they are: KV budgets and replicas of different speed, every policy.

Two experiments, one cell per (workload, scenario, policy, seed), judged over draws:

* ``replicas_budget`` — long-context workloads (azure-2024-long, mooncake-conv), saturated, G = 8,
  B = 64, every replica's KV budget a fraction (0.6 / 0.8 / 0.9) of BR-0's *unconstrained peak
  demand* on the same draw (max over steps and replicas of L_g(k) in a run without a budget).
  The engines queue and preempt as vLLM's do (:mod:`balanceroute.core.replica_engine`); every
  output stops at the longest output of the draw's training half (its ``max_tokens``), which
  the policies are told (``SimConfig.output_cap``): BR-0 and BR-H then plan until every request
  has ended (never a preemption), ``br0-window`` is BR-0 with the 256-step window instead. The
  table reports preemptions, imbalance, loaded throughput, TTFT, lease failures and the requests
  that cannot fit a replica even alone (s + o − 1 > B) per policy.
* ``replicas_speed`` — G = 8 with two replicas 1.5× slower (b, a, c all × 1.5) and with a ±30 %
  spread (each replica's factor uniform in [0.7, 1.3], drawn from the seed): step-time idle at
  the barrier, loaded throughput. ``br0-tokens`` is BR-0 with the coefficients hidden (the
  token-balanced tick of the barrier model).

Draws: held-out seeds (:data:`~analysis.quality.HELD_OUT_SEEDS`: 1000–1019, never used for a
choice; the BR-0 budget window was chosen on seeds 100–101), replays thinned per seed as in
``quality_seeds``; each cell simulates the draw's test half (:func:`analysis.quality._load`).
Judged per group with :func:`~analysis.quality.paired_interval` and
:func:`~analysis.quality.verdict`: BR's imbalance ≤ 0.5× the best baseline's (budgets), BR's
loaded throughput ≥ 1.05× ``br0-tokens`` and ≥ every baseline's (speed).
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import lru_cache
from typing import Any

import numpy as np

from .quality import GENERATED, HELD_OUT_SEEDS, REPLAY_THIN, _load, paired_interval, verdict
from .sweep import Cell

__all__ = ["BUDGET_FRACTIONS", "BUDGET_WORKLOADS", "SPEED_SCENARIOS", "declare_replicas",
           "replicas_lines", "replicas_section", "run_replicas_cell", "speed_models"]

BUDGET_WORKLOADS = ("azure-2024-long", "mooncake-conv")
BUDGET_FRACTIONS = (0.6, 0.8, 0.9)
SPEED_SCENARIOS = ("two-slow", "spread")
BASELINES = ("random", "round_robin", "power_of_two", "jsq", "least_load")
BR_ROWS = ("br0", "brh-survival", "br0-p90", "br0-window")
METRICS = ("preemptions", "recomputed_tokens", "mean_imbalance", "step_idle_fraction",
           "mean_step_idle_ms", "throughput_loaded_tok_s", "ttft_s_p50", "ttft_s_p99",
           "kv_lease_failed", "kv_lease_reprefilled", "replica_wait_mean_steps")
PLAN_QUANTILE = 0.9
"""``br0-p90`` plans as if every output stopped at this quantile of the training half's."""
BUDGET_METRICS = ("kv_utilization", "kv_oversize", "preemptions_oversize")


def declare_replicas(profile: str, available: list[str], *, code: str = "") -> dict[str, list[Cell]]:
    """The two experiments' cells (``quick``: one seed, small draws, fewer rows — the budget
    experiment ≈ 25 s of CPU)."""
    have = set(available) | {"br0-tokens", "br0-window", "br0-p90"}
    if profile == "quick":
        seeds, requests, fractions = HELD_OUT_SEEDS["quick"][:1], 800, (0.8,)
        policies = ("least_load", "br0")
        window = ()
        speed_workloads = ("azure-2024-long",)
    else:
        seeds, requests, fractions = HELD_OUT_SEEDS["full"], 3_000, BUDGET_FRACTIONS
        policies = (*BASELINES, "br0", "brh-survival")
        window = ("br0-p90", "br0-window")
        speed_workloads = ("azure-2024-long",)

    def rows_at(f: float) -> tuple[str, ...]:  # every row at 0.8; the peer rows elsewhere
        if f == 0.8 or profile == "quick":
            return (*policies, *window)
        return ("jsq", "least_load", "br0", *window)

    budget = [
        Cell(experiment="replicas_budget", kind="replicas", workload=w, policy=p, requests=requests,
             seed=s, code=code, options=(("budget", f), *(() if w in GENERATED else (("thin", REPLAY_THIN),))))
        for w in BUDGET_WORKLOADS for f in fractions for s in seeds for p in rows_at(f) if p in have
    ]
    speed = [
        Cell(experiment="replicas_speed", kind="replicas", workload=w, policy=p, requests=requests,
             seed=s, code=code, options=(("speed", sc),))
        for w in speed_workloads for sc in SPEED_SCENARIOS for s in seeds
        for p in (*policies, "br0-tokens") if p in have
    ]
    return {"replicas_budget": budget, "replicas_speed": speed}


def speed_models(scenario: str, seed: int, replicas: int = 8):
    """Per-replica step models of a speed scenario: ``two-slow`` (the last two replicas 1.5×
    slower) or ``spread`` (factors uniform in [0.7, 1.3] from ``seed``)."""
    from balanceroute.core.dynamics import StepModel

    base = StepModel()
    if scenario == "two-slow":
        factors = [1.0] * (replicas - 2) + [1.5, 1.5]
    elif scenario == "spread":
        factors = np.random.default_rng(seed).uniform(0.7, 1.3, replicas).tolist()
    else:
        raise ValueError(f"{scenario=} must be one of {SPEED_SCENARIOS}")
    return tuple(StepModel(b=base.b * f, a=base.a * f, c=base.c * f) for f in factors)


@lru_cache(maxsize=64)
def unconstrained_peak(workload: str, requests: int, seed: int, thin: float | None,
                       replicas: int, slots: int) -> int:
    """BR-0's peak demand without a budget: max over steps of max_g L_g(k) on the test half."""
    from balanceroute.core.policies import get_policy
    from balanceroute.core.simulator import SimConfig, simulate

    _, test = _load(workload, requests, seed, thin)
    r = simulate(test, get_policy("br0"), SimConfig(num_replicas=replicas, slots=slots,
                                                    record_series=True))
    return int(r.series["envelope"].max())


def _policy(name: str, train, test, seed: int):
    from balanceroute.catalogue import build_policy
    from balanceroute.core.policies.br0 import BR0Policy

    if name == "br0-tokens":
        return _TokenBR0()
    if name == "br0-window":  # the 256-step window even though the output cap is known
        return BR0Policy(kv_until_end=False, name="br0-window")
    if name == "br0-p90":  # plans as if outputs stopped at the training half's P90
        return BR0Policy(kv_plan_output=int(np.quantile(train.output_len, PLAN_QUANTILE)),
                         name="br0-p90")
    policy = build_policy(name, {}, train=train, test=test, seed=seed)
    assert name != "br0" or isinstance(policy, BR0Policy)
    return policy


class _TokenBR0:
    """BR-0 that is not told the replicas' speeds: the token-balanced tick of the barrier model."""

    name = "br0-tokens"

    def __init__(self) -> None:
        from balanceroute.core.policies.br0 import BR0Policy

        self.inner = BR0Policy()

    def assign(self, state, pool):
        """BR-0's tick on the state without its step coefficients."""
        state.step_a = state.step_b = state.step_c = None
        return self.inner.assign(state, pool)


def run_replicas_cell(cell: Cell) -> list[dict[str, Any]]:
    """One policy on one draw of a budget or speed scenario: its metrics (and the budget)."""
    from balanceroute.core.simulator import SimConfig, simulate

    thin = cell.option("thin", None)
    thin = None if thin is None else float(thin)
    train, test = _load(cell.workload, int(cell.requests or 3_000), cell.seed, thin)
    policy = _policy(cell.policy, train, test, cell.seed)
    extra: dict[str, Any] = {}
    if cell.option("budget", None) is not None:
        peak = unconstrained_peak(cell.workload, int(cell.requests or 3_000), cell.seed, thin,
                                  cell.replicas, cell.slots)
        budget = int(float(cell.option("budget")) * peak)
        cap = int(train.output_len.max())  # max_tokens: the longest output of the training half
        extra = {"peak_demand": peak, "kv_budget": budget, "output_cap": cap}
        config = SimConfig(num_replicas=cell.replicas, slots=cell.slots, kv_budget=budget,
                           output_cap=cap, check_assignments=False)
    else:
        config = SimConfig(num_replicas=cell.replicas, slots=cell.slots, check_assignments=False,
                           replica_steps=speed_models(str(cell.option("speed")), cell.seed,
                                                      cell.replicas))
    m = simulate(test, policy, config).metrics
    return [{**{k: m[k] for k in (*METRICS, *BUDGET_METRICS) if k in m}, **extra}]


# ------------------------------------------------------------------------------- judging


def _groups(rows: list[dict]) -> dict[tuple, dict[int, dict[str, dict]]]:
    out: dict[tuple, dict[int, dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        scen = r.get("budget") if r.get("budget") not in (None, "") else r.get("speed")
        out[(r["experiment"], r["workload"], str(scen))][int(r["seed"])][r["policy"]] = r
    return out


def _judge(ratios: list[float], bound: float) -> str:
    if not ratios:
        return "—"
    g, lo, hi = paired_interval([x / bound for x in ratios])
    if math.isnan(lo):
        return f"{g * bound:.3f} (1 draw)"
    return f"{g * bound:.3f} ({lo * bound:.3f}–{hi * bound:.3f}) {verdict(lo, hi)}"


def _ratio(ratios: list[float]) -> str:
    """A paired ratio's geometric mean and 95 % interval, no rule."""
    g, lo, hi = paired_interval(ratios)
    return f"{g:.3f} (1 draw)" if math.isnan(lo) else f"{g:.3f} ({lo:.3f}–{hi:.3f})"


def replicas_lines(rows: list[dict]) -> list[str]:
    """The tables of both experiments: per group the mean of every policy's metrics over the
    draws and the acceptance rules as paired ratios (geometric mean, 95 % interval, verdict)."""
    out: list[str] = []
    groups = _groups(rows)
    for exp in ("replicas_budget", "replicas_speed"):
        keys = sorted(k for k in groups if k[0] == exp)
        if not keys:
            continue
        if exp == "replicas_budget":
            out += ["", "KV budgets (fraction of BR-0's unconstrained peak demand), saturated, G = 8:",
                    "", "| workload | budget | policy | preemptions | imbalance | throughput tok/s "
                    "| TTFT P99 s | lease failed | oversize | draws |",
                    "|---|---|---|---|---|---|---|---|---|---|"]
        else:
            out += ["", "Replica speed, saturated, G = 8:", "",
                    "| workload | replicas | policy | step idle | throughput tok/s | TTFT P99 s "
                    "| draws |", "|---|---|---|---|---|---|---|"]
        rules: list[str] = []
        for key in keys:
            by_seed = groups[key]
            names = sorted({p for runs in by_seed.values() for p in runs},
                           key=lambda p: (p.startswith(("br", "brh")), p))
            for p in names:
                rs = [runs[p] for runs in by_seed.values() if p in runs]
                mean = {m: float(np.mean([float(r[m]) for r in rs])) for m in METRICS}
                if exp == "replicas_budget":
                    out.append(f"| {key[1]} | {float(key[2]):g} | {p} | {mean['preemptions']:.1f} "
                               f"| {mean['mean_imbalance']:,.0f} | {mean['throughput_loaded_tok_s']:,.0f} "
                               f"| {mean['ttft_s_p99']:.1f} | {mean['kv_lease_failed']:.1f} "
                               f"| {np.mean([float(r.get('kv_oversize') or 0) for r in rs]):.1f} "
                               f"| {len(rs)} |")
                else:
                    out.append(f"| {key[1]} | {key[2]} | {p} | {mean['step_idle_fraction']:.3f} "
                               f"| {mean['throughput_loaded_tok_s']:,.0f} | {mean['ttft_s_p99']:.1f} "
                               f"| {len(rs)} |")
            for br in BR_ROWS:
                runs = [r for r in by_seed.values() if br in r and any(b in r for b in BASELINES)]
                if not runs:
                    continue
                if exp == "replicas_budget":
                    imb = [float(r[br]["mean_imbalance"])
                           / min(float(r[b]["mean_imbalance"]) for b in BASELINES if b in r)
                           for r in runs]
                    pre = [float(r[br]["preemptions"]) for r in runs]
                    base_pre = [min(float(r[b]["preemptions"]) for b in BASELINES if b in r)
                                for r in runs]
                    thr = [float(r[br]["throughput_loaded_tok_s"])
                           / max(float(r[b]["throughput_loaded_tok_s"]) for b in BASELINES if b in r)
                           for r in runs]
                    rules.append(f"- {key[1]} at {float(key[2]):g}: {br} imbalance / best "
                                 f"baseline's {_judge(imb, 0.5)} (rule ≤ 0.5); preemptions "
                                 f"{sum(pre):.0f} over {len(runs)} draws ({sum(x == 0 for x in pre)} "
                                 f"draws with none; fewest of a baseline: {sum(base_pre):.0f}); "
                                 f"loaded throughput / best baseline's {_ratio(thr)}")
                else:
                    thr = [float(r[br]["throughput_loaded_tok_s"]) for r in runs]
                    tok = [float(r["br0-tokens"]["throughput_loaded_tok_s"]) for r in runs
                           if "br0-tokens" in r]
                    best = [max(float(r[b]["throughput_loaded_tok_s"]) for b in BASELINES if b in r)
                            for r in runs]
                    line = f"- {key[1]} {key[2]}:"
                    if len(tok) == len(thr):
                        line += (f" br0-tokens / {br} throughput "
                                 f"{_judge([t / x for t, x in zip(tok, thr)], 1 / 1.05)} "
                                 "(rule ≤ 1/1.05 = 0.952);")
                    line += (f" best baseline / {br} {_judge([b / x for b, x in zip(best, thr)], 1.0)}"
                             " (rule ≤ 1)")
                    rules.append(line)
        out += ["", *rules]
    return out


def replicas_section(data: dict[str, list[dict]]) -> str:
    """The report's section on KV budgets and replica speed (empty when neither ran)."""
    rows = [*data.get("replicas_budget", []), *data.get("replicas_speed", [])]
    if not rows:
        return ""
    return "\n".join([
        "## Replicas as they are: KV budgets and replica speed\n",
        "Every policy on the same draws (`docs/replicas.md`): the engines queue requests that do "
        "not fit and preempt the newest running one as vLLM does; BR-0 and BR-H never plan a "
        "load above a budget; speeds are per-replica step models, BR deciding in step time. "
        "Rules as paired ratios over the draws (geometric mean, 95 % interval, verdict).",
        *replicas_lines(rows), ""])
