"""Load the router did not send, in the simulator: foreign traffic, two routers, a restart.

A router knows what it placed (its ledger); everything else it sees only through the engines'
reports, polled every ``poll_s`` (0.5 s, the proxy's default; a report is used until the next
one: its age is up to ``poll_s``) and trusted for three polls, as the proxy does
(``serving/signals.py``). What each router sees, per replica g:

* ``full``        the true loads now (one router with full knowledge: the reference);
* ``true``        the true loads now, but each of two routers with its own pool (``two_routers``
                  only: what splitting the pool costs, knowledge aside);
* ``reconciled``  own_g(now) + max(0, reported_g − own_g(at the report)) — the proxy's rule;
* ``ledger``      own_g(now) only (no engine state);
* ``reports``     reported_g only (the engine's tokens as other routers use them).

Scenarios (``SCENARIOS``): ``foreign10`` / ``foreign30`` — 10 % / 30 % of the requests are placed
by someone else, uniformly at random over the free slots; ``two_routers`` — two routers of the
same policy split the requests 50/50 (each sees the other only through the reports; within a
tick they decide one after the other on the same reports, the order alternating); ``restart`` —
the router's ledger is lost halfway through the run (its requests from before become foreign;
a restarted proxy reads the engines at once). Rows: BR (``br0``) with each view, least-load
(``least_load``) on the reports and reconciled. The reference of every row is ``br0`` with the
``full`` view on the same scenario (for ``two_routers`` and ``restart``: one router placing
everything, never restarted). Reported: the mean imbalance I = G·M − ΣL over the loaded phase
(``core.dynamics``), as a ratio to the reference, geometric mean over held-out draws with its
95 % interval (``analysis/quality.py``'s :func:`paired_interval`); for ``restart`` also over the
window from the restart until the last request placed before it finishes (or the loaded phase
ends, if sooner).

Slots are the engines' (every view has the true free slots: a request sent to a full replica
would wait there); what differs is the KV load a router believes. Implemented as a policy
wrapper on the simulator's generic loop (``core/simulator.py`` unchanged). ``balanceroute
foreign`` runs it (``--quick``: about 20 s).
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from balanceroute.core.state import Assignment, ClusterState, PoolView

__all__ = ["SCENARIOS", "ForeignScenario", "ROWS", "add_foreign_args", "foreign_lines", "run_foreign",
           "run_foreign_cell", "run_foreign_grid"]

SCENARIOS = ("foreign10", "foreign30", "two_routers", "restart")
ROWS = (("br0", "full"), ("br0", "reconciled"), ("br0", "ledger"), ("br0", "reports"),
        ("least_load", "reports"), ("least_load", "reconciled"), ("br0", "true"))
VIEWS = ("full", "true", "reconciled", "ledger", "reports")
STALE_AFTER_POLLS = 3.0  # as serving/signals.py


@dataclass(frozen=True, slots=True, kw_only=True)
class ForeignScenario:
    """Who places which request and what the routers see.

    ``foreign``: share of requests placed by someone else (random over free slots);
    ``routers``: how many routers split the rest evenly; ``restart_frac``: the router restarts
    when this share of the run's requests has been placed (``None``: never); ``poll_s``: the
    reporting period; ``view``: ``full``, ``reconciled``, ``ledger`` or ``reports``.
    """

    foreign: float = 0.0
    routers: int = 1
    restart_frac: float | None = None
    poll_s: float = 0.5
    view: str = "full"

    def __post_init__(self) -> None:
        if not 0.0 <= self.foreign < 1.0:
            raise ValueError(f"{self.foreign=} must be in [0, 1)")
        if self.routers < 1:
            raise ValueError(f"{self.routers=} must be >= 1")
        if self.view not in VIEWS:
            raise ValueError(f"{self.view=} must be one of {', '.join(VIEWS)}")
        if not self.poll_s > 0:
            raise ValueError(f"{self.poll_s=} must be > 0")


def scenario(name: str, view: str, poll_s: float = 0.5) -> ForeignScenario:
    """The named scenario with ``view`` (``full``, the reference, is one router; a restart
    loses it nothing)."""
    if name.startswith("foreign"):
        return ForeignScenario(foreign=int(name[7:]) / 100, poll_s=poll_s, view=view)
    if name == "two_routers":
        return ForeignScenario(routers=1 if view == "full" else 2, poll_s=poll_s, view=view)
    if name == "restart":
        return ForeignScenario(restart_frac=0.5, poll_s=poll_s, view=view)  # full: nothing lost
    raise ValueError(f"scenario {name!r} must be one of {', '.join(SCENARIOS)}")


class ForeignTraffic:
    """A policy wrapper: places foreign requests at random, then lets each router place its own
    with the loads its ``view`` gives it (module docstring). ``owner[i]``: -1 foreign, else the
    router of request i."""

    name = "foreign"

    def __init__(self, routers: list[Any], owner: NDArray[np.int64], spec: ForeignScenario,
                 rng: np.random.Generator, restart_after: int | None = None) -> None:
        self.routers = routers
        self.pristine = [copy.deepcopy(r) for r in routers]
        self.owner = owner
        self.spec = spec
        self.rng = rng
        self.restart_after = restart_after
        self.placed = 0
        self.epoch_start = np.zeros(owner.shape[0], dtype=bool)  # placed in the router's current life
        self.restart_step: int | None = None
        self.restart_time: float | None = None
        self.next_poll = -math.inf
        self.report: NDArray[np.int64] | None = None
        self.report_time = -math.inf
        self.own_at: NDArray[np.int64] | None = None  # per router: own loads when the report came
        self.ticks = 0

    def _own(self, state: ClusterState, tokens: NDArray[np.int64], r: int) -> NDArray[np.int64]:
        ids = state.active_ids
        mine = (self.owner[ids] == r) & self.epoch_start[ids]
        return np.bincount(state.active_replica[mine], weights=tokens[mine],
                           minlength=state.num_replicas).astype(np.int64)

    def assign(self, state: ClusterState, pool: PoolView) -> Assignment:
        """Foreign placements, then each router's (see the class docstring)."""
        g_count = state.num_replicas
        now = state.now
        if self.restart_after is not None and self.restart_step is None and self.placed >= self.restart_after:
            self.restart_step, self.restart_time = state.step, now
            self.epoch_start[:] = False  # the ledger is gone; the engines still run it all
            self.routers = [copy.deepcopy(r) for r in self.pristine]
            self.next_poll = now  # a restarted proxy reads the engines before it is ready
            self.report = None
        tokens = state.active_prompt + state.active_age
        owns = [self._own(state, tokens, r) for r in range(len(self.routers))]
        if now >= self.next_poll:  # a poll: the engines' loads now, the ledgers as they are now
            self.report = state.loads.copy()
            self.report_time = now
            self.own_at = np.stack(owns)
            self.next_poll = now + self.spec.poll_s
        fresh = self.report is not None and now - self.report_time <= STALE_AFTER_POLLS * self.spec.poll_s

        free = state.free_slots.copy()
        true_loads = state.loads.copy()
        out_j: list[NDArray[np.int64]] = []
        out_g: list[NDArray[np.int64]] = []
        owner = self.owner[pool.request_ids]

        # someone else's requests: uniformly at random over the free slots
        for j in np.flatnonzero(owner < 0):
            if not free.any():
                break
            g = int(self.rng.choice(g_count, p=free / free.sum()))
            free[g] -= 1
            true_loads[g] += pool.prompt_len[j]
            out_j.append(np.array([j]))
            out_g.append(np.array([g]))

        order = list(range(len(self.routers)))
        if self.ticks % 2:
            order.reverse()
        self.ticks += 1
        for r in order:
            mine = np.flatnonzero(owner == r)
            if mine.shape[0] == 0 or not free.any():
                continue
            view = self.spec.view
            if view in ("full", "true"):
                loads = true_loads
            elif view == "ledger" or not fresh:
                loads = owns[r] if view != "reports" else np.zeros(g_count, dtype=np.int64)
            elif view == "reports":
                loads = self.report
            else:
                loads = owns[r] + np.maximum(self.report - self.own_at[r], 0)
            sub = ClusterState(loads=np.asarray(loads, dtype=np.int64).copy(), free_slots=free.copy(),
                               num_active=state.free_slots + state.num_active - free, step=state.step, now=now)
            view_pool = PoolView(prompt_len=pool.prompt_len[mine], wait=pool.wait[mine],
                                 request_ids=pool.request_ids[mine])
            decision = self.routers[r].assign(sub, view_pool)
            if len(decision) == 0:
                continue
            js, gs = mine[decision.pool_index], decision.replica.astype(np.int64)
            np.subtract.at(free, gs, 1)
            np.add.at(true_loads, gs, pool.prompt_len[js])
            self.epoch_start[pool.request_ids[js]] = True
            out_j.append(js)
            out_g.append(gs)
        if not out_j:
            return Assignment()
        js, gs = np.concatenate(out_j), np.concatenate(out_g)
        self.placed += js.shape[0]
        return Assignment(pool_index=js.astype(np.int64), replica=gs)


