"""Decision quality and time to first token: grids, runner, rules, report.

Four experiments, each a declared grid of :class:`~.sweep.Cell` s of kind ``quality``:

- ``quality``: the quality matrix — saturated cells (workload × G × requests × seed) and
  open-loop cells (workload × G × offered load, as a multiple of the measured saturated
  capacity) for :data:`QUALITY_POLICIES`, with the acceptance rules of :func:`rule_violations`.
- ``quality_seeds``: the same rules judged per *group* (workload × G × requests × load) over
  many held-out seeds (:data:`HELD_OUT_SEEDS`, drawn by no training run and no other
  experiment): each rule's paired ratio as a geometric mean with its 95 % confidence interval,
  and a verdict — holds, breaks, or undecided at that many seeds (:func:`powered_lines`). One
  cell is one trajectory of a chaotic system (a near-identical twin lands a median ≈ 7 % away),
  so a per-cell rule at a 2 % tolerance cannot tell a policy from its own noise; a group of
  seeds can.
- ``ttft_pareto``: mean imbalance and loaded throughput against TTFT P99 as ``ttft_slo_s`` moves,
  for the BR rows (the knob) and the baselines (one point each).
- ``ttft_open_loop``: TTFT P50/P99, TPOT P95 and imbalance at 0.7, 0.9 and 1.0 of capacity.

Every cell splits its trace the same way whatever the policy (first half trains the predictors,
the second half is simulated), so rows of one cell always share one workload.

**Capacity** (open-loop cells): the saturated request throughput of JSQ on the same test half,
G and B — loaded-phase tokens per second divided by the mean output length (requests per
second a FIFO router sustains with the pool never empty). A load ρ replays the trace's arrival
times compressed to ρ × capacity requests per second (``rate_scale = ρ·capacity / native``,
native = requests / arrival span).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from functools import lru_cache
from typing import Any

import numpy as np

from balanceroute.core.dynamics import KV_LEASE_S
from balanceroute.core.guard import t_quantile
from balanceroute.core.lease import DEFAULT_LEASE

from .sweep import Cell

__all__ = [
    "QUALITY_POLICIES",
    "RULES",
    "declare_quality",
    "lookahead_lines",
    "ttft_lines",
    "paper_lines",
    "paired_interval",
    "powered_lines",
    "powered_ratios",
    "quality_section",
    "rule_violations",
    "run_quality_cell",
]

QUALITY_POLICIES = ("jsq", "least_load", "bfio-h0", "bfio-h0-lease", "br0", "brh-survival",
                    "brh-oracle")
"""The matrix's rows: two FIFO baselines, the prior art as published and under the KV lease BR
keeps (``bfio-h0-lease``), and BalanceRoute's deployable and clairvoyant rows."""

BASELINE_ROWS = ("jsq", "least_load", "bfio-h0")
PARETO_KNOB = ("off", 1.0, 2.0, 4.0, 8.0, 16.0)
"""``ttft_slo_s`` values of the Pareto experiment (``off``: the hard 30 s deadline only)."""

TWINS = ("knob", "drop")
TWIN_STEP = 0.0025
"""The noise floor of a cell: br0 run twice more on near-identical inputs (two *twins*) —
``knob``: its ``ttft_slo_s`` moved by −0.25 % (a handful of decisions change where requests wait);
``drop``: the cell's trace without its first request (every later state moves a little, in any
mode). How far the twins land from br0 says how far apart two near-identical runs land in that
cell, so a rule broken by less is not a finding."""

METRICS = ("mean_imbalance", "throughput_loaded_tok_s", "tpot_ms_p95", "ttft_s_p50", "ttft_s_p99",
           "pool_wait_p99_s", "kv_lease_missed")

RULES = {
    "oracle<=br0": "brh-oracle ≤ br0",
    "survival<=1.02br0": "brh-survival ≤ 1.02 × br0",
    "best_br<=bfio-h0": "min(br0, brh-survival) ≤ bfio-h0",
    "best_br<=baselines": "min(br0, brh-survival) ≤ jsq and least_load",
    "throughput_ranks_like_imbalance": "loaded throughput orders the rows as imbalance does",
}
"""Per-cell acceptance rules of the matrix (mean imbalance unless said otherwise)."""


SHAPE_GROUPS = ("shape-summarize", "shape-mixed", "shape-lognormal", "shape-bimodal",
                "shape-pareto", "shape-reasoning", "shape-correlated", "shape-bursty")
"""The parametric shapes (``core/workloads/shapes.py``) ``quality_seeds`` judges beside the
bundled workloads: workloads no default was fitted to."""

GENERATED = ("servegen-r1", "azure-2024", "azure-2024-long", *SHAPE_GROUPS)
"""The workloads drawn from a generator (a seed gives a new draw); the others replay a trace."""

HELD_OUT_SEEDS = {"full": tuple(range(1000, 1020)), "quick": tuple(range(1000, 1006))}
TRAINING_SEEDS = {"full": tuple(range(100, 120)), "quick": tuple(range(100, 106))}
"""The training draws of the same groups (``--draws training``): every default chosen for the
shapes (the first-token guard's scale, BR-H's lookahead guard) was chosen on these only."""
"""Seeds of the ``quality_seeds`` experiment: held out from everything else — the matrix draws
0–4, the training sweeps and probes behind the defaults draw seeds below 1,000
(``sweep_defaults``: 11–20, 100–115) — so its verdicts are a test of the shipped defaults, not a
fit."""

REPLAY_THIN = 0.9
"""A replay (a fixed trace) has one draw; ``quality_seeds`` makes one per seed by keeping each of
its requests with this chance (``np.random.default_rng(seed)``; order and arrival times kept),
then splitting it as every cell does. The draws share most requests, so their spread is the
trajectory's sensitivity to a small change of the same trace — what decides whether a per-cell
break is the policy or the noise — not the spread of a population of traces."""


