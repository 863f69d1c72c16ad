"""``balanceroute reproduce``: every table and figure of the paper, next to the paper's numbers.

Runs the declared grids (:mod:`.experiments`) through :func:`~.sweep.run_grid` (cached per cell),
writes one tidy CSV per experiment to ``<out>/data/``, draws ``<out>/figures/*.png`` from those
CSVs only and writes ``<out>/REPORT.md`` (:mod:`.report`)::

    balanceroute reproduce --quick              # minutes; writes papers/reproduction/quick/
    balanceroute reproduce --jobs 2             # the committed full run (papers/reproduction/)
    balanceroute reproduce --backend ray --address auto   # the grid on a Ray cluster
    balanceroute reproduce --report-only        # redraw figures and report from the CSVs
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .sweep import Cell, CellOutcome, GridResult

__all__ = ["ReproduceResult", "add_arguments", "draw_figures", "reproduce", "run_reproduce"]

DEFAULT_OUT = "papers/reproduction"
QUICK_SUBDIR = "quick"


@dataclass(slots=True)
class ReproduceResult:
    """Where things went and what ran."""

    out: Path
    report: Path
    csvs: dict[str, Path]
    figures: dict[str, Path]
    grid: GridResult | None
    errors: list[str] = field(default_factory=list)


def draw_figures(out: Path) -> dict[str, Path]:
    """Draw every figure whose CSV exists under ``<out>/data``; returns name → path (none
    without matplotlib, the `plot` extra: the report then has tables only)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return {}
    from .figures import redraw

    return redraw(out)


