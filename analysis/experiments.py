"""The reproduction's declared grids and the runner of each cell kind.

Experiments (one tidy CSV each, see :func:`declare`):

- ``table1``: every Table-1 policy × the four workloads at G = 8 (seeded repeats).
- ``table1_calibrated``: the same on the two decode-heavy workloads with B and the step model
  calibrated to the paper's reported numbers (a what-if).
- ``scaling``: G = 4 … 128 for the baselines, BR-0 and BR-H (oracle): the paper's G-scaling
  table and beyond it; also the data of the extreme-value figure.
- ``step_model``: the throughput gain as the step model's a/b ratio varies.
- ``slots``: the same comparison as the slots per replica B vary (G = 8).
- ``tick_timing``: scheduling-tick latency on states met in saturated simulations.
- ``tick_gap``, ``clairvoyant_gap``, ``competitive_ratio``: heuristics against the exact solvers
  (only when ``balanceroute.solvers`` and a backend are installed).
- ``balls_into_bins``: the one-choice / two-choice Monte Carlo behind the theory figure.

Runners (``RUNNERS``, keyed by ``Cell.kind``) take a :class:`~.sweep.Cell` and return rows; all
randomness comes from the cell's seed.
"""

from __future__ import annotations

import ast
import dataclasses
import gc
import hashlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from balanceroute.catalogue import build_policy, policy_entry

from .policies import make_factory
from .quality import declare_quality, run_quality_cell
from .replicas import declare_replicas, run_replicas_cell
from .sweep import Cell, RunByKind
from .theory import balls_into_bins_max_load

__all__ = [
    "FULL",
    "QUICK",
    "RUNNERS",
    "SCALING_POLICIES",
    "STEP_POLICIES",
    "TABLE1_POLICIES",
    "TABLE1_WORKLOADS",
    "Profile",
    "cell_cost",
    "code_fingerprint",
    "declare",
    "run_cell",
    "scaling_requests",
    "solver_status",
    "source_code",
]

TABLE1_POLICIES = (
    "random", "round_robin", "power_of_two", "jsq", "least_load", "br0",
    "brh-survival", "brh-exact", "brh-learned", "brh-oracle",
)
"""Table 1's rows (least_load, the token-aware baseline, is ours; the paper has no such row)."""

TABLE1_WORKLOADS = ("azure-2024-long", "servegen-r1", "mooncake-conv", "azure-conv-2023")
"""Decode-heavy first (the paper's regime), then two short-output conversation traces."""