def _grid(profile: str) -> dict[str, Any]:
    if profile == "full":
        return dict(workloads=("azure-2024-long", "servegen-r1", "mooncake-conv", "azure-conv-2023"),
                    open_workloads=("azure-2024-long", "servegen-r1", "mooncake-conv",
                                    "azure-conv-2023", "azure-code-2023", "azure-2024"),
                    replicas=(8, 16), requests=(3_000, 20_000), seeds=(0, 1, 2, 3, 4),
                    loads=(0.5, 0.8, 1.0, 1.2), open_requests=6_000, pareto_requests=3_000,
                    knob=PARETO_KNOB, ttft_loads=(0.7, 0.9, 1.0),
                    power_workloads=("azure-2024-long", "servegen-r1", "mooncake-conv",
                                     "azure-conv-2023"),
                    power_open_workloads=("azure-2024-long", "servegen-r1", "mooncake-conv",
                                          "azure-conv-2023", "azure-code-2023", "azure-2024"),
                    power_replicas=(8, 16), power_requests=(3_000, 20_000),
                    shape_workloads=SHAPE_GROUPS, shape_replicas=(8, 16), shape_requests=(3_000,),
                    shape_open_workloads=("shape-bursty", "shape-mixed"))
    if profile == "quick":
        return dict(workloads=("azure-2024-long", "servegen-r1", "mooncake-conv", "azure-conv-2023"),
                    open_workloads=("servegen-r1", "mooncake-conv", "azure-conv-2023"),
                    replicas=(8,), requests=(3_000,), seeds=(0,), loads=(0.5, 1.0),
                    open_requests=3_000, pareto_requests=3_000, knob=("off", 1.0, 4.0, 16.0),
                    ttft_loads=(0.7, 1.0), power_workloads=("azure-2024-long", "servegen-r1"),
                    power_open_workloads=("servegen-r1",), power_replicas=(8,),
                    power_requests=(3_000,), shape_workloads=("shape-mixed",), shape_replicas=(8,),
                    shape_requests=(3_000,), shape_open_workloads=())
    raise ValueError(f"{profile=} must be 'quick' or 'full'")


def declare_quality(profile: str, available: Iterable[str], *, code: str = "",
                    draws: str = "held-out", groups: str = "all",
                    max_draws: int | None = None,
                    deadline_factor: float | None = None) -> dict[str, list[Cell]]:
    """The four experiments' cells for ``profile`` (``quick`` or ``full``), restricted to the
    ``available`` policies. Replays (fixed traces) run seed 0 only, except in ``quality_seeds``,
    where each held-out seed thins them (:data:`REPLAY_THIN`). ``quality_seeds`` only:
    ``draws`` ``held-out`` (:data:`HELD_OUT_SEEDS`, the judge) or ``training``
    (:data:`TRAINING_SEEDS`, for choosing), the first ``max_draws`` of them; ``groups``
    ``all``, ``bundle`` (the bundled workloads) or ``shapes`` (:data:`SHAPE_GROUPS`).
    ``deadline_factor``: every cell carries the option, and the rows whose policy has a relative
    deadline (BR-0, BR-H) run with it (:func:`run_quality_cell`)."""
    if draws not in ("held-out", "training"):
        raise ValueError(f"{draws=} must be 'held-out' or 'training'")
    if groups not in ("all", "bundle", "shapes"):
        raise ValueError(f"{groups=} must be 'all', 'bundle' or 'shapes'")
    g = _grid(profile)
    have = [p for p in QUALITY_POLICIES if p in set(available)]
    sat = [
        Cell(experiment="quality", kind="quality", workload=w, policy=p, replicas=G,
             requests=n, seed=s, code=code, options=(("load", "saturated"),))
        for w in g["workloads"] for G in g["replicas"] for n in g["requests"]
        for s in (g["seeds"] if w in GENERATED else (0,)) for p in have
    ]
    opn = [
        Cell(experiment="quality", kind="quality", workload=w, policy=p, replicas=G,
             requests=g["open_requests"], seed=0, code=code, options=(("load", rho),))
        for w in g["open_workloads"] for G in g["replicas"] for rho in g["loads"] for p in have
    ]
    pareto_policies = [p for p in ("br0", "brh-survival") if p in have]
    pareto = [
        Cell(experiment="ttft_pareto", kind="quality", workload=w, policy=p, replicas=8,
             requests=g["pareto_requests"], seed=0, code=code,
             options=(("load", "saturated"), ("ttft_slo_s", k)))
        for w in ("azure-2024-long", "servegen-r1", "mooncake-conv")
        for p in pareto_policies for k in g["knob"]
    ] + [
        Cell(experiment="ttft_pareto", kind="quality", workload=w, policy=p, replicas=8,
             requests=g["pareto_requests"], seed=0, code=code, options=(("load", "saturated"),))
        for w in ("azure-2024-long", "servegen-r1", "mooncake-conv")
        for p in ("jsq", "least_load", "bfio-h0") if p in have
    ]
    ttft_open = [
        Cell(experiment="ttft_open_loop", kind="quality", workload=w, policy=p, replicas=8,
             requests=g["open_requests"], seed=0, code=code, options=(("load", rho),))
        for w in ("azure-2024-long", "servegen-r1", "mooncake-conv")
        for rho in g["ttft_loads"] for p in have
    ]
    twins = [replace(c, options=(*c.options, ("twin", t))) for c in sat + opn if c.policy == "br0"
             for t in TWINS]
    seeds = (HELD_OUT_SEEDS if draws == "held-out" else TRAINING_SEEDS)[profile][:max_draws]

    def thin(w: str) -> tuple[tuple[str, float], ...]:
        return () if w in GENERATED else (("thin", REPLAY_THIN),)

    powered = [
        Cell(experiment="quality_seeds", kind="quality", workload=w, policy=p, replicas=G,
             requests=n, seed=s, code=code, options=(("load", "saturated"), *thin(w)))
        for w in g["power_workloads"] for G in g["power_replicas"] for n in g["power_requests"]
        for s in seeds for p in have
    ] + [
        Cell(experiment="quality_seeds", kind="quality", workload=w, policy=p, replicas=G,
             requests=g["open_requests"], seed=s, code=code, options=(("load", rho), *thin(w)))
        for w in g["power_open_workloads"] for G in g["power_replicas"] for rho in g["loads"]
        for s in seeds for p in have
    ]
    shapes = [
        Cell(experiment="quality_seeds", kind="quality", workload=w, policy=p, replicas=G,
             requests=n, seed=s, code=code, options=(("load", "saturated"),))
        for w in g["shape_workloads"] for G in g["shape_replicas"] for n in g["shape_requests"]
        for s in seeds for p in have
    ] + [
        Cell(experiment="quality_seeds", kind="quality", workload=w, policy=p, replicas=G,
             requests=g["open_requests"], seed=s, code=code, options=(("load", rho),))
        for w in g["shape_open_workloads"] for G in g["shape_replicas"] for rho in g["loads"]
        for s in seeds for p in have
    ]
    powered = {"all": powered + shapes, "bundle": powered, "shapes": shapes}[groups]
    out = {"quality": sat + opn + twins, "ttft_pareto": pareto, "ttft_open_loop": ttft_open,
           "quality_seeds": powered}
    if deadline_factor is not None:
        out = {k: [replace(c, options=(*c.options, ("deadline_factor", float(deadline_factor))))
                   for c in v] for k, v in out.items()}
    return out


