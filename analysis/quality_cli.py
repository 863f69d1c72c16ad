"""``balanceroute quality``: the command that runs a decision-quality grid and prints its verdicts.

The grids, rules and verdicts live in :mod:`.quality`; the KV-budget and replica-speed groups in
:mod:`.replicas`. This module only parses the flags and runs the chosen grid.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .quality import (
    HELD_OUT_SEEDS,
    QUALITY_POLICIES,
    declare_quality,
    matrix_lines,
    paper_lines,
    powered_lines,
    quality_section,
    rules_lines,
    run_quality_cell,
)

__all__ = ["add_quality_args", "run_quality"]


def add_quality_args(p: argparse.ArgumentParser) -> None:
    """Arguments of ``balanceroute quality``."""
    p.add_argument("--full", action="store_true",
                   help="the full matrix (48 saturated + 48 open-loop cells; long) instead of the quick one")
    p.add_argument("--experiment", choices=("quality", "quality_seeds", "ttft_pareto",
                                            "ttft_open_loop", "replicas_budget",
                                            "replicas_speed"),
                   default="quality", help="which grid to run; quality_seeds judges the rules per "
                   "group over held-out seeds (default: %(default)s)")
    p.add_argument("--draws", choices=("held-out", "training"), default="held-out",
                   help="quality_seeds: judge on the held-out draws (1000-1019) or look at the "
                        "training draws (100-119) that choose defaults (default: %(default)s)")
    p.add_argument("--groups", choices=("all", "bundle", "shapes"), default="all",
                   help="quality_seeds: all groups, the bundled workloads' or the parametric "
                        "shapes' only (default: %(default)s)")
    p.add_argument("--max-draws", type=int, default=None,
                   help="quality_seeds: only the first N draws (development; default: all)")
    p.add_argument("--policies", default=None,
                   help="only these rows, comma-separated (default: all of " + ",".join(QUALITY_POLICIES) + ")")
    p.add_argument("--deadline-factor", type=float, default=None, metavar="F",
                   help="the BR rows (br0, brh-*) with the relative deadline f = F: a pooled "
                        "request that has waited F times twice the pool's median wait is placed "
                        "first (the policies' deadline_factor; default: the rows' own, 3)")
    p.add_argument("--jobs", type=int, default=1, help="local worker processes (default: 1)")
    p.add_argument("--csv", default=None, help="also write the rows to this CSV")
    from balanceroute.progress import add_quiet_arg

    add_quiet_arg(p)


def run_quality(args: argparse.Namespace) -> int:
    """``balanceroute quality``: run a grid, print the per-cell numbers and the rule counts."""
    from balanceroute.catalogue import available_names
    from balanceroute.progress import progress

    from .args import policy_names_arg
    from .sweep import RunByKind, run_grid, write_csv

    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    factor = args.deadline_factor
    if factor is not None and not (factor > 0 and factor < float("inf")):
        raise ValueError(f"--deadline-factor must be a finite number > 0, got {factor}")
    if factor is not None and args.experiment.startswith("replicas_"):
        raise ValueError("--deadline-factor: the quality and TTFT grids only, "
                         f"not {args.experiment}")
    from balanceroute.cli_checks import output_file

    output_file(args.csv, "--csv")
    names = available_names()
    if args.policies is not None:
        names = policy_names_arg(args.policies, "--policies")
        outside = [n for n in names if n not in QUALITY_POLICIES]
        if outside:
            raise ValueError(f"--policies: {', '.join(map(repr, outside))} not a matrix row; "
                             f"rows: {', '.join(QUALITY_POLICIES)}")
    if args.experiment.startswith("replicas_"):  # KV budgets, replica speed (analysis/replicas.py)
        from .replicas import declare_replicas, replicas_lines, run_replicas_cell

        cells = declare_replicas("full" if args.full else "quick", names)[args.experiment]
        cells = [c for c in cells if args.max_draws is None
                 or c.seed in HELD_OUT_SEEDS["full"][:args.max_draws]]
        grid = run_grid(cells, RunByKind({"replicas": run_replicas_cell}), jobs=args.jobs,
                        cache_dir=None, use_cache=False)
        if args.csv:
            write_csv(grid.rows, args.csv)
        print("\n".join(replicas_lines(grid.rows)))
        return 1 if grid.errors else 0
    cells = declare_quality("full" if args.full else "quick", names, draws=args.draws,
                            groups=args.groups, max_draws=args.max_draws,
                            deadline_factor=factor)[args.experiment]
    bar = progress(len(cells), args.experiment, "cells", quiet=args.quiet)

    def on_done(o: Any) -> None:
        bar.set_postfix_str(f"{o.cell.workload} {o.cell.policy} G={o.cell.replicas}")
        bar.update(1)

    try:
        grid = run_grid(cells, RunByKind({"quality": run_quality_cell}), jobs=args.jobs,
                        cache_dir=None, use_cache=False, on_done=on_done)
    finally:
        bar.close()
    rows = grid.rows
    if args.csv:
        write_csv(rows, args.csv)
    if args.experiment == "quality_seeds":
        print("\n".join(powered_lines(rows)))
    elif args.experiment == "quality":
        print("\n".join(matrix_lines(rows)))
        print()
        print("\n".join(rules_lines(rows, details=1000)))
        side = paper_lines(rows)
        if side:
            print("\nNext to the paper's Table 1 (G = 8, saturated; compare the ratios):")
            print("\n".join(side))
    else:
        print(quality_section({args.experiment: rows}, {}))
    for cell, text in grid.errors:
        print(f"cell failed: {cell.workload} {cell.policy}: {text.strip().splitlines()[-1]}", file=sys.stderr)
    return 1 if grid.errors else 0