SCALING_POLICIES = ("random", "round_robin", "power_of_two", "jsq", "least_load", "br0", "brh-oracle")
STEP_POLICIES = SCALING_POLICIES
GENERATED = ("servegen-r1", "azure-2024", "azure-2024-long")
"""Bundled generators (they draw any number of requests; the others are fixed replays)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """Sizes of one reproduction mode. Request counts are totals before the train/test split
    (predictor-based rows fit on the leading ``train_fraction`` and every policy of the
    comparison runs on the rest). Table 1 runs ``seeds`` on generated workloads and
    ``replay_seeds`` on fixed replays (whose seed only moves the random policies);
    ``single_seed_policies`` (slow ones) run the first seed only."""

    name: str
    slots: int = 64
    policies: tuple[str, ...] | None = None
    table1_workloads: tuple[str, ...] = TABLE1_WORKLOADS
    table1_requests: int = 40_000
    table1_replay_requests: int | None = None
    seeds: tuple[int, ...] = (0, 1, 2)
    replay_seeds: tuple[int, ...] = (0,)
    single_seed_policies: tuple[str, ...] = ("brh-learned",)
    calibrated_workloads: tuple[str, ...] = ("azure-2024-long", "servegen-r1")
    calibrated_slots: int = 16
    calibrated_step: tuple[float, float] = (0.025, 1.2e-6)
    scaling_workloads: tuple[str, ...] = ("servegen-r1", "azure-2024-long")
    scaling_seeds: tuple[int, ...] = (0, 1, 2)
    scaling_replicas: tuple[int, ...] = (4, 8, 16, 32, 64, 128)
    scaling_base: int = 20_000
    scaling_per_slot: int = 30
    scaling_cap: int = 240_000
    step_workload: str = "azure-2024-long"
    step_requests: int = 20_000
    step_ratios: tuple[float, ...] = (0.0, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 16.0)
    slot_values: tuple[int, ...] = (16, 32, 64, 128)
    tick_workload: str = "azure-2024-long"
    tick_replicas: tuple[int, ...] = (4, 8, 16, 32, 64, 128)
    tick_pool_factors: tuple[int, ...] = (1, 2, 4)
    tick_states: int = 200
    tick_repeats: int = 5
    tick_per_slot: int = 4
    tick_min_requests: int = 4_000
    gap_replicas: tuple[int, ...] = (4, 8, 16)
    gap_workloads: tuple[str, ...] = ("azure-2024-long", "azure-conv-2023", "")
    gap_instances: int = 60
    gap_time_limit_s: float = 10.0
    clairvoyant_instances: int = 12
    clairvoyant_requests: int = 16
    clairvoyant_time_limit_s: float = 30.0
    ratio_replicas: tuple[int, ...] = (2, 3, 4)
    ratio_instances: int = 100
    balls_bins: tuple[int, ...] = tuple(2**k for k in range(2, 15))
    balls_reps: int = 20

    def __post_init__(self) -> None:
        if self.name not in ("quick", "full", "test"):
            raise ValueError(f"{self.name=} must be 'quick', 'full' or 'test'")


FULL = Profile(name="full")
"""The committed reproduction (16,043 cells: 64 min on 2 cores with ``--jobs 2`` from an empty
cache, beside a test run; 2 h 40 m on a box far busier)."""

QUICK = Profile(
    name="quick", table1_requests=6_000, table1_replay_requests=6_000, seeds=(0,),
    scaling_seeds=(0,),
    scaling_workloads=("servegen-r1",), scaling_replicas=(4, 8, 16, 32), scaling_base=4_000,
    scaling_per_slot=8, scaling_cap=40_000, step_requests=4_000,
    step_ratios=(0.0, 0.25, 1.0, 4.0, 16.0), slot_values=(16, 64), tick_replicas=(4, 8, 16, 32), tick_pool_factors=(2,),
    tick_states=60, tick_repeats=3, tick_per_slot=2, gap_replicas=(8,), gap_instances=10,
    gap_time_limit_s=5.0, clairvoyant_instances=3, clairvoyant_requests=10,
    clairvoyant_time_limit_s=10.0, ratio_replicas=(2, 3), ratio_instances=10,
    balls_bins=tuple(2**k for k in range(2, 12)), balls_reps=5,
)
"""Minutes on a laptop: small sizes, one seed, G ≤ 32."""


def scaling_requests(profile: Profile, replicas: int, slots: int) -> int:
    """Requests for a G-scaling cell: max(base, per_slot·G·B), capped — the cluster must turn
    over its G·B slots many times for the loaded phase to dominate the warm-up and drain."""
    return int(min(max(profile.scaling_base, profile.scaling_per_slot * replicas * slots),
                   profile.scaling_cap))


_PREDICTOR_CODE = ("policies/brh.py", "predictors/", "projection.py")


def source_code(source: bytes | str) -> bytes:
    """What a fingerprint hashes of one Python file: its syntax tree without docstrings or any
    other bare string statement (``ast.dump``, no positions), so that comments, docstrings,
    blank lines and re-wrapped lines leave it unchanged while any change to what runs moves it."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [stmt for stmt in body if not (
                isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str))]
            node.body = kept or [ast.Pass()]
        if isinstance(node, ast.JoinedStr):  # 3.12 parses some f-string format specs with an empty part
            node.values = [v for v in node.values if not (isinstance(v, ast.Constant) and v.value == "")]
    return _dump(tree).encode()


