"""The online guard (``core/guard.py``) judged the way ``quality_seeds`` judges the rules.

Rows: ``br0``, ``brh-oracle``, ``brh-survival`` and the guarded ``brh-oracle-guard``,
``brh-survival-guard`` (the same policies with :class:`~balanceroute.core.guard.OnlineGuard`;
one guarded row per guard setting, named by the cell option ``guard``). Groups: the saturated
``quality_seeds`` groups at 3,000 requests — the bundled workloads (replays thinned per draw,
:data:`~.quality.REPLAY_THIN`) and the parametric shapes — at G = 8 and 16. Draws: the training
draws (:data:`~.quality.TRAINING_SEEDS`) choose the guard's constants, the held-out draws
(:data:`~.quality.HELD_OUT_SEEDS`) judge them once.

``python -m balanceroute.analysis.quality_guard --draws training --max-draws 6 --jobs 2`` prints
per group the geometric mean over the draws of each ratio with its 95 % interval and verdict
(:func:`~.quality.paired_interval`, :func:`~.quality.verdict`), and writes the rows as a CSV.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from .quality import (
    GENERATED,
    HELD_OUT_SEEDS,
    REPLAY_THIN,
    SHAPE_GROUPS,
    TRAINING_SEEDS,
    _load,
    paired_interval,
    verdict,
)
from .sweep import Cell

__all__ = ["BUNDLE_GROUPS", "GUARD_SETTINGS", "declare_guard", "guard_lines", "run_guard_cell"]

BUNDLE_GROUPS = ("azure-2024-long", "servegen-r1", "mooncake-conv", "azure-conv-2023")
"""The bundled workloads of ``quality_seeds``' saturated groups."""

BASE_ROWS = ("br0", "brh-oracle", "brh-survival")
GUARDED = ("brh-oracle", "brh-survival")

GUARD_SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "w32m2": {"block_steps": 32, "probe_every": 2},
    "w32m4": {"block_steps": 32, "probe_every": 4},
    "w64m2": {"block_steps": 64, "probe_every": 2},
    "w64m4": {"block_steps": 64, "probe_every": 4},
    "w128m4": {"block_steps": 128, "probe_every": 4},
    "w64m8": {"block_steps": 64, "probe_every": 8},
}
# ``default`` (W = 64, m = 8) was chosen from w32m4, w64m4 and w64m8 on training draws 100–103 of
# the eight groups where the lookahead gains or loses most (``papers/guard.md``).
"""Named guard settings (:class:`~balanceroute.core.guard.OnlineGuard` keyword arguments);
``default`` is the shipped constants."""


def declare_guard(*, draws: str = "training", groups: str = "all", max_draws: int | None = None,
                  first_draw: int = 0,
                  settings: Sequence[str] = ("default",), replicas: Sequence[int] = (8, 16),
                  requests: int = 3_000, only: Sequence[str] = ()) -> list[Cell]:
    """The cells: every group × draw (the first ``max_draws`` after skipping ``first_draw``) ×
    (the base rows, and one guarded row per setting); ``only``: just these ``workload:G`` groups (e.g. ``azure-conv-2023:8``)."""
    if draws not in ("held-out", "training"):
        raise ValueError(f"{draws=} must be 'held-out' or 'training'")
    unknown = [s for s in settings if s not in GUARD_SETTINGS]
    if unknown:
        raise ValueError(f"{unknown=} must be among {', '.join(GUARD_SETTINGS)}")
    workloads = {"all": (*BUNDLE_GROUPS, *SHAPE_GROUPS), "bundle": BUNDLE_GROUPS,
                 "shapes": SHAPE_GROUPS}[groups]
    seeds = (HELD_OUT_SEEDS if draws == "held-out" else TRAINING_SEEDS)["full"][first_draw:]
    seeds = seeds[:max_draws]
    rows = [(p, ()) for p in BASE_ROWS] + [(f"{p}-guard", (("guard", s),))
                                          for s in settings for p in GUARDED]
    pick = {(w, int(g)) for w, g in (x.split(":") for x in only)}
    return [Cell(experiment="quality_guard", kind="guard", workload=w, policy=p, replicas=g,
                 requests=requests, seed=s,
                 options=(("load", "saturated"), *opts,
                          *(() if w in GENERATED else (("thin", REPLAY_THIN),))))
            for w in workloads for g in replicas if not pick or (w, g) in pick
            for s in seeds for p, opts in rows]


def run_guard_cell(cell: Cell) -> list[dict[str, Any]]:
    """One row of one draw, saturated: its metrics and, guarded, what the guard did (the
    lookahead's share of the loaded steps, pairs judged, the incumbent at the end, locked)."""
    from balanceroute.catalogue import build_policy
    from balanceroute.core.guard import OnlineGuard
    from balanceroute.core.simulator import SimConfig, simulate

    thin = cell.option("thin", None)
    train, test = _load(cell.workload, int(cell.requests or 3_000), cell.seed,
                        None if thin is None else float(thin))
    base = cell.policy.removesuffix("-guard")
    policy = build_policy(base, {}, train=train, test=test, seed=cell.seed)
    setting = cell.option("guard", None)
    if setting is not None:
        policy = replace(policy, guard=OnlineGuard(**GUARD_SETTINGS[setting]), name=cell.policy)
    m = simulate(test, policy, SimConfig(num_replicas=cell.replicas, slots=cell.slots,
                                         check_assignments=False)).metrics
    row: dict[str, Any] = {k: m[k] for k in ("mean_imbalance", "throughput_loaded_tok_s",
                                             "ttft_s_p99", "pool_wait_p99_s", "loaded_steps")}
    record = getattr(policy, "guard_record", None)
    if record is not None:
        row.update(lookahead_share=record.lookahead_steps / max(m["loaded_steps"], 1.0),
                   pairs=len(record.pairs), incumbent=record.incumbent, locked=record.locked)
    return [row]