def run_foreign_cell(workload: Any, policy: str, spec: ForeignScenario, *, replicas: int, slots: int,
                     seed: int) -> dict[str, float]:
    """One simulation: ``policy`` routers in ``spec`` on ``workload``; the mean imbalance over
    the loaded phase and (restart) over the window after the restart."""
    from balanceroute.core.policies import get_policy
    from balanceroute.core.simulator import SimConfig, simulate

    rng = np.random.default_rng(seed)
    n = len(workload)
    owner = np.where(rng.random(n) < spec.foreign, -1, rng.integers(0, spec.routers, n)).astype(np.int64)
    routers = [get_policy(policy) for _ in range(spec.routers)]
    restart = None if spec.restart_frac is None else int(spec.restart_frac * n)
    wrapper = ForeignTraffic(routers, owner, spec, np.random.default_rng(seed + 1), restart)
    config = SimConfig(num_replicas=replicas, slots=slots, record_series=spec.restart_frac is not None,
                       check_assignments=False)  # the wrapper's routers and the loop check slots
    result = simulate(workload, wrapper, config, engine="generic")
    row = {"mean_imbalance": float(result.metrics["mean_imbalance"]),
           "throughput_loaded_tok_s": float(result.metrics["throughput_loaded_tok_s"])}
    if spec.restart_frac is not None and result.series is not None:
        k_r = wrapper.restart_step if wrapper.restart_step is not None else 0
        before = (result.start_step >= 0) & (result.start_step < k_r)
        k_end = int(result.finish_step[before].max()) + 1 if before.any() else k_r + 1
        k_end = min(k_end, int(result.start_step.max()) + 1)  # within the loaded phase
        window = result.series["imbalance"][k_r:k_end]
        row["window_imbalance"] = float(window.mean()) if window.shape[0] else math.nan
    return row