def _dump(tree: ast.AST) -> str:
    """``ast.dump`` as Python 3.11 writes it, on any later Python too, so that a fingerprint —
    and so the committed results' provenance and the cells' cache — does not depend on the
    interpreter: 3.13 leaves empty fields out unless told (``show_empty``), and 3.12 added
    ``type_params`` to functions and classes, empty in code that 3.11 runs (and
    :func:`source_code` drops the empty f-string parts 3.12's parser adds)."""
    text = ast.dump(tree, show_empty=True) if sys.version_info >= (3, 13) else ast.dump(tree)
    return text.replace(", type_params=[]", "")


@lru_cache(maxsize=4)
def code_fingerprint(part: str) -> str:
    """A short hash of the source code a cell's result depends on (:func:`source_code`: the syntax
    trees, docstrings and comments left out), stored in the cell (so in its cache key and CSV
    row): ``base`` = ``balanceroute.core`` without the BR-H / predictor modules, ``brh`` = all of
    ``core``, ``solvers`` = ``base`` + ``balanceroute.solvers``; each with the policy catalogue
    (``balanceroute/catalogue.py``), which builds every policy. Editing the simulator re-runs
    every cell; editing a predictor re-runs only ``brh-*`` cells; editing a docstring, none."""
    import balanceroute.catalogue as catalogue
    import balanceroute.core as core

    roots = [("core", Path(core.__file__).parent)]
    if part == "solvers":
        import balanceroute.solvers as solvers

        roots.append(("solvers", Path(solvers.__file__).parent))
    digest = hashlib.sha256()
    for name, root in roots:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if name == "core" and part != "brh" and rel.startswith(_PREDICTOR_CODE):
                continue
            digest.update(f"{name}/{rel}\0".encode())
            digest.update(source_code(path.read_bytes()))
    digest.update(source_code(Path(catalogue.__file__).read_bytes()))
    return digest.hexdigest()[:12]


def solver_status() -> tuple[bool, str, str | None, str | None]:
    """(usable, message, tick solver, clairvoyant solver): whether the exact solvers and their
    gap tooling import and have a backend."""
    try:
        from balanceroute.solvers import available_solvers, bridge, factories, gap  # noqa: F401
    except ImportError as exc:
        return False, f"solvers not installed ({exc})", None, None
    tick = [s for s in ("tick-cpsat", "tick-highs", "tick-cbc") if s in available_solvers("tick")]
    clair = [s for s in ("clairvoyant-cpsat", "clairvoyant-highs", "clairvoyant-cbc")
             if s in available_solvers("clairvoyant")]
    if not tick or not clair:
        return False, "solvers installed but no MILP/CP-SAT backend is available", None, None
    return True, f"solvers: {tick[0]}, {clair[0]}", tick[0], clair[0]