def _by_group(rows: Iterable[dict]) -> dict[tuple, dict[int, dict[str, dict]]]:
    out: dict[tuple, dict[int, dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        name = r["policy"] + (f"@{r['guard']}" if r.get("guard") not in (None, "") else "")
        out[(r["workload"], int(r["replicas"]))][int(r["seed"])][name] = r
    return out


def _ratio(runs: dict[int, dict[str, dict]], num: str, den: str, scale: float = 1.0):
    pairs = [float(by[num]["mean_imbalance"]) / (scale * float(by[den]["mean_imbalance"]))
             for by in runs.values() if num in by and den in by]
    return paired_interval(pairs) if len(pairs) > 1 else None


def guard_lines(rows: list[dict]) -> list[str]:
    """Per group: brh-oracle ÷ br0, the guarded oracle ÷ br0, brh-survival ÷ 1.02·br0, the
    guarded survival row ÷ 1.02·br0 (geometric mean over the draws, 95 % interval, verdict),
    the guarded ÷ unguarded oracle (what the guard costs) and the lookahead's mean share of the
    steps; then per setting the verdict counts."""
    groups = _by_group(rows)
    settings = sorted({r["guard"] for r in rows if r.get("guard") not in (None, "")})
    out: list[str] = []
    for s in settings:
        og, sg = f"brh-oracle-guard@{s}", f"brh-survival-guard@{s}"
        head = ["group", "draws", "oracle ÷ br0", "oracle-guard ÷ br0", "survival ÷ 1.02·br0",
                "survival-guard ÷ 1.02·br0", "oracle-guard ÷ oracle", "survival-guard ÷ survival",
                "lookahead share (oracle / survival)"]
        out += [f"Guard setting {s!r}:", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        tally: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for key in sorted(groups):
            runs = groups[key]
            label = f"{key[0]} G={key[1]}"
            cols = [label, str(len(runs))]
            for name, num, den, scale in (("oracle", "brh-oracle", "br0", 1.0),
                                          ("oracle-guard", og, "br0", 1.0),
                                          ("survival", "brh-survival", "br0", 1.02),
                                          ("survival-guard", sg, "br0", 1.02),
                                          ("cost-oracle", og, "brh-oracle", 1.0),
                                          ("cost-survival", sg, "brh-survival", 1.0)):
                r = _ratio(runs, num, den, scale)
                if r is None:
                    cols.append("—")
                    continue
                gm, lo, hi = r
                v = verdict(lo, hi)
                if not name.startswith("cost"):
                    tally[name][v].append(f"{label}: {gm:.3f} ({lo:.3f}–{hi:.3f})")
                cols.append(f"{gm:.3f} ({lo:.3f}–{hi:.3f})" + ("" if name.startswith("cost")
                                                                else f" {v}"))
            shares = []
            for p in (og, sg):
                vals = [float(by[p]["lookahead_share"]) for by in runs.values() if p in by]
                shares.append(f"{sum(vals) / len(vals):.2f}" if vals else "—")
            cols.append(" / ".join(shares))
            out.append("| " + " | ".join(cols) + " |")
        out.append("")
        for name in ("oracle", "oracle-guard", "survival", "survival-guard"):
            t = tally[name]
            total = sum(len(v) for v in t.values())
            out.append(f"- {name}: holds in {len(t['holds'])}, undecided in {len(t['undecided'])}, "
                       f"breaks in {len(t['breaks'])} of {total}")
            out += [f"  - breaks: {line}" for line in t["breaks"]]
            out += [f"  - undecided: {line}" for line in t["undecided"]]
        out.append("")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the guard grid and print :func:`guard_lines` (module docstring)."""
    from .sweep import RunByKind, run_grid, write_csv

    p = argparse.ArgumentParser(prog="python -m balanceroute.analysis.quality_guard")
    p.add_argument("--draws", choices=("held-out", "training"), default="training")
    p.add_argument("--groups", choices=("all", "bundle", "shapes"), default="all")
    p.add_argument("--max-draws", type=int, default=None)
    p.add_argument("--first-draw", type=int, default=0, help="skip this many draws first")
    p.add_argument("--settings", default="default",
                   help="comma-separated guard settings: " + ", ".join(GUARD_SETTINGS))
    p.add_argument("--replicas", default="8,16")
    p.add_argument("--requests", type=int, default=3_000)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--only", default="", help="comma-separated workload:G groups (default: all)")
    p.add_argument("--csv", default=None)
    p.add_argument("--log", default=None, help="append each finished cell's rows here (JSON lines)")
    args = p.parse_args(argv)
    cells = declare_guard(draws=args.draws, groups=args.groups, max_draws=args.max_draws,
                          first_draw=args.first_draw,
                          settings=tuple(args.settings.split(",")),
                          replicas=tuple(int(g) for g in args.replicas.split(",")),
                          requests=args.requests, only=tuple(x for x in args.only.split(",") if x))

    def on_done(outcome: Any) -> None:
        if args.log:
            import json

            with open(args.log, "a") as fh:
                for row in outcome.rows:
                    fh.write(json.dumps(row, default=str) + "\n")

    grid = run_grid(cells, RunByKind({"guard": run_guard_cell}), jobs=args.jobs, cache_dir=None,
                    use_cache=False, on_done=on_done)
    if args.csv:
        write_csv(grid.rows, args.csv)
    print("\n".join(guard_lines(grid.rows)))
    for cell, text in grid.errors:
        print(f"cell failed: {cell.workload} {cell.policy}: {text.strip().splitlines()[-1]}",
              file=sys.stderr)
    return 1 if grid.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