def reproduce(
    out: str | Path,
    *,
    quick: bool = False,
    backend: str = "local",
    jobs: int | None = None,
    use_cache: bool = True,
    address: str | None = None,
    only: Sequence[str] | None = None,
    report_only: bool = False,
    command: str = "balanceroute reproduce",
    profile=None,
    on_start: Callable[[list[Cell]], None] | None = None,
    on_done: Callable[[CellOutcome], None] | None = None,
) -> ReproduceResult:
    """Run the grids (unless ``report_only``), write CSVs, figures and ``REPORT.md`` under
    ``out``. ``only``: a subset of experiment names (the others' CSVs are kept as they are);
    ``profile``: override the sizes (tests); ``on_start(cells)`` and ``on_done(outcome)``
    report progress."""
    from balanceroute.catalogue import available_names

    from .experiments import (
        FULL,
        QUICK,
        TABLE1_POLICIES,
        cell_cost,
        declare,
        run_cell,
        solver_status,
    )
    from .report import ReportContext, build_report
    from .sweep import run_grid, write_csv

    out = Path(out)
    prof = profile or (QUICK if quick else FULL)
    available = [p for p in available_names() if prof.policies is None or p in prof.policies]
    usable, message, _, _ = solver_status()
    grids = declare(prof, available, solvers=None)
    if only:
        unknown = sorted(set(only) - set(grids) - {"tick_gap", "clairvoyant_gap", "competitive_ratio"})
        if unknown:
            raise ValueError(f"unknown experiment(s) {', '.join(unknown)}; valid: {', '.join(grids)}")
        grids = {k: v for k, v in grids.items() if k in only}

    grid = None
    errors: list[str] = []
    csvs: dict[str, Path] = {}
    if not report_only:
        cells = [c for cs in grids.values() for c in cs]
        if on_start is not None:
            on_start(cells)
        grid = run_grid(cells, run_cell, backend=backend, jobs=jobs, cache_dir=out / "cache",  # type: ignore[arg-type]
                        use_cache=use_cache, address=address, cost=cell_cost, on_done=on_done)
        for experiment in grids:
            rows = [r for r in grid.rows if r["experiment"] == experiment]
            if rows:
                csvs[experiment] = write_csv(rows, out / "data" / f"{experiment}.csv")
        for cell, text in grid.errors:
            last = text.strip().splitlines()[-1] if text.strip() else "error"
            errors.append(f"`{cell.experiment}` {cell.kind} {cell.workload or ''} "
                          f"{cell.policy or ''} G={cell.replicas} seed={cell.seed}: {last}")

    figures = draw_figures(out)
    ctx = ReportContext(
        mode=prof.name, command=command, profile=prof,
        requested_policies=list(TABLE1_POLICIES), available_policies=available,
        solver_message=message, solvers_available=usable, errors=errors,
    )
    rel = {name: path.relative_to(out).as_posix() for name, path in figures.items()}
    report = out / "REPORT.md"
    report.write_text(build_report(out, ctx, rel))
    root = out.resolve().parent.parent
    if out.resolve() == root / "papers" / "reproduction" and (root / "README.md").exists():
        from .frontdoor import update  # the committed report's CSVs feed README's generated blocks

        try:
            update(root)
        except (ValueError, KeyError, OSError) as exc:  # the report stands; say what was not rewritten
            errors.append(f"README/docs generated blocks not rewritten ({exc}); "
                          "run `balanceroute report --readme`")
    return ReproduceResult(out=out, report=report, csvs=csvs, figures=figures, grid=grid,
                           errors=errors)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``reproduce`` options."""
    from balanceroute.progress import add_quiet_arg

    p.add_argument("--quick", action="store_true",
                   help="small sizes, one seed, G <= 32: minutes on a laptop (for CI and a "
                        "first look); default output papers/reproduction/quick/")
    p.add_argument("--out", default=None, metavar="DIR",
                   help=f"output folder (default: {DEFAULT_OUT}/, or {DEFAULT_OUT}/{QUICK_SUBDIR}/ "
                        "with --quick, so a quick run never overwrites the committed full one)")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="local: a process pool on this machine; ray: tasks on a Ray cluster "
                        "(needs the `dist` extra) (default: %(default)s)")
    p.add_argument("--jobs", "-j", type=int, default=None,
                   help="parallel workers (default: the CPU count; 1 runs in this process)")
    p.add_argument("--address", default=None,
                   help="--backend ray: an existing cluster ('auto' or ray://host:port); without "
                        "it a local Ray instance with --jobs CPUs is started")
    p.add_argument("--no-cache", action="store_true",
                   help="recompute every cell (results still refresh <out>/cache/)")
    p.add_argument("--only", default=None, metavar="EXP[,EXP]",
                   help="run only these experiments (table1, table1_calibrated, scaling, "
                        "step_model, slots, tick_timing, balls_into_bins, tick_gap, "
                        "clairvoyant_gap, competitive_ratio, quality, quality_seeds, ttft_pareto, "
                        "ttft_open_loop, replicas_budget, replicas_speed); the report still covers every CSV present")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: redraw the figures and REPORT.md from <out>/data/*.csv")
    add_quiet_arg(p)


def run_reproduce(args: argparse.Namespace) -> int:
    """Handler of ``balanceroute reproduce``: a progress bar on stderr, a summary on stdout;
    exit status 1 if a cell failed."""
    from balanceroute.progress import progress

    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    out = Path(args.out) if args.out else Path(DEFAULT_OUT) / (QUICK_SUBDIR if args.quick else "")
    from balanceroute.cli_checks import output_dir

    output_dir(out, "--out")
    only = [x.strip() for x in args.only.split(",") if x.strip()] if args.only else None
    bar = None

    from .experiments import cell_cost

    def on_start(cells: list[Cell]) -> None:
        nonlocal bar  # the time left weighs each cell by its estimated cost, not one a cell
        bar = progress(len(cells), "reproduce", "cells", quiet=args.quiet,
                       work_total=sum(map(cell_cost, cells)))

    def on_done(o: CellOutcome) -> None:
        if bar is not None:
            bar.set_postfix_str(f"{o.cell.experiment} {o.cell.policy or o.cell.kind} "
                                f"G={o.cell.replicas}" + (" (cached)" if o.cached else ""))
            (bar.skip if o.cached else bar.update)(1, work=cell_cost(o.cell))

    if not args.report_only:
        from balanceroute.warm import announce, warm_kernels

        if announce((lambda text: None) if args.quiet else None):
            warm_kernels()  # once here, so the workers load the kernels instead of each compiling
    words = ["balanceroute", "reproduce"] + (["--quick"] if args.quick else [])
    try:
        result = reproduce(out, quick=args.quick, backend=args.backend, jobs=args.jobs,
                           use_cache=not args.no_cache, address=args.address, only=only,
                           report_only=args.report_only, command=shlex.join(words),
                           on_start=on_start, on_done=on_done)
    finally:
        if bar is not None:
            bar.close()
    if result.grid is not None:
        print(f"cells: {result.grid.executed} run, {result.grid.cached} from cache, "
              f"{len(result.grid.errors)} failed")
    for _name, path in result.csvs.items():
        print(f"data    {path}")
    for _name, path in result.figures.items():
        print(f"figure  {path}")
    print(f"report  {result.report}")
    for line in result.errors:
        print(f"failed: {line}", file=sys.stderr)
    return 1 if result.errors else 0