@lru_cache(maxsize=8)
def _load(workload: str, requests: int, seed: int, thin: float | None = None):
    from balanceroute.core.workloads import load_workload

    w = load_workload(workload, requests=requests, seed=seed)
    if thin is not None:  # a draw of a replay (REPLAY_THIN): each request kept with this chance
        keep = np.random.default_rng(seed).random(len(w)) < thin
        w = w.take(np.flatnonzero(keep))
    cut = len(w) // 2
    return w.take(np.arange(cut)), w.take(np.arange(cut, len(w)))


@lru_cache(maxsize=32)
def saturated_capacity(workload: str, requests: int, seed: int, replicas: int, slots: int,
                       thin: float | None = None) -> float:
    """Requests per second JSQ sustains saturated on the test half (module docstring)."""
    from balanceroute.core.policies import get_policy
    from balanceroute.core.simulator import SimConfig, simulate

    _, test = _load(workload, requests, seed, thin)
    m = simulate(test, get_policy("jsq"), SimConfig(num_replicas=replicas, slots=slots)).metrics
    return float(m["throughput_loaded_tok_s"] / test.output_len.mean())


def run_quality_cell(cell: Cell) -> list[dict[str, Any]]:
    """One policy on one matrix cell: its metrics (and, open loop, the capacity and rate used)."""
    from balanceroute.catalogue import build_policy
    from balanceroute.core.simulator import SimConfig, simulate

    thin = None if cell.option("thin", None) is None else float(cell.option("thin"))
    train, test = _load(cell.workload, int(cell.requests or 3_000), cell.seed, thin)
    load = cell.option("load", "saturated")
    params: dict[str, Any] = {}
    knob = cell.option("ttft_slo_s", None)
    if knob is not None:
        params["ttft_slo_s"] = None if knob == "off" else float(knob)
    policy = build_policy(cell.policy, params, train=train, test=test, seed=cell.seed)
    factor = cell.option("deadline_factor", None)
    if factor is not None and hasattr(policy, "deadline_factor"):  # BR-0, BR-H: the relative deadline
        policy = replace(policy, deadline_factor=float(factor))
    twin = cell.option("twin", None)
    if twin == "knob":  # a noise-floor twin (TWINS): the same policy, its knob moved a hair
        if getattr(policy, "ttft_slo_s", None) is None:
            raise ValueError(f"a noise-floor twin needs a policy with ttft_slo_s on, not {cell.policy!r}")
        policy = replace(policy, ttft_slo_s=policy.ttft_slo_s * (1 - TWIN_STEP))
    elif twin not in (None, "drop"):
        raise ValueError(f"twin {twin!r} is not one of {TWINS}")
    extra: dict[str, Any] = {}
    if load == "saturated":
        config = SimConfig(num_replicas=cell.replicas, slots=cell.slots, check_assignments=False)
    else:
        cap = saturated_capacity(cell.workload, int(cell.requests or 3_000), cell.seed,
                                 cell.replicas, cell.slots, thin)
        span = float(test.arrival_s.max() - test.arrival_s.min())
        native = (len(test) - 1) / span if span > 0 else math.inf
        scale = float(load) * cap / native
        extra = {"capacity_rps": cap, "native_rps": native, "rate_scale": scale}
        test = test.take(np.arange(len(test)))
        config = SimConfig(num_replicas=cell.replicas, slots=cell.slots, mode="open_loop",
                           rate_scale=scale, check_assignments=False)
    if twin == "drop":  # the same trace (and arrival rate) less its first request
        test = test.take(np.arange(1, len(test)))
    m = simulate(test, policy, config).metrics
    return [{**{k: m[k] for k in METRICS}, **extra}]


# ------------------------------------------------------------------------------------ rules


def _cell_key(row: dict) -> tuple:
    return (row["workload"], int(row["replicas"]), int(row.get("requests") or 0),
            int(row["seed"]), str(row.get("load", "saturated")))


def _is_twin(row: dict) -> bool:
    return row.get("twin") not in (None, "")


def cells_of(rows: Iterable[dict]) -> dict[tuple, dict[str, dict]]:
    """Rows grouped by matrix cell: key → policy → row (noise-floor twins left out)."""
    out: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if not _is_twin(r):
            out[_cell_key(r)][r["policy"]] = r
    return dict(out)


def noise_floors(rows: Iterable[dict], metric: str = "mean_imbalance") -> dict[tuple, float]:
    """Per cell with br0 and its twins (:data:`TWINS`): the largest |ln(twin ÷ br0)| of
    ``metric`` — the factor by which two near-identical runs already differ there."""
    rows = list(rows)
    twins: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if _is_twin(r):
            twins[_cell_key(r)].append(float(r[metric]))
    out = {}
    for key, by in cells_of(rows).items():
        if key in twins and "br0" in by and float(by["br0"][metric]) > 0:
            base = float(by["br0"][metric])
            out[key] = max(abs(math.log(max(t, 1e-12) / base)) for t in twins[key])
    return out


def _discordant_beyond(by: dict[str, dict], imb_floor: float, thr_floor: float) -> tuple[bool, bool]:
    """(throughput orders the rows unlike imbalance, and some pair does so by more than both
    floors): a pair a, b with less imbalance but less throughput for a, |ln| of both gaps over
    the cell's imbalance and throughput floors."""
    imb = {p: float(r["mean_imbalance"]) for p, r in by.items()}
    thr = {p: float(r["throughput_loaded_tok_s"]) for p, r in by.items()}
    broken = beyond = False
    for a in imb:
        for b in imb:
            if imb[a] < imb[b] and thr[a] < thr[b]:
                broken = True
                beyond |= (math.log(imb[b] / max(imb[a], 1e-12)) > imb_floor
                           and math.log(thr[b] / max(thr[a], 1e-12)) > thr_floor)
    return broken, beyond


def _imbalance_rules(imb: dict[str, float]) -> dict[str, tuple[float, str]]:
    """Per imbalance rule that applies to a cell: (left ÷ right side, one-line why); the rule
    is broken when the ratio exceeds 1."""
    out: dict[str, tuple[float, str]] = {}
    if "br0" not in imb:
        return out
    br0 = imb["br0"]

    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else (1.0 if a <= b else math.inf)

    if "brh-oracle" in imb:
        out["oracle<=br0"] = (ratio(imb["brh-oracle"], br0),
                              f"oracle {imb['brh-oracle']:,.0f} vs br0 {br0:,.0f}")
    if "brh-survival" in imb:
        out["survival<=1.02br0"] = (ratio(imb["brh-survival"], 1.02 * br0),
                                    f"survival {imb['brh-survival']:,.0f} vs 1.02·br0 {1.02 * br0:,.0f}")
    best = min(imb[p] for p in ("br0", "brh-survival") if p in imb)
    if "bfio-h0" in imb:
        out["best_br<=bfio-h0"] = (ratio(best, imb["bfio-h0"]),
                                   f"best BR {best:,.0f} vs bfio-h0 {imb['bfio-h0']:,.0f}")
    base = [p for p in ("jsq", "least_load") if p in imb]
    if base:
        worse = [p for p in base if best > imb[p]]
        out["best_br<=baselines"] = (ratio(best, min(imb[p] for p in base)), f"best BR {best:,.0f} vs "
                                     + ", ".join(f"{p} {imb[p]:,.0f}" for p in worse))
    return out


