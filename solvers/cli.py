"""``balanceroute gap``: online policies next to the exact optimum, per tick or per episode.

    balanceroute gap --instances 50 --replicas 4 --pool 16            # per-tick, random
    balanceroute gap --mode tick --workload azure-conv-2023           # ticks met in a simulation
    balanceroute gap --mode clairvoyant --workload azure-conv-2023 --requests 32 --replicas 4
    balanceroute gap --load saved/*.json --csv gaps.csv               # shared instances
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
from pathlib import Path
from typing import Any

from balanceroute.progress import add_quiet_arg

__all__ = ["register"]

#: How ``gap`` names the relaxations in its ceiling line.
CEILING_NAMES = {"aggregate": "aggregated", "partition": "pigeonhole cuts",
                 "migration": "migration", "binding_exact": "partial binding (exact)",
                 "binding": "partial binding (fluid model)"}


def register(subparsers: Any) -> None:
    """Add the ``gap`` subcommand."""
    p = subparsers.add_parser(
        "gap", help="optimality gap of the heuristics against exact solvers",
        description="Solve instances exactly (MILP / CP-SAT) and report each policy's gap.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--mode", choices=("tick", "clairvoyant"), default="tick",
                   help="per-tick assignment or the clairvoyant multi-step episode")
    src = p.add_argument_group("instances")
    src.add_argument("--instances", "-n", type=int, default=20, help="how many instances")
    src.add_argument("--replicas", "-G", type=int, default=4, help="replicas G")
    src.add_argument("--pool", "-P", type=int, default=16, help="tick: pool size P")
    src.add_argument("--max-free", type=int, default=3, help="tick (random): free slots per replica 0..F")
    src.add_argument("--horizon", type=int, default=0,
                     help="tick (random): BR-H projection steps H (0: BR-0)")
    src.add_argument("--slots", "-B", type=int, default=None,
                     help="slots per replica (default: 64 tick simulation, 3 clairvoyant)")
    src.add_argument("--requests", type=int, default=32, help="clairvoyant: requests per episode")
    src.add_argument("--first", type=int, default=0, help="clairvoyant --workload: first request")
    src.add_argument("--release", choices=("zero", "arrival"), default="zero",
                     help="clairvoyant --workload: all at step 0, or the trace's arrivals")
    src.add_argument("--step", default="auto",
                     help="clairvoyant: decode steps per model step q, or 'auto' (fit --max-model-steps)")
    src.add_argument("--max-model-steps", type=int, default=40, help="clairvoyant: target for --step auto")
    src.add_argument("--seed", type=int, default=0, help="seed for instances, policies and solvers")
    src.add_argument("--workload", default=None,
                     help="a bundled workload or trace file (tick: ticks met by BR-0 in a "
                          "simulation; clairvoyant: consecutive slices)")
    src.add_argument("--sim-requests", type=int, default=2000, help="tick --workload: simulated requests")
    src.add_argument("--min-output", type=int, default=None, help="--workload: keep outputs >= this")
    src.add_argument("--max-output", type=int, default=None, help="--workload: keep outputs <= this")
    src.add_argument("--load", nargs="+", default=None, metavar="PATH",
                     help="instance JSON files or benchmark libraries "
                          "(balanceroute/data/benchmarks/clairvoyant.json)")
    src.add_argument("--save", default=None, metavar="DIR", help="write the instances as JSON here")
    run = p.add_argument_group("solving")
    run.add_argument("--objective", default=None,
                     help="tick: f_score (default) or imbalance; clairvoyant: imbalance "
                          "(default) or step_time")
    run.add_argument("--policies", default=None,
                     help="comma-separated (default tick: br0 + baselines; clairvoyant: all)")
    run.add_argument("--solver", default=None, help="default tick-cpsat / clairvoyant-cpsat")
    run.add_argument("--time-limit", type=float, default=None,
                     help="budget per solve in seconds (default 10 tick, 60 clairvoyant), spent "
                          "as deterministic work (CP-SAT deterministic seconds, HiGHS/CBC nodes, "
                          "local-search neighbours) so results do not depend on machine load; "
                          "the wall clock stops a solve only at 20x the budget")
    run.add_argument("--gap-rel", type=float, default=0.0, help="solver relative gap tolerance")
    run.add_argument("--threads", type=int, default=1, help="solver threads")
    run.add_argument("--lp-bound", action=argparse.BooleanOptionalAction, default=None,
                     help="also compute the LP relaxation bound (default: on for tick)")
    run.add_argument("--solver-param", action="append", default=[], metavar="KEY=VALUE",
                     help="a backend parameter (repeatable): CP-SAT SatParameters field, HiGHS "
                          "option, CBC option or the PuLP solver's keyword")
    run.add_argument("--relaxation",
                     choices=("auto", "aggregate", "partition", "migration", "binding", "both",
                              "all", "none"),
                     default="auto",
                     help="clairvoyant: relaxations proving the lower bound (auto: the "
                          "partial-binding exact DP where it fits, else the aggregated one and "
                          "the one with pigeonhole cuts; binding: the --bound-requests largest "
                          "bound for life, the rest migrating (exact DP) or fluid (CP-SAT) when "
                          "the DP does not fit; both: aggregate + migration)")
    run.add_argument("--bound-requests", type=int, default=None,
                     help="clairvoyant: how many of the largest prompts the partial-binding "
                          "relaxation keeps bound for life (default 8)")
    run.add_argument("--bound-time-limit", type=float, default=None,
                     help="clairvoyant: seconds per relaxation bound (default --time-limit)")
    run.add_argument("--polish-iters", type=int, default=None,
                     help="clairvoyant: local-search neighbours tried on the best schedule "
                          "(default: 100 per second of the search's third of --time-limit)")
    out = p.add_argument_group("output")
    out.add_argument("--csv", default=None, metavar="PATH", help="write one row per instance x policy")
    out.add_argument("--summary-only", action="store_true",
                     help="only the summary, no per-instance lines")
    add_quiet_arg(out)
    out.add_argument("--solver-log", default=None, metavar="DIR",
                     help="write each solve's backend log to DIR/<instance>.log")
    out.add_argument("--export", default=None, metavar="DIR",
                     help="write each model to DIR (MPS + LP for PuLP solvers, CP-SAT text "
                          "proto for CP-SAT; objective constant included)")
    p.set_defaults(handler=run_gap)


def _instances(args: argparse.Namespace) -> list:
    import numpy as np

    from .factories import (
        clairvoyant_from_workload,
        random_clairvoyant_instance,
        random_tick_instance,
    )
    from .instances import ClairvoyantInstance, load_instance

    if args.instances < 1 or args.replicas < 1 or args.pool < 1:
        raise ValueError("--instances, --replicas and --pool must be >= 1")
    if args.bound_requests is not None and args.bound_requests < 0:
        raise ValueError("--bound-requests must be >= 0")
    if args.load:
        from .benchmarks import is_benchmark_library, load_benchmarks

        loaded = []
        for path in args.load:
            if is_benchmark_library(path):
                loaded += [inst for inst, _ in load_benchmarks(path)]
            else:
                loaded.append(load_instance(path))
        kinds = {"clairvoyant" if isinstance(x, ClairvoyantInstance) else "tick" for x in loaded}
        if len(kinds) > 1:
            raise ValueError("--load mixes tick and clairvoyant instances")
        args.mode = kinds.pop()
        return loaded
    rng = np.random.default_rng(args.seed)
    objective: Any = args.objective or ("f_score" if args.mode == "tick" else "imbalance")
    if args.mode == "tick":
        if args.workload:
            return _simulated_ticks(args, objective)
        return [random_tick_instance(rng, num_replicas=args.replicas, pool_size=args.pool,
                                     max_free=args.max_free, horizon=args.horizon,
                                     objective=objective, name=f"tick{k:03d}")
                for k in range(args.instances)]
    slots = args.slots or 3
    if args.workload:
        from balanceroute.core.workloads import load_workload

        wl = load_workload(args.workload, requests=args.first + args.instances * args.requests,
                           seed=args.seed, min_output=args.min_output, max_output=args.max_output)
        episodes = [clairvoyant_from_workload(
            wl, first=args.first + k * args.requests, num_requests=args.requests,
            num_replicas=args.replicas, slots=slots, release=args.release, objective=objective)
            for k in range(args.instances)]
    else:
        episodes = [random_clairvoyant_instance(
            rng, num_requests=args.requests, num_replicas=args.replicas, slots=slots,
            max_prompt=2000, max_output=200, max_release=0, objective=objective,
            name=f"episode{k:03d}") for k in range(args.instances)]
    return [_coarsen(ep, args) for ep in episodes]


def _coarsen(episode, args: argparse.Namespace):
    if args.step == "auto":
        fine = dataclasses.replace(episode, step=1).model_horizon
        q = max(1, math.ceil(fine / max(args.max_model_steps, 1)))
    else:
        try:
            q = int(args.step)
        except ValueError:
            raise ValueError(f"--step must be an integer or 'auto', got {args.step!r}") from None
    return dataclasses.replace(episode, step=q)


def _simulated_ticks(args: argparse.Namespace, objective: str) -> list:
    from balanceroute.core.policies import get_policy
    from balanceroute.core.simulator import SimConfig, simulate
    from balanceroute.core.workloads import load_workload

    from .bridge import TickRecorder

    wl = load_workload(args.workload, requests=args.sim_requests, seed=args.seed,
                       min_output=args.min_output, max_output=args.max_output)
    recorder = TickRecorder(inner=get_policy("br0"), objective=objective)
    simulate(wl, recorder, SimConfig(num_replicas=args.replicas, slots=args.slots or 64,
                                     pool_size=args.pool))  # type: ignore[arg-type]
    ticks = recorder.ticks[len(recorder.ticks) // 10:]  # skip the warm-up fill
    if not ticks:
        raise ValueError(f"the simulation of {args.workload!r} met no tick with a choice")
    step = max(1, len(ticks) // args.instances)
    return [dataclasses.replace(t, name=f"{wl.name}:{t.name}") for t in ticks[::step][: args.instances]]


def _policies(args: argparse.Namespace) -> list[str]:
    from balanceroute.core.policies import BASELINES, policy_names

    valid = policy_names()
    if args.policies:
        names = [n.strip() for n in args.policies.split(",") if n.strip()]
    elif args.mode == "tick":
        names = ["br0", *BASELINES]
    else:
        names = valid
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(map(repr, unknown))}; valid: {', '.join(valid)}")
    return names


def _fmt(x: float) -> str:
    if isinstance(x, float) and not math.isfinite(x):
        return "-"
    return f"{x:.6g}" if abs(x) < 1e6 else f"{x:.4e}"


def _solver_params(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--solver-param must be KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def run_gap(args: argparse.Namespace) -> int:
    """Handler of ``balanceroute gap``."""
    from balanceroute.cli_checks import output_dir, output_file
    from balanceroute.progress import progress

    from . import get_solver, solver_names, solver_problem
    from .gap import clairvoyant_gap_rows, summarize, tick_gap_rows
    from .instances import save_instance

    output_file(args.csv, "--csv")
    for flag, folder in (("--save", args.save), ("--solver-log", args.solver_log), ("--export", args.export)):
        output_dir(folder, flag)
    instances = _instances(args)
    policies = _policies(args)
    solver = args.solver or f"{args.mode}-cpsat"
    if solver_problem(solver) != args.mode:
        raise ValueError(f"solver {solver!r} does not solve {args.mode} instances; valid: "
                         f"{', '.join(solver_names(args.mode))}, {args.mode}-pulp:<PuLP solver>")
    get_solver(solver)  # fails early on a missing backend
    params = _solver_params(args.solver_param)
    for folder in (args.save, args.solver_log, args.export):
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
    if args.save:
        for k, inst in enumerate(instances):
            save_instance(inst, Path(args.save) / f"{args.mode}-{k:03d}.json")
    time_limit = args.time_limit or (10.0 if args.mode == "tick" else 60.0)
    lp = args.lp_bound if args.lp_bound is not None else args.mode == "tick"
    bar = progress(len(instances), f"gap {args.mode}", "instances", quiet=args.quiet,
                   interval_s=30.0)
    common = {"policies": policies, "solver": solver, "time_limit_s": time_limit,
              "gap_rel": args.gap_rel, "threads": args.threads, "seed": args.seed,
              "lp_bound": lp, "progress": bar.update, "params": params,
              "log_dir": args.solver_log, "export_dir": args.export}
    try:
        if args.mode == "tick":
            rows = tick_gap_rows(instances, **common)
        else:
            rows = clairvoyant_gap_rows(instances, relaxation=args.relaxation,
                                        bound_time_limit_s=args.bound_time_limit,
                                        polish_iters=args.polish_iters,
                                        bound_requests=args.bound_requests, **common)
    finally:
        bar.close()

    if not args.summary_only:
        _print_instances(rows, policies, "optimum" if args.mode == "tick" else "best")
    if args.mode == "clairvoyant":
        _print_bounds(rows)
    print(f"\nsummary ({args.mode}, objective {rows[0]['objective']}, solver {solver}, "
          f"{len(instances)} instances; gap = relative to the "
          f"{'optimum' if args.mode == 'tick' else 'best clairvoyant schedule'}; mean_rel_gap is "
          "the mean of ratios, sum_rel_gap the ratio of sums)")
    cols = ["policy", "instances", "proven", "mean_rel_gap", "sum_rel_gap", "median_rel_gap",
            "worst_rel_gap", "share_optimal", "mean_abs_gap", "worst_abs_gap", "mean_solve_s",
            "violations"]
    if args.mode == "tick":
        cols[-1:-1] = ["mean_capacity_gap", "worst_capacity_gap"]
    print("  ".join(f"{c:>14}" for c in cols))
    for s in summarize(rows):
        print("  ".join(f"{_fmt(s[c]) if not isinstance(s[c], str) else s[c]:>14}" for c in cols))
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {len(rows)} rows to {args.csv}")
    return 0


def _print_bounds(rows: list[dict]) -> None:
    """Per episode: the best work-conserving schedule, the proven lower bound and its method."""
    print("\nproven lower bounds (Σ over decode steps; best = best work-conserving schedule found)")
    seen: set[str] = set()
    for r in rows:
        if r["instance"] in seen:
            continue
        seen.add(r["instance"])
        share = f"{100 * r['bound_share']:.1f} %" if math.isfinite(r["bound_share"]) else "-"
        print(f"  {r['instance']}: best {_fmt(r['optimum'])}, lower bound {_fmt(r['bound'])} "
              f"({share} of best; {r['bound_method']})")
        if r.get("wall_capped"):
            print("    note: a wall-clock safety cap (20x the budget) stopped a solve before its "
                  "deterministic budget: these numbers may depend on machine load")
        tops = [f"{name} {_fmt(r[f'ceiling_{key}'])}" for key, name in CEILING_NAMES.items()
                if f"ceiling_{key}" in r]
        if tops and r["reference"] != "optimum":
            print(f"    the most each relaxation could prove (its value at the best schedule): "
                  f"{', '.join(tops)}")


def _print_instances(rows: list[dict], policies: list[str], label: str) -> None:
    by_instance: dict[str, list[dict]] = {}
    for r in rows:
        by_instance.setdefault(r["instance"], []).append(r)
    width = max([8, *map(len, by_instance)])  # whole names, never cut
    head = [f"{'instance':<{width}}", *(f"{h:>14}" for h in (label, "bound", "status", "solve_s")),
            *(f"{p:>20}" for p in policies)]
    print("  ".join(head) + "   (policy value [relative gap])")
    for name, group in by_instance.items():
        r0 = group[0]
        cells = [f"{name:<{width}}", *(f"{c:>14}" for c in (
            _fmt(r0["optimum"]), _fmt(r0["bound"]), r0["status"], f"{r0['solve_s']:.3f}"))]
        for r in group:
            cell = f"{_fmt(r['heuristic'])} [{100 * r['rel_gap']:.1f}%]"
            cells.append(f"{cell:>20}")
        print("  ".join(cells))