def declare(profile: Profile, available: list[str], *, solvers: bool | None = None) -> dict[str, list[Cell]]:
    """Every experiment's cells for ``profile``; policies not in ``available`` (or not in
    ``profile.policies`` when set) are left out (the report marks them "not available");
    the solver experiments only when :func:`solver_status` finds the solvers usable and
    ``solvers`` is not False."""
    have = set(available) & set(profile.policies or available)
    b = profile.slots
    grids: dict[str, list[Cell]] = {}

    t1 = tuple(p for p in TABLE1_POLICIES if p in have)
    grids["table1"] = [
        Cell(experiment="table1", workload=w, policy=p, replicas=8, slots=b,
             requests=profile.table1_requests if w in GENERATED else profile.table1_replay_requests,
             seed=s)
        for w in profile.table1_workloads
        for s in (profile.seeds if w in GENERATED else profile.replay_seeds) for p in t1
        if s == profile.seeds[0] or p not in profile.single_seed_policies
    ]

    cb, ca = profile.calibrated_step
    grids["table1_calibrated"] = [
        Cell(experiment="table1_calibrated", workload=w, policy=p, replicas=8,
             slots=profile.calibrated_slots, step_b=cb, step_a=ca,
             requests=profile.table1_requests if w in GENERATED else profile.table1_replay_requests,
             seed=s)
        for w in profile.calibrated_workloads
        for s in (profile.seeds if w in GENERATED else profile.replay_seeds) for p in t1
        if s == profile.seeds[0] or p not in profile.single_seed_policies
    ]

    sc = tuple(p for p in SCALING_POLICIES if p in have)
    grids["scaling"] = [
        Cell(experiment="scaling", workload=w, policy=p, replicas=g, slots=b,
             requests=scaling_requests(profile, g, b), seed=s)
        for w in profile.scaling_workloads for g in profile.scaling_replicas
        for s in profile.scaling_seeds for p in sc
    ]

    base = Cell(experiment="x")
    st = tuple(p for p in STEP_POLICIES if p in have)
    grids["step_model"] = [
        Cell(experiment="step_model", workload=profile.step_workload, policy=p, replicas=8,
             slots=b, requests=profile.step_requests, seed=0, step_b=base.step_b,
             step_a=base.step_a * r, options=(("a_over_b_rel", r),))
        for r in profile.step_ratios for p in st
    ]

    grids["slots"] = [
        Cell(experiment="slots", workload=profile.step_workload, policy=p, replicas=8, slots=bv,
             requests=profile.step_requests, seed=0)
        for bv in profile.slot_values for p in st
    ]

    tick_policies = [p for p in ("br0", "brh-survival") if p in have]
    grids["tick_timing"] = [
        Cell(experiment="tick_timing", kind="tick_timing", workload=profile.tick_workload,
             policy=p, replicas=g, slots=b, requests=max(profile.tick_min_requests, profile.tick_per_slot * g * b),
             pool_size=f * g, seed=0, group=(p,),
             options=(("states", profile.tick_states), ("repeats", profile.tick_repeats)))
        for g in profile.tick_replicas for f in profile.tick_pool_factors for p in tick_policies
        if p == "br0" or f == 2
    ]

    grids["balls_into_bins"] = [
        Cell(experiment="balls_into_bins", kind="balls", replicas=n, slots=1, seed=d,
             options=(("choices", d), ("reps", profile.balls_reps)))
        for n in profile.balls_bins for d in (1, 2)
    ]

    usable, _, tick_solver, clair_solver = solver_status()
    if usable and solvers is not False:
        gap_policies = ("br0", "jsq", "least_load", "power_of_two", "random")
        grids["tick_gap"] = [
            Cell(experiment="tick_gap", kind="tick_gap", workload=w, replicas=g, slots=b,
                 pool_size=2 * g, requests=4_000 if w else None, seed=0, group=gap_policies,
                 options=(("source", "trace" if w else "random"), ("objective", obj),
                          ("solver", tick_solver), ("instances", profile.gap_instances),
                          ("time_limit_s", profile.gap_time_limit_s)))
            for g in profile.gap_replicas for w in profile.gap_workloads
            for obj in ("f_score", "imbalance")
        ]
        grids["clairvoyant_gap"] = [
            Cell(experiment="clairvoyant_gap", kind="clairvoyant_gap", workload="azure-conv-2023",
                 replicas=4, slots=3, requests=profile.clairvoyant_requests, seed=k,
                 group=gap_policies,
                 options=(("solver", clair_solver), ("time_limit_s", profile.clairvoyant_time_limit_s),
                          ("max_model_steps", 40)))
            for k in range(profile.clairvoyant_instances)
        ]
        grids["competitive_ratio"] = [
            Cell(experiment="competitive_ratio", kind="competitive_ratio", replicas=g, slots=2,
                 requests=8, seed=g, group=gap_policies,
                 options=(("solver", clair_solver), ("instances", profile.ratio_instances),
                          ("time_limit_s", 20.0)))
            for g in profile.ratio_replicas
        ]
    if profile.name in ("quick", "full"):  # decision quality and TTFT (analysis/quality.py)
        grids.update(declare_quality(profile.name, sorted(have)))
        grids.update(declare_replicas(profile.name, sorted(have)))  # KV budgets, replica speed
    return {name: [_with_code(c) for c in cells] for name, cells in grids.items()}