def _workload(name: str, requests: int, seed: int):
    from .quality import GENERATED, REPLAY_THIN, _load

    _, test = _load(name, requests, seed, None if name in GENERATED else REPLAY_THIN)
    return test


QUICK_ROWS = ROWS[:3] + (("least_load", "reports"),)
FULL_ROWS = (*QUICK_ROWS, ("br0", "true"))
PROFILES = {
    "quick": dict(workload="servegen-r1", requests=1_200, replicas=8, slots=16, seeds=(1000, 1001),
                  rows=QUICK_ROWS),
    "full": dict(workload="servegen-r1", requests=3_000, replicas=8, slots=32, seeds=tuple(range(1000, 1008)),
                 rows=FULL_ROWS),
}
"""Held-out draws (``analysis/quality.py``'s seeds from 1,000 up; the test half of each draw)."""


def run_foreign_grid(profile: str = "quick", *, scenarios=SCENARIOS, rows=None, poll_s: float = 0.5,
                     progress: Any = None) -> list[dict[str, Any]]:
    """Every (scenario, row, seed) of ``profile`` (``rows``: the profile's unless given); one
    dict per run."""
    p = PROFILES[profile]
    rows = p["rows"] if rows is None else rows
    out = []
    for seed in p["seeds"]:
        workload = _workload(p["workload"], p["requests"], seed)
        for name in scenarios:
            for policy, view in rows:
                if (view == "full" and policy != "br0") or (view == "true" and name != "two_routers"):
                    continue
                spec = scenario(name, view, poll_s)
                row = run_foreign_cell(workload, policy, spec, replicas=p["replicas"], slots=p["slots"], seed=seed)
                out.append({"scenario": name, "policy": policy, "view": view, "seed": seed, **row})
                if progress is not None:
                    progress(out[-1])
    return out