def rule_violations(rows: Iterable[dict]) -> dict[str, list[tuple[tuple, str]]]:
    """For each rule of :data:`RULES`, the cells that break it and a one-line why."""
    bad: dict[str, list[tuple[tuple, str]]] = {name: [] for name in RULES}
    for key, by in sorted(cells_of(rows).items(), key=lambda kv: str(kv[0])):
        imb = {p: float(r["mean_imbalance"]) for p, r in by.items()}
        if "br0" not in imb:
            continue
        for name, (r, why) in _imbalance_rules(imb).items():
            if r > 1:
                bad[name].append((key, why))
        thr = {p: float(r["throughput_loaded_tok_s"]) for p, r in by.items()}
        by_imb = sorted(imb, key=lambda p: imb[p])
        by_thr = sorted(thr, key=lambda p: -thr[p])
        if by_imb != by_thr:
            bad["throughput_ranks_like_imbalance"].append(
                (key, "imbalance " + " < ".join(by_imb) + "; throughput " + " > ".join(by_thr)))
    return bad


def floor_lines(rows: list[dict]) -> list[str]:
    """The noise floor (:data:`TWINS`): how far br0's twins land from br0, and how many breaks of
    each rule exceed their cell's floor (the ratio over an imbalance rule's bound is larger than
    the twins' largest factor; for the throughput rule, :func:`_discordant_beyond`) — the breaks
    a near-identical run would not produce."""
    floors = noise_floors(rows)
    if not floors:
        return []
    cells = cells_of(rows)
    f = np.exp(np.array(sorted(floors.values()))) - 1
    out = [f"- Noise floor (br0 against itself with ttft_slo_s moved −{100 * TWIN_STEP:g} % and "
           f"without the trace's first request, {len(floors)} cells): the farther twin lands a "
           f"median {100 * float(np.median(f)):.1f} %, at most {100 * float(f[-1]):.1f} %, from "
           "br0; beyond that floor:"]
    ratios = {key: _imbalance_rules({p: float(r["mean_imbalance"]) for p, r in cells[key].items()})
              for key in floors}
    for name in ("oracle<=br0", "survival<=1.02br0", "best_br<=bfio-h0", "best_br<=baselines"):
        got = [(ratios[key][name][0], floor) for key, floor in floors.items() if name in ratios[key]]
        broken = sum(r > 1 for r, _ in got)
        beyond = sum(r > 1 and r > math.exp(floor) for r, floor in got)
        out.append(f"  - {RULES[name]}: {beyond} of its {broken} breaks")
    thr_floors = noise_floors(rows, "throughput_loaded_tok_s")
    broken = beyond = 0
    for key, floor in floors.items():
        b, x = _discordant_beyond(cells[key], floor, thr_floors.get(key, 0.0))
        broken += b
        beyond += x
    out.append(f"  - {RULES['throughput_ranks_like_imbalance']}: {beyond} of its {broken} breaks "
               "(a pair ordered unlike imbalance with both gaps over the cell's imbalance and "
               "throughput floors)")
    return out


def _fmt_key(key: tuple) -> str:
    w, g, n, s, load = key
    where = "saturated" if load == "saturated" else f"open loop {float(load):g}× capacity"
    return f"{w} G={g} n={n:,} seed={s} {where}"