def _with_code(cell: Cell) -> Cell:
    if cell.kind == "balls":
        return cell
    if cell.kind in ("tick_gap", "clairvoyant_gap", "competitive_ratio"):
        part = "solvers"
    else:
        part = "brh" if cell.policy.startswith(("brh", "bfio")) else "base"
    return dataclasses.replace(cell, code=code_fingerprint(part))


def cell_cost(cell: Cell) -> float:
    """A rough relative cost (about 15-20 µs a unit in quick mode), to start the longest
    cells first and to weigh cells in ``reproduce``'s time left. Calibrated on the per-cell
    times of a quick run (561 cells): a BR-H or BF-IO run costs three of a baseline's,
    brh-learned (with its predictor's fit) fifteen, a quality cell half a simulation of its
    size, an exact-solver tick-gap cell a quarter of a 20,000-request simulation."""
    if cell.kind == "balls":
        return cell.replicas * cell.option("reps", 1) * 1e-2
    if cell.kind == "tick_gap":
        return 5e4
    if cell.kind == "competitive_ratio":
        return 4e4
    if cell.kind == "clairvoyant_gap":
        return 2e5
    weight = 15.0 if cell.policy == "brh-learned" else \
        3.0 if cell.policy.startswith(("brh", "bfio")) else 1.0
    if cell.kind == "quality":
        weight *= 0.5
    return (cell.requests or 20_000) * weight * (1.0 + math.log2(cell.replicas) / 4)


# ----------------------------------------------------------------------------- runners


def _step_model(cell: Cell):
    from balanceroute.core.dynamics import StepModel

    return StepModel(b=cell.step_b, a=cell.step_a, c=cell.step_c)


def _split(cell: Cell, *, always: bool):
    """The cell's test workload and a ``factory(name) -> Policy``.

    With ``always`` (comparisons) and ``train_fraction`` f > 0 the trace is split here, the
    same way for every policy whether or not a predictor is fitted: the first ⌊f·n⌋ requests
    train, the rest are simulated — so a baseline's cell does not change when predictor-based
    rows appear. Otherwise only cells of policies that fit a predictor split. Policies come
    from :func:`~.policies.make_factory`; if its split for such a policy differs from this
    one, the policy is built with the catalogue's ``build_policy`` on this split instead.
    """
    from balanceroute.core.workloads import load_workload

    workload = load_workload(cell.workload, requests=cell.requests, seed=cell.seed,
                             min_output=cell.min_output)
    kw = {"seed": cell.seed,
          "train_fraction": cell.train_fraction if cell.train_fraction > 0 else 0.5}
    needs = policy_entry(cell.policy).training
    if cell.train_fraction <= 0 or not (always or needs):
        factory = make_factory(workload, **{**kw, "train_fraction": kw["train_fraction"] if needs else 0.0})
        return factory.test_workload, factory
    cut = int(len(workload) * cell.train_fraction)
    train = workload.take(np.arange(cut))
    test = workload.take(np.arange(cut, len(workload)))
    if not needs:
        return test, make_factory(test, **{**kw, "train_fraction": 0.0})
    factory = make_factory(workload, **kw)
    theirs = factory.test_workload
    if (factory.train_workload is not None and len(theirs) == len(test)
            and np.array_equal(theirs.prompt_len, test.prompt_len)
            and np.array_equal(theirs.output_len, test.output_len)):
        return test, factory
    def build(name: str):
        return build_policy(name, train=train, test=test, seed=cell.seed)

    return test, build