def ratios(rows: list[dict[str, Any]], scenario_name: str, policy: str, view: str,
           metric: str = "mean_imbalance", ref: tuple[str, str] = ("br0", "full")) -> list[float]:
    """Per seed: ``metric`` of (policy, view) over the reference row's, on ``scenario_name``."""
    by = {(r["policy"], r["view"], r["seed"]): r for r in rows if r["scenario"] == scenario_name}
    out = []
    for (p, v, s), r in sorted(by.items()):
        base = by.get((*ref, s))
        if (p, v) == (policy, view) and base is not None and metric in r and metric in base:
            out.append(max(r[metric], 1e-9) / max(base[metric], 1e-9))
    return out


def foreign_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The table (imbalance ÷ BR with full knowledge, geometric mean and 95 % interval over the
    held-out draws) and the acceptance checks."""
    from .quality import paired_interval

    def cell(xs: list[float]) -> str:
        if not xs:
            return "—"
        m, lo, hi = paired_interval(xs)
        return f"{m:.2f}" + ("" if math.isnan(lo) else f" ({lo:.2f}–{hi:.2f})")

    seeds = len({r["seed"] for r in rows})
    names = [s for s in SCENARIOS if any(r["scenario"] == s for r in rows)]
    head = "| row | " + " | ".join(names) + (" | restart window |" if "restart" in names else " |")
    lines = [f"Mean imbalance ÷ BR with full knowledge, {seeds} held-out draws (95 % interval):", "",
             head, "|" + "---|" * (len(names) + 1 + ("restart" in names))]
    present = {(r["policy"], r["view"]) for r in rows}
    for policy, view in ROWS:
        if (policy, view) not in present:
            continue
        vals = [cell(ratios(rows, s, policy, view)) for s in names]
        if "restart" in names:
            vals.append(cell(ratios(rows, "restart", policy, view, "window_imbalance")))
        lines.append(f"| {policy} {view} | " + " | ".join(vals) + " |")
    if "foreign30" in names:
        rec = ratios(rows, "foreign30", "br0", "reconciled")
        ll = ratios(rows, "foreign30", "least_load", "reports")
        ahead = [a / b for a, b in zip(rec, ll, strict=True)]
        if rec and ahead:
            m, lo, hi = paired_interval(rec)
            a_m, a_lo, a_hi = paired_interval(ahead)
            lines += ["", f"30 % foreign: BR reconciled ÷ BR full = {m:.2f} (interval {lo:.2f}–{hi:.2f}); "
                      f"acceptance ≤ 1.2: {'holds' if m <= 1.2 else 'fails'}",
                      f"30 % foreign: BR reconciled ÷ least-load on the reports = {a_m:.2f} "
                      f"(interval {a_lo:.2f}–{a_hi:.2f}); acceptance < 1: {'holds' if a_m < 1 else 'fails'}"]
    return lines


def add_foreign_args(p: argparse.ArgumentParser) -> None:
    """Arguments of ``balanceroute foreign``."""
    p.add_argument("--full", action="store_true",
                   help="8 held-out draws of 3,000 requests (1,500 simulated) at G=8, B=32 (minutes) "
                        "instead of the quick 2 draws of 1,200 at B=16 (about 20 s)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help="comma-separated subset of " + ", ".join(SCENARIOS))
    p.add_argument("--poll", type=float, default=0.5, metavar="SECONDS",
                   help="engine reporting period in simulated seconds (default: %(default)s)")
    p.add_argument("--all-rows", action="store_true",
                   help="also BR on the reports alone and least-load reconciled (six rows, not four)")
    p.add_argument("--csv", default=None, help="also write the rows to this CSV")


def run_foreign(args: argparse.Namespace) -> int:
    """``balanceroute foreign``: run the grid, print the table and the acceptance lines."""
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    bad = [s for s in names if s not in SCENARIOS]
    if bad:
        raise ValueError(f"--scenarios: {', '.join(bad)} not one of {', '.join(SCENARIOS)}")
    if not args.poll > 0:
        raise ValueError(f"--poll must be > 0 seconds, got {args.poll}")
    from balanceroute.cli_checks import output_file

    output_file(args.csv, "--csv")
    t0 = time.perf_counter()
    rows = run_foreign_grid("full" if args.full else "quick", scenarios=tuple(names), poll_s=args.poll,
                            rows=ROWS if args.all_rows else None)
    if args.csv:
        from .sweep import write_csv

        write_csv(rows, args.csv)
    print("\n".join(foreign_lines(rows)))
    print(f"\n({len(rows)} runs in {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 0