def matrix_lines(rows: list[dict]) -> list[str]:
    """The matrix as Markdown table lines: one row per cell, mean imbalance per policy and the
    loaded throughput and TPOT P95 of br0 and the best baseline."""
    present = [p for p in QUALITY_POLICIES if any(r["policy"] == p for r in rows)]
    lease = any(r.get("kv_lease_missed") not in (None, "") for r in rows if r["policy"] == "bfio-h0")
    head = ["cell", *present, "br0 tok/s", "br0 TPOT P95", *(["bfio-h0 past lease"] if lease else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, by in sorted(cells_of(rows).items(), key=lambda kv: str(kv[0])):
        vals = [f"{float(by[p]['mean_imbalance']):,.0f}" if p in by else "—" for p in present]
        b = by.get("br0")
        tail = [f"{float(b['throughput_loaded_tok_s']):,.0f}", f"{float(b['tpot_ms_p95']):.1f}"] if b else ["—", "—"]
        if lease:
            f = by.get("bfio-h0", {}).get("kv_lease_missed")
            tail.append("—" if f in (None, "") else f"{100 * float(f):.1f} %")
        lines.append("| " + " | ".join([_fmt_key(key), *vals, *tail]) + " |")
    return lines


def rules_lines(rows: list[dict], *, details: int = 6) -> list[str]:
    """Per rule: how many cells break it, and the first few with their numbers; then
    :func:`context_lines`."""
    n_cells = len(cells_of(rows))
    out = []
    bad = rule_violations(rows)
    for name, cells in bad.items():
        out.append(f"- {RULES[name]}: **{len(cells)} of {n_cells} cells break it**")
        out += [f"  - {_fmt_key(k)}: {why}" for k, why in cells[:details]]
        if len(cells) > details:
            out.append(f"  - … {len(cells) - details} more")
    return out + context_lines(rows, violations=bad) + [
        "- Each cell is one trajectory (see the noise floor): `balanceroute quality --full "
        "--experiment quality_seeds` judges these rules per cell shape over 20 held-out draws."]


def _share(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{100 * lo:.2g} %" if lo == hi else f"{100 * lo:.2g}–{100 * hi:.3g} %"


_RATIOS = (("brh-oracle ÷ br0", ("brh-oracle",), ("br0",)),
           ("brh-survival ÷ br0", ("brh-survival",), ("br0",)),
           ("best BR ÷ bfio-h0", ("br0", "brh-survival"), ("bfio-h0",)),
           ("best BR ÷ bfio-h0-lease", ("br0", "brh-survival"), ("bfio-h0-lease",)),
           ("best BR ÷ least_load", ("br0", "brh-survival"), ("least_load",)))


def _over_seeds(cells: dict[tuple, dict[str, dict]]) -> dict[tuple, list[dict[str, dict]]]:
    """:func:`cells_of`'s cells grouped over their seeds (:func:`seed_groups`), in seed order."""
    groups: dict[tuple, list[tuple[int, dict[str, dict]]]] = defaultdict(list)
    for (w, g, n, seed, load), by in cells.items():
        groups[(w, g, n, load)].append((seed, by))
    return {k: [by for _, by in sorted(v, key=lambda sb: sb[0])] for k, v in groups.items()}


def seed_lines(cells: dict[tuple, dict[str, dict]]) -> list[str]:
    """Where a cell was run at several seeds: per ratio, its geometric mean over the seeds and
    the range — whether a broken rule is a seed's draw or the same every time."""
    groups = {k: v for k, v in _over_seeds(cells).items() if len(v) > 1}
    ratios = [(label, num, den) for label, num, den in _RATIOS
              if any(all(any(p in by for p in side) for side in (num, den))
                     for v in groups.values() for by in v)]
    if not groups or not ratios:
        return []
    head = ["cells over seeds", *(label for label, _, _ in ratios)]
    out = ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (w, g, n, load), runs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        vals = []
        for _, num, den in ratios:
            xs = [min(float(by[p]["mean_imbalance"]) for p in num if p in by)
                  / min(float(by[p]["mean_imbalance"]) for p in den if p in by)
                  for by in runs if any(p in by for p in num) and any(p in by for p in den)]
            vals.append(f"{math.exp(float(np.mean(np.log(xs)))):.2f} ({min(xs):.2f}–{max(xs):.2f})"
                        if xs else "—")
        where = "saturated" if load == "saturated" else f"{float(load):g}×"
        out.append(f"| {w} G={g} n={n:,} {where}, {len(runs)} seeds | " + " | ".join(vals) + " |")
    return out + [""]


def paired_interval(ratios: Iterable[float], level: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean of paired ratios x_s (one per seed) and its ``level`` confidence interval:
    the Student t interval of mean(ln x) — exp(m ± t·sd/√n). With one ratio the interval is
    (nan, nan): nothing is decided."""
    r = np.asarray(list(ratios), dtype=np.float64)
    if r.shape[0] == 0 or not np.all(np.isfinite(r) & (r > 0)):
        raise ValueError("paired_interval needs at least one finite, positive ratio")
    x = np.log(r)
    m = float(x.mean())
    if x.shape[0] < 2:
        return math.exp(m), math.nan, math.nan
    h = t_quantile(0.5 + level / 2, x.shape[0] - 1) * float(x.std(ddof=1)) / math.sqrt(x.shape[0])
    return math.exp(m), math.exp(m - h), math.exp(m + h)


def verdict(lo: float, hi: float) -> str:
    """``holds`` when the interval of a ratio to its bound lies at or below 1, ``breaks`` when it
    lies above 1, else ``undecided``."""
    if hi <= 1.0:
        return "holds"
    if lo > 1.0:
        return "breaks"
    return "undecided"


POWERED = (*(name for name in RULES if name != "throughput_ranks_like_imbalance"),)
"""The imbalance rules :func:`powered_lines` judges per group (the throughput rule has its own
test there)."""


def seed_groups(rows: Iterable[dict]) -> dict[tuple, list[dict[str, dict]]]:
    """Cells grouped over their seeds: (workload, G, requests, load) → one policy → row map per
    seed, in seed order."""
    return _over_seeds(cells_of(rows))


def _throughput_test(runs: list[dict[str, dict]]) -> tuple[int, int, int]:
    """Over one group's seeds, the pairs of rows whose imbalance order is decided (interval of
    the ratio clear of 1): how many, how many have a throughput order decided the same way (less
    imbalance, more throughput) and how many decided the opposite way."""
    names = sorted(set.intersection(*(set(by) for by in runs)))
    decided = same = opposite = 0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            _, ilo, ihi = paired_interval(float(by[a]["mean_imbalance"]) / float(by[b]["mean_imbalance"])
                                          for by in runs)
            _, tlo, thi = paired_interval(float(by[a]["throughput_loaded_tok_s"])
                                          / float(by[b]["throughput_loaded_tok_s"]) for by in runs)
            if not (ihi < 1 or ilo > 1):
                continue
            decided += 1
            less = ihi < 1  # a has the lower imbalance
            same += (tlo > 1) if less else (thi < 1)
            opposite += (thi < 1) if less else (tlo > 1)
    return decided, same, opposite


LEASE = "best_br<=bfio-h0-lease"
"""Beside the rules in :func:`powered_ratios`: the best BR row against BF-IO-H0 held to the same
KV lease (context, not a rule of the issue)."""


TTFT_RULE = "ttft<=1.5jsq"
"""Beside the rules: the first-token bound — the larger TTFT P99 of br0 and brh-survival over
1.5 × JSQ's (≤ 1 keeps it; saturated and open loop)."""


PLANE = "bfio-h0_dominates_no_br"
"""Beside the rules: the issue's reading of "best BR ≤ bfio-h0" on the imbalance–TTFT P99 plane —
no bfio-h0 point dominates the BR point. Per draw, the smallest of br0's and brh-survival's
ratios to bfio-h0 on either axis (mean imbalance, TTFT P99): below 1, some BR row beats bfio-h0
on some axis in that draw; its interval above 1, bfio-h0 is better on both axes."""


def _group_label(key: tuple) -> str:
    w, g, n, load = key
    return f"{w} G={g} n={n:,} " + ("saturated" if load == "saturated" else f"{float(load):g}×")


def _plane_ratio(by: dict[str, dict]) -> float | None:
    """:data:`PLANE` for one draw: min over br0, brh-survival and the two axes of BR ÷ bfio-h0
    (``None`` without bfio-h0 or a BR row with both metrics)."""
    def axes(p: str) -> tuple[float, float] | None:
        r = by.get(p)
        if r is None or r.get("ttft_s_p99") in (None, ""):
            return None
        return float(r["mean_imbalance"]), float(r["ttft_s_p99"])

    base = axes("bfio-h0")
    if base is None or min(base) <= 0:
        return None
    ours = [a for a in (axes("br0"), axes("brh-survival")) if a is not None]
    if not ours:
        return None
    return min(min(imb / base[0], ttft / base[1]) for imb, ttft in ours)


def powered_ratios(rows: Iterable[dict], *, level: float = 0.95) -> dict[tuple, dict[str, tuple]]:
    """Per group with at least two seeds (:func:`seed_groups`): each rule of :data:`POWERED` (and
    :data:`LEASE`) that applies → (geometric mean over the seeds of the ratio to its bound, the
    interval's low and high end — :func:`paired_interval`)."""
    return _powered_ratios(seed_groups(rows), level)


def _powered_ratios(groups: dict[tuple, list[dict[str, dict]]],
                    level: float) -> dict[tuple, dict[str, tuple]]:
    out: dict[tuple, dict[str, tuple]] = {}
    for key, runs in groups.items():
        if len(runs) < 2:
            continue
        per_seed = []
        for by in runs:
            imb = {p: float(r["mean_imbalance"]) for p, r in by.items()}
            rules = {k: v[0] for k, v in _imbalance_rules(imb).items()}
            best = [imb[p] for p in ("br0", "brh-survival") if p in imb]
            if best and imb.get("bfio-h0-lease", 0) > 0:
                rules[LEASE] = min(best) / imb["bfio-h0-lease"]
            ttft = [float(by[p]["ttft_s_p99"]) for p in ("br0", "brh-survival")
                    if p in by and by[p].get("ttft_s_p99") not in (None, "")]
            jsq = by.get("jsq", {}).get("ttft_s_p99")
            if ttft and jsq not in (None, "") and float(jsq) > 0:
                rules[TTFT_RULE] = max(ttft) / (1.5 * float(by["jsq"]["ttft_s_p99"]))
            plane = _plane_ratio(by)
            if plane is not None:
                rules[PLANE] = plane
            per_seed.append(rules)
        out[key] = {rule: paired_interval([d[rule] for d in per_seed if rule in d], level)
                    for rule in (*POWERED, LEASE, TTFT_RULE, PLANE)
                    if sum(rule in d for d in per_seed) > 1}
    return out


def powered_lines(rows: list[dict], *, level: float = 0.95) -> list[str]:
    """The rules judged per group of seeds (module docstring, ``quality_seeds``): a table of each
    rule's ratio to its bound — geometric mean over the seeds (interval) and verdict — with best
    BR ÷ bfio-h0-lease beside it, then per rule how many groups it holds, breaks or leaves
    undecided in, naming the groups where it breaks."""
    groups = seed_groups(rows)
    ratios = _powered_ratios(groups, level)
    if not ratios:
        return []
    pct = f"{100 * level:g} %"
    head = ["group", "seeds", *(RULES[r] for r in POWERED), "best BR ÷ bfio-h0-lease",
            "TTFT P99 ÷ 1.5·JSQ's (br0, brh-survival)",
            "BR ÷ bfio-h0 on the better axis (imbalance, TTFT P99)", "throughput vs imbalance"]
    out = [f"Ratio to each rule's bound (≤ 1 keeps it): geometric mean over the seeds, its {pct} "
           "confidence interval, and the verdict (holds: the interval is at or below 1; breaks: "
           "above 1; undecided: it straddles 1). Throughput: of the pairs of rows whose imbalance "
           "order is decided, how many have throughput decided the same way and the opposite way.",
           "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    tally: dict[str, dict[str, list[str]]] = {r: defaultdict(list)
                                              for r in (*POWERED, LEASE, TTFT_RULE, PLANE, "thr")}
    for key in sorted(ratios, key=str):
        where, cols = _group_label(key), []
        for rule in (*POWERED, LEASE, TTFT_RULE, PLANE):
            if rule not in ratios[key]:
                cols.append("—")
                continue
            gm, lo, hi = ratios[key][rule]
            v = verdict(lo, hi)
            tally[rule][v].append(f"{where}: {gm:.3f} ({lo:.3f}–{hi:.3f})")
            cols.append(f"{gm:.3f} ({lo:.3f}–{hi:.3f}) {v}")
        decided, same, opposite = _throughput_test(groups[key])
        tally["thr"]["breaks" if opposite else "holds"].append(
            f"{where}: {opposite} of {decided} decided pairs opposite")
        cols.append(f"{same} / {opposite} of {decided}")
        out.append(f"| {where} | {len(groups[key])} | " + " | ".join(cols) + " |")
    out.append("")
    names = {**RULES, LEASE: "min(br0, brh-survival) ≤ bfio-h0-lease (same TTFT guard and lease)",
             TTFT_RULE: "TTFT P99 of br0 and brh-survival ≤ 1.5 × JSQ's",
             PLANE: "no bfio-h0 point dominates the BR point (imbalance–TTFT P99 plane)",
             "thr": RULES["throughput_ranks_like_imbalance"]}
    for rule in (*POWERED, LEASE, TTFT_RULE, PLANE, "thr"):
        t = tally[rule]
        total = sum(len(v) for v in t.values())
        if not total:  # a rule whose rows were not run (``--policies``)
            continue
        name = names[rule]
        out.append(f"- {name}: holds in {len(t['holds'])}, undecided in {len(t['undecided'])}, "
                   f"breaks in {len(t['breaks'])} of {total} groups")
        out += [f"  - breaks: {line}" for line in t["breaks"]]
    return out


LOOKAHEAD_FLAT = 0.02
"""A lookahead row "within" BR-0 when its geometric-mean imbalance ratio is within this of 1."""
ORACLE_PAYS = 0.30
"""The clairvoyant row "gains" when its ratio to BR-0 is at most 1 − this (#32's rule)."""
SURVIVAL_PAYS = 0.10
"""... and then the deployable row should gain at least this."""


def lookahead_lines(rows: list[dict]) -> list[str]:
    """Where the deployable lookahead pays and where it does not, in words, over the saturated
    groups of held-out draws (:func:`seed_groups`, at least two draws with br0, brh-survival and
    brh-oracle): brh-survival ÷ br0 and brh-oracle ÷ br0 mean imbalance, geometric means over the
    draws (:func:`paired_interval`). Names the groups where the survival row gains more than
    :data:`LOOKAHEAD_FLAT`, those where the clairvoyant row gains at least :data:`ORACLE_PAYS`
    with the survival row's ratio beside it, and of those the ones where the survival row gains
    less than :data:`SURVIVAL_PAYS` — where the deployable lookahead does not pay."""
    need = ("br0", "brh-survival", "brh-oracle")
    found: dict[tuple, tuple[float, float]] = {}  # group → (survival, oracle) ÷ br0
    seeds: set[int] = set()
    for key, runs in seed_groups(rows).items():
        runs = [by for by in runs if all(p in by for p in need)]
        if key[3] != "saturated" or len(runs) < 2:
            continue
        found[key] = tuple(paired_interval([float(by[p]["mean_imbalance"]) / float(by["br0"]["mean_imbalance"])
                                            for by in runs])[0] for p in ("brh-survival", "brh-oracle"))
        seeds.update(int(by["br0"]["seed"]) for by in runs)
    if not found:
        return []

    def name(key: tuple) -> str:
        return f"{key[0]} G = {key[1]}, {key[2]:,} requests"

    keys = sorted(found, key=lambda k: (k[2], k[0], k[1]))
    flat = [k for k in keys if abs(found[k][0] - 1.0) <= LOOKAHEAD_FLAT]
    gains = [k for k in keys if found[k][0] < 1.0 - LOOKAHEAD_FLAT]
    oracle = [k for k in keys if found[k][1] <= 1.0 - ORACLE_PAYS]
    short = [k for k in oracle if found[k][0] > 1.0 - SURVIVAL_PAYS]
    sizes = sorted({k[2] for k in keys})
    out = [f"Over held-out draws {min(seeds)}–{max(seeds)} ({len(keys)} saturated groups, G = "
           + " and ".join(str(g) for g in sorted({k[1] for k in keys})) + ", "
           + " and ".join(f"{n:,}" for n in sizes) + " requests), BR-H with the survival predictor "
           f"is within {100 * LOOKAHEAD_FLAT:g} % of BR-0's mean imbalance (geometric mean over "
           f"the draws) in {len(flat)} of {len(keys)} groups"
           + ("" if not gains else "; it gains more in " + "; ".join(
               f"{name(k)} ({found[k][0]:.3f}×)" for k in gains)) + "."]
    if oracle:
        out.append(f"The clairvoyant lookahead (true output lengths) gains ≥ {100 * ORACLE_PAYS:g} % in "
                   + "; ".join(f"{name(k)} ({found[k][1]:.3f}×, survival {found[k][0]:.3f}×)"
                               for k in oracle) + ".")
    if short:
        out.append(f"Of those, the deployable row gains less than {100 * SURVIVAL_PAYS:g} % in "
                   + "; ".join(name(k) for k in short) + ": the gap is the forecast's, not the "
                   "lookahead's, and where only the prompt is known BR-0 is what to deploy.")
    elif oracle:
        out.append(f"Wherever the clairvoyant row gains that much, the survival row gains at least "
                   f"{100 * SURVIVAL_PAYS:g} %.")
    else:
        out.append(f"The clairvoyant row gains less than {100 * ORACLE_PAYS:g} % in every group.")
    return [" ".join(out)]


def ttft_lines(rows: list[dict], *, level: float = 0.95) -> list[str]:
    """The first-token bound in words over the groups of held-out draws (:data:`TTFT_RULE`: the
    larger TTFT P99 of br0 and brh-survival over JSQ's, geometric mean over the draws with its
    interval, :func:`powered_ratios`): in how many groups it holds, is undecided and breaks, the
    worst group, and the group names where it does not hold."""
    ratios = {k: v[TTFT_RULE] for k, v in powered_ratios(rows, level=level).items()
              if TTFT_RULE in v}
    if not ratios:
        return []
    seeds = {int(r["seed"]) for r in rows if r.get("policy") == "jsq"}
    verdicts = {k: verdict(lo, hi) for k, (_, lo, hi) in ratios.items()}
    count = {v: sum(1 for x in verdicts.values() if x == v) for v in ("holds", "undecided", "breaks")}
    worst = max(ratios, key=lambda k: ratios[k][0])
    n_open = sum(1 for k in ratios if k[3] != "saturated")

    def said(key: tuple) -> str:  # the ratio to JSQ's TTFT P99 (the rule's is to 1.5 × it)
        gm, lo, hi = ratios[key]
        return f"{_group_label(key)}: {1.5 * gm:.2f}× ({1.5 * lo:.2f}–{1.5 * hi:.2f})"

    out = (f"Over held-out draws {min(seeds)}–{max(seeds)} ({len(ratios)} groups, "
           f"{len(ratios) - n_open} saturated and {n_open} open loop), the TTFT P99 of BR-0 and BR-H "
           f"(survival), the larger of the two, is at most 1.5× JSQ's — geometric mean over the "
           f"draws, {100 * level:g} % interval — in {count['holds']} of {len(ratios)} groups; "
           f"undecided in {count['undecided']}, above it in {count['breaks']}; the highest is "
           f"{said(worst)}.")
    rest = [k for k in sorted(ratios, key=str) if verdicts[k] != "holds" and k != worst]
    if rest:
        out += " Not holding as well: " + "; ".join(said(k) for k in rest) + "."
    return [out]


def context_lines(rows: list[dict], *,
                  violations: dict[str, list[tuple[tuple, str]]] | None = None) -> list[str]:
    """What the rule counts alone do not say (both read from the rows, no constants):

    - the throughput rule split by mode, with the pairwise agreement and the spread between the
      rows — below capacity the offered load fixes the throughput, so the rows differ little
      there and their order is mostly noise;
    - the noise floor (:func:`floor_lines`): which breaks exceed what br0's own twins differ by;
    - for the cells where bfio-h0 beats the best BR row: the share of requests bfio-h0 keeps in
      the pool past the KV lease (``kv_lease_missed``; BR's pool deadline places them before)."""
    cells = cells_of(rows)
    out: list[str] = []
    for mode in ("saturated", "open loop"):
        mine = {k: by for k, by in cells.items() if (k[4] == "saturated") == (mode == "saturated")}
        if not mine:
            continue
        broken = pairs = agree = 0
        spread = []
        for by in mine.values():
            imb = {p: float(r["mean_imbalance"]) for p, r in by.items()}
            thr = {p: float(r["throughput_loaded_tok_s"]) for p, r in by.items()}
            broken += sorted(imb, key=imb.__getitem__) != sorted(thr, key=lambda p: -thr[p])
            names = sorted(by)
            for i, a in enumerate(names):
                for b in names[i + 1:]:
                    pairs += 1
                    agree += (imb[a] < imb[b]) == (thr[a] > thr[b])
            spread.append((max(thr.values()) - min(thr.values())) / max(thr.values()))
        out.append(f"- Throughput order, {mode} cells: {broken} of {len(mine)} break it; "
                   f"{agree / max(pairs, 1):.1%} of policy pairs are ordered alike; median "
                   f"throughput spread between the rows {100 * float(np.median(spread)):.2f} %")
    lease_beaten = []
    for key, by in cells.items():
        best = [float(by[p]["mean_imbalance"]) for p in ("br0", "brh-survival") if p in by]
        if best and "bfio-h0-lease" in by and min(best) > float(by["bfio-h0-lease"]["mean_imbalance"]):
            lease_beaten.append(key)
    if any("bfio-h0-lease" in by for by in cells.values()):
        n_lease = sum("bfio-h0-lease" in by for by in cells.values())
        out.append(f"- min(br0, brh-survival) ≤ bfio-h0-lease (BF-IO-H0 with the same "
                   f"{DEFAULT_LEASE.deadline_s:g} s pool deadline and first-token guard): "
                   f"{len(lease_beaten)} of {n_lease} cells break it")
    out += floor_lines(rows)
    out += seed_lines(cells)
    if violations is None:
        violations = rule_violations(rows)
    beaten = [key for key, _ in violations["best_br<=bfio-h0"]]

    def missed(policy: str) -> list[float]:
        values = [cells[k].get(policy, {}).get("kv_lease_missed") for k in beaten]
        return [float(v) for v in values if v not in (None, "")]

    known = missed("bfio-h0")
    if known:
        over = [m for m in known if m > 0]
        br0_missed = missed("br0")
        out.append(f"- Of the {len(beaten)} cells where bfio-h0 beats the best BR row, in "
                   f"{len(over)} it keeps requests waiting past the {KV_LEASE_S:g} s KV lease"
                   + (f" ({_share(over)} of them" + (f"; br0 {_share(br0_missed)} in the same cells"
                                                      if br0_missed else "") + ")" if over else "")
                   + "; br0 and brh-* place such requests first when a slot is free (their pool "
                   "deadline)")
    return out


_PAPER_ROWS = ("jsq", "bfio-h0", "br0", "brh-survival", "brh-oracle")


def paper_lines(rows: list[dict]) -> list[str]:
    """Next to the paper's Table 1 (G = 8, saturated): per paper dataset, its bundled stand-in
    (:data:`~.paper.DATASET_WORKLOAD`) at the matrix's largest saturated G = 8 request count —
    mean imbalance (mean over the seeds) and ÷ br0 (geometric mean over the seeds, range), with
    the paper's imbalance and ÷ BR-0 beside them (the paper has no BF-IO row)."""
    from .paper import DATASET_WORKLOAD, TABLE1

    cells = cells_of(rows)
    out: list[str] = []
    for dataset, workload in DATASET_WORKLOAD.items():
        mine = [k for k in cells if k[0] == workload and k[1] == 8 and k[4] == "saturated"]
        if not mine:
            continue
        n = max(k[2] for k in mine)
        runs = [cells[k] for k in sorted(mine) if k[2] == n and "br0" in cells[k]]
        theirs = {r["policy"]: float(r["mean_imbalance"]) for r in TABLE1 if r["dataset"] == dataset}
        if not runs:
            continue
        if not out:
            out = ["| paper dataset → ours | policy | paper imbalance | paper ÷ BR-0 | "
                   "our imbalance | ours ÷ br0 |", "|---|---|---:|---:|---:|---:|"]
        where = f"{dataset} → {workload}, n={n:,}, {len(runs)} seed{'s' * (len(runs) > 1)}"
        for p in _PAPER_ROWS:
            xs = [float(by[p]["mean_imbalance"]) for by in runs if p in by]
            if not xs:
                continue
            ratios = [float(by[p]["mean_imbalance"]) / float(by["br0"]["mean_imbalance"])
                      for by in runs if p in by]
            g = math.exp(float(np.mean(np.log(ratios))))
            ours = f"{g:.2f}" + (f" ({min(ratios):.2f}–{max(ratios):.2f})" if len(ratios) > 1 else "")
            paper_i = f"{theirs[p]:,.0f}" if p in theirs else "—"
            paper_r = f"{theirs[p] / theirs['br0']:.2f}" if p in theirs else "—"
            out.append(f"| {where} | {p} | {paper_i} | {paper_r} | {float(np.mean(xs)):,.0f} | {ours} |")
            where = ""
    return out


def quality_section(data: dict[str, list[dict]], figures: dict[str, str]) -> str:
    """The report's section on decision quality and TTFT (empty when nothing ran)."""
    parts: list[str] = []
    q = data.get("quality", [])
    if q:
        parts += ["## Decision quality: the matrix\n",
                  "Mean imbalance (tokens) per cell and policy; `balanceroute quality` prints the "
                  "same. A cell's n is the requests drawn from the workload: the first half fits "
                  "the predictors, the second half is simulated (Table 1 above counts the simulated "
                  "requests). Open-loop loads are multiples of the measured saturated capacity "
                  "(JSQ's saturated request rate on the same test half, G and B).\n",
                  *matrix_lines(q), "", "Rules:\n", *rules_lines(q), ""]
        side = paper_lines(q)
        if side:
            parts += ["Next to the paper's Table 1 (G = 8, saturated; the paper measured 910C NPUs "
                      "on its own request sets, we simulate the bundled stand-ins, so compare the "
                      "ratios, not the tokens):\n", *side, ""]
    seeds = data.get("quality_seeds", [])
    if seeds:
        runs = seed_groups(seeds)
        n_seeds = sorted({len(v) for v in runs.values()})
        parts += ["## Decision quality over held-out seeds\n",
                  f"The matrix's rules judged per group (workload × G × requests × load) over "
                  f"{'/'.join(map(str, n_seeds))} seeds drawn by no training run "
                  "(`balanceroute quality --experiment quality_seeds`): a single cell cannot tell "
                  "a policy from its own noise, a group of seeds can.\n",
                  *powered_lines(seeds), ""]
        if "quality_seeds" in figures:
            parts.append(f"![The rules over held-out seeds]({figures['quality_seeds']})\n")
    pareto = data.get("ttft_pareto", [])
    if pareto:
        parts += ["## Time to first token: the `ttft_slo_s` trade-off\n",
                  "Saturated, G = 8, seed 0. Each BR row moves the soft first-token deadline; "
                  "the baselines are one point each.\n",
                  "| workload | policy | ttft_slo_s | TTFT P99 (s) | mean imbalance | tok/s |",
                  "|---|---|---:|---:|---:|---:|"]
        def knob(value: Any) -> float:  # numbers in order, then off (no soft deadline)
            try:
                return float(value)
            except (TypeError, ValueError):
                return math.inf

        for r in sorted(pareto, key=lambda r: (r["workload"], r["policy"], knob(r.get("ttft_slo_s")))):
            parts.append(f"| {r['workload']} | {r['policy']} | {r.get('ttft_slo_s', '') or '—'} | "
                         f"{float(r['ttft_s_p99']):.1f} | {float(r['mean_imbalance']):,.0f} | "
                         f"{float(r['throughput_loaded_tok_s']):,.0f} |")
        if "ttft_pareto" in figures:
            parts.append(f"\n![TTFT P99 against imbalance]({figures['ttft_pareto']})")
        parts.append("")
    ol = data.get("ttft_open_loop", [])
    if ol:
        parts += ["## Open loop: TTFT where users see it\n",
                  "G = 8; offered load as a multiple of the measured saturated capacity.\n",
                  "| workload | load | policy | TTFT P50 (s) | TTFT P99 (s) | TPOT P95 (ms) | mean imbalance |",
                  "|---|---:|---|---:|---:|---:|---:|"]
        for r in sorted(ol, key=lambda r: (r["workload"], float(r["load"]), QUALITY_POLICIES.index(r["policy"])
                                            if r["policy"] in QUALITY_POLICIES else 99)):
            parts.append(f"| {r['workload']} | {float(r['load']):g} | {r['policy']} | "
                         f"{float(r['ttft_s_p50']):.2f} | {float(r['ttft_s_p99']):.2f} | "
                         f"{float(r['tpot_ms_p95']):.1f} | {float(r['mean_imbalance']):,.0f} |")
        parts.append("")
    return "\n".join(parts)