def _run_simulate(cell: Cell) -> list[dict[str, Any]]:
    """One policy on one workload and cluster: the simulator's metrics plus the loaded phase's
    mean envelope, load and active count, and the cross-replica load spread on 256 sampled
    loaded steps (mean standard deviation, mean max − mean gap, skewness of the deviations)."""
    from balanceroute.core.dynamics import replica_loads_at
    from balanceroute.core.simulator import SimConfig, simulate

    test, factory = _split(cell, always=True)
    config = SimConfig(num_replicas=cell.replicas, slots=cell.slots, pool_size=cell.pool_size,
                       step_model=_step_model(cell), record_series=True, check_assignments=False)
    result = simulate(test, factory(cell.policy), config)
    m = dict(result.metrics)
    s = result.series
    k_end = max(int(m["loaded_steps"]), 1)
    steps = np.unique(np.linspace(0, k_end - 1, min(256, k_end)).astype(np.int64))
    loads = replica_loads_at(result.replica, result.start_step, result.finish_step,
                             test.prompt_len.astype(np.float64), steps, cell.replicas)
    spread = loads.std(axis=1, ddof=1) if cell.replicas > 1 else np.zeros(steps.shape[0])
    dev = (loads - loads.mean(axis=1, keepdims=True)).ravel()
    skew = float((dev**3).mean() / dev.std() ** 3) if dev.std() > 0 else math.nan
    return [{
        "test_requests": len(test),
        **m,
        "envelope_mean": float(s["envelope"][:k_end].mean()),
        "total_load_mean": float(s["total_load"][:k_end].mean()),
        "active_mean": float(s["active"][:k_end].mean()),
        "load_std_mean": float(spread.mean()),
        "load_gap_mean": float((loads.max(axis=1) - loads.mean(axis=1)).mean()),
        "load_dev_skew": skew,
    }]


class _TickProbe:
    """A policy wrapper: times every ``inner.assign`` call and keeps seeded reservoir samples of
    the tick states it sees — one over every tick (``all``: the real mix) and one over the ticks
    that start in the Stage-1 regime (Σ free > ``s_greedy``; the others only run Stage 2).
    The decisions are the inner policy's."""

    name = "probe"

    def __init__(self, inner: Any, s_greedy: int, capacity: int, rng: np.random.Generator) -> None:
        self.inner, self.s_greedy, self.capacity, self.rng = inner, s_greedy, capacity, rng
        self.live: dict[str, list[int]] = {"stage1": [], "stage2": []}
        self.states: dict[str, list[tuple]] = {"all": [], "stage1": []}
        self.seen = {"all": 0, "stage1": 0}

    def _keep(self, reservoir: str, snap: tuple) -> None:
        self.seen[reservoir] += 1
        kept = self.states[reservoir]
        if len(kept) < self.capacity:
            kept.append(snap)
        else:
            j = int(self.rng.integers(0, self.seen[reservoir]))
            if j < self.capacity:
                kept[j] = snap

    def assign(self, state, pool):
        """Time the inner decision, sample the state, return the decision."""
        t0 = time.perf_counter_ns()
        out = self.inner.assign(state, pool)
        dt = time.perf_counter_ns() - t0
        regime = "stage1" if int(state.free_slots.sum()) > self.s_greedy else "stage2"
        self.live[regime].append(dt)
        snap = (state.loads.copy(), state.free_slots.copy(), pool.prompt_len.copy(),
                pool.wait.copy(), regime)
        self._keep("all", snap)
        if regime == "stage1":
            self._keep("stage1", snap)
        return out


def _time_call(fn: Callable[[], Any], repeats: int) -> int:
    best = None
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        dt = time.perf_counter_ns() - t0
        best = dt if best is None else min(best, dt)
    return int(best or 0)


def _summary(ns: list[int] | np.ndarray, placed: np.ndarray | None) -> dict[str, float]:
    us = np.asarray(ns, dtype=np.float64) / 1e3
    out = {"ticks": int(us.shape[0]), "p50_us": float(np.percentile(us, 50)),
           "p99_us": float(np.percentile(us, 99)), "mean_us": float(us.mean()),
           "max_us": float(us.max())}
    if placed is not None:
        out["placed_mean"] = float(placed.mean())
        out["per_request_p50_us"] = float(np.percentile(us / np.maximum(placed, 1), 50))
    return out


def _run_tick_timing(cell: Cell) -> list[dict[str, Any]]:
    """Tick latency on states met in a saturated run of ``cell.policy``.

    ``live``: wall time of the policy's own ``assign`` during the run (BR-H: projection
    included). On the sampled states of each regime, :func:`two_stage_assign` with BR-0 scores
    is re-timed (minimum of ``repeats``): ``whole`` with the policy's S_greedy = 8,
    ``stage1_only`` (S_greedy = −1: every placement is a Stage-1 greedy pick) and
    ``stage2_only`` (S_greedy = ∞: every placement goes through the Stage-2 subset search).
    """
    from balanceroute.core.simulator import SimConfig, simulate
    from balanceroute.core.two_stage import two_stage_assign

    test, factory = _split(cell, always=False)
    inner = factory(cell.policy)
    s_greedy = int(getattr(inner, "s_greedy", 8))
    probe = _TickProbe(inner, s_greedy, int(cell.option("states", 200)),
                       np.random.default_rng(cell.seed))
    config = SimConfig(num_replicas=cell.replicas, slots=cell.slots, pool_size=cell.pool_size,
                       step_model=_step_model(cell), check_assignments=False)
    simulate(test, probe, config)

    repeats = int(cell.option("repeats", 5))
    one = np.ones(1)
    measures = (("whole", s_greedy), ("stage1_only", -1), ("stage2_only", 1 << 40))
    timed: dict[str, list[tuple]] = {}
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for reservoir, states in probe.states.items():
            acc = []
            for loads, free, prompt, wait, regime in states:
                args = (loads[:, None], free, prompt, wait)
                kw = {"d": one, "alpha": 1.0, "beta": float(cell.replicas), "r_max": 4,
                      "deadline_s": 30.0}
                times = [_time_call(lambda args=args, kw=kw, sg=sg: two_stage_assign(
                    *args, s_greedy=sg, **kw), repeats) for _, sg in measures]
                acc.append((regime, min(int(free.sum()), prompt.shape[0]), *times))
            timed[reservoir] = acc
    finally:
        if gc_was:
            gc.enable()

    total = len(probe.live["stage1"]) + len(probe.live["stage2"])
    rows: list[dict[str, Any]] = []
    for regime in ("all", "stage1", "stage2"):
        live = probe.live["stage1"] + probe.live["stage2"] if regime == "all" else probe.live[regime]
        if live:
            rows.append({"measure": "live", "regime": regime, **_summary(live, None)})
        sample = (timed["all"] if regime == "all" else timed["stage1"] if regime == "stage1"
                  else [t for t in timed["all"] if t[0] == "stage2"])
        if not sample:
            continue
        placed = np.array([t[1] for t in sample], dtype=np.float64)
        for j, (label, _) in enumerate(measures):
            rows.append({"measure": label, "regime": regime,
                         **_summary([t[2 + j] for t in sample], placed)})
    for row in rows:
        row["ticks_seen"] = total
        row["stage1_share"] = len(probe.live["stage1"]) / max(total, 1)
    return rows


def _run_balls(cell: Cell) -> list[dict[str, Any]]:
    """Balls into bins with m = n = ``cell.replicas``: one row per repetition."""
    d = int(cell.option("choices", 1))
    rng = np.random.default_rng([cell.seed, cell.replicas, d])
    return [{"rep": r, "bins": cell.replicas, "balls": cell.replicas, "choices": d,
             "max_load": balls_into_bins_max_load(cell.replicas, cell.replicas, d, rng)}
            for r in range(int(cell.option("reps", 10)))]


def _run_tick_gap(cell: Cell) -> list[dict[str, Any]]:
    """Per-tick optimality: ticks met by BR-0 in a saturated simulation of ``cell.workload``
    (``source=trace``, evenly spaced past the warm-up fill) or random saturated-regime ticks
    (``source=random``), solved exactly; one row per tick × policy."""
    from balanceroute.solvers.gap import tick_gap_rows

    n = int(cell.option("instances", 20))
    objective = str(cell.option("objective", "f_score"))
    if cell.option("source") == "trace":
        from balanceroute.core.policies import get_policy
        from balanceroute.core.simulator import SimConfig, simulate
        from balanceroute.core.workloads import load_workload
        from balanceroute.solvers.bridge import TickRecorder

        wl = load_workload(cell.workload, requests=cell.requests, seed=cell.seed)
        recorder = TickRecorder(inner=get_policy("br0"), objective=objective)
        simulate(wl, recorder, SimConfig(num_replicas=cell.replicas, slots=cell.slots,
                                         pool_size=cell.pool_size, check_assignments=False))
        ticks = recorder.ticks[len(recorder.ticks) // 10:]  # past the warm-up fill
        step = max(1, len(ticks) // n)
        instances = ticks[::step][:n]
    else:
        from balanceroute.solvers.factories import random_tick_instance

        rng = np.random.default_rng(cell.seed)
        instances = [random_tick_instance(rng, num_replicas=cell.replicas,
                                          pool_size=cell.pool_size or 2 * cell.replicas,
                                          objective=objective, name=f"tick{k:03d}")
                     for k in range(n)]
    return tick_gap_rows(instances, policies=cell.group, solver=str(cell.option("solver")),
                         time_limit_s=float(cell.option("time_limit_s", 10.0)), seed=cell.seed,
                         lp_bound=False)


def _run_clairvoyant_gap(cell: Cell) -> list[dict[str, Any]]:
    """One clairvoyant episode: ``cell.requests`` consecutive trace requests (slice number
    ``cell.seed``), all released at step 0, solved on a model coarsened to ≤ ``max_model_steps``
    steps; each policy's Σ_k I(k) against the best schedule found."""
    from balanceroute.core.workloads import load_workload
    from balanceroute.solvers.factories import clairvoyant_from_workload
    from balanceroute.solvers.gap import clairvoyant_gap_rows

    n = int(cell.requests or 16)
    wl = load_workload(cell.workload, requests=(cell.seed + 1) * n)
    episode = clairvoyant_from_workload(wl, first=cell.seed * n, num_requests=n,
                                        num_replicas=cell.replicas, slots=cell.slots)
    fine = dataclasses.replace(episode, step=1).model_horizon
    q = max(1, math.ceil(fine / int(cell.option("max_model_steps", 40))))
    episode = dataclasses.replace(episode, step=q)
    return clairvoyant_gap_rows([episode], policies=cell.group, solver=str(cell.option("solver")),
                                time_limit_s=float(cell.option("time_limit_s", 30.0)), seed=0)


def _run_competitive_ratio(cell: Cell) -> list[dict[str, Any]]:
    """Tiny random episodes solved exactly (q = 1) for Σ_k M(k) (step-time objective with
    b = 0, a = 1): the ratio online / clairvoyant, to set against the 2 − 1/G bound."""
    from balanceroute.solvers.factories import random_clairvoyant_instance
    from balanceroute.solvers.gap import clairvoyant_gap_rows

    rng = np.random.default_rng([cell.seed, cell.replicas])
    rows: list[dict[str, Any]] = []
    for k in range(int(cell.option("instances", 20))):
        inst = random_clairvoyant_instance(
            rng, num_requests=int(cell.requests or 8), num_replicas=cell.replicas,
            slots=cell.slots, max_prompt=20, max_output=6, max_release=4,
            objective="step_time", name=f"ep{k:03d}")
        inst = dataclasses.replace(inst, step_b=0.0, step_a=1.0)
        for row in clairvoyant_gap_rows([inst], policies=cell.group,
                                        solver=str(cell.option("solver")),
                                        time_limit_s=float(cell.option("time_limit_s", 20.0)),
                                        seed=0):
            opt = row["optimum"]
            row["ratio"] = row["heuristic"] / opt if opt and math.isfinite(opt) else math.nan
            rows.append(row)
    return rows


RUNNERS: dict[str, Callable[[Cell], list[dict[str, Any]]]] = {
    "simulate": _run_simulate,
    "quality": run_quality_cell,
    "replicas": run_replicas_cell,
    "tick_timing": _run_tick_timing,
    "balls": _run_balls,
    "tick_gap": _run_tick_gap,
    "clairvoyant_gap": _run_clairvoyant_gap,
    "competitive_ratio": _run_competitive_ratio,
}
"""Cell kind → runner."""

run_cell = RunByKind(RUNNERS)
"""The reproduction's runner: each cell by its kind (what ``run_grid`` is given)."""
