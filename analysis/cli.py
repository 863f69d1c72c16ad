"""Subcommands for experiments: ``simulate``, ``compare``, ``workloads``, ``bench``,
``predictors``, ``tune`` and ``reproduce`` (their shared arguments: :mod:`.args`)."""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import math
import sys

from .args import (
    add_cluster_args,
    add_workload_args,
    check_fill,
    config_from_args,
    policy_names_arg,
    workload_from_args,
)

__all__ = ["register"]


def _check_output_args(args: argparse.Namespace) -> None:
    from balanceroute.cli_checks import output_file

    if args.json and args.csv == "-":
        raise ValueError("--json and --csv - both write to stdout; choose one (or --csv PATH)")
    output_file(args.csv, "--csv")  # before the run, not after it
    output_file(getattr(args, "series", None), "--series")


def _emit(records: list[dict], args: argparse.Namespace) -> None:
    from balanceroute.analysis.compare import format_table

    if args.json:
        print(json.dumps([_jsonable(r) for r in records], indent=2))
    if args.csv:
        out = sys.stdout if args.csv == "-" else open(args.csv, "w", newline="")
        try:
            writer = csv.DictWriter(out, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)
        finally:
            if out is not sys.stdout:
                out.close()
    if not args.json and args.csv != "-":
        print(format_table(records))


def _jsonable(record: dict) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in record.items()}


def _print_metrics(record: dict) -> None:
    for key, value in record.items():
        if isinstance(value, float):
            print(f"  {key:26s} {value:,.4g}" if abs(value) < 1e4 else f"  {key:26s} {value:,.0f}")
        else:
            print(f"  {key:26s} {value}")


def _write_series(path: str, series: dict) -> None:
    import numpy as np

    names = list(series)
    table = np.column_stack([np.arange(len(series[names[0]]))] + [series[n] for n in names])
    np.savetxt(path, table, delimiter=",", header=",".join(["step", *names]), comments="", fmt="%.10g")


def _run_compare(args: argparse.Namespace, names: list[str], *, reference: bool) -> int:
    from balanceroute.analysis.compare import compare_policies
    from balanceroute.analysis.policies import make_factory
    from balanceroute.core.policies import BASELINES
    from balanceroute.params import read_params
    from balanceroute.progress import progress

    _check_output_args(args)
    params = read_params(args.params)
    stray = sorted(set(params) - set(names))
    if stray:
        raise ValueError(f"--params {params.sources[stray[0]]} is for {stray[0]!r}, which is not "
                         f"among the simulated policies ({', '.join(names)})")
    workload = workload_from_args(args)
    series_path = getattr(args, "series", None)
    config = config_from_args(args, record_series=bool(series_path))
    factory = make_factory(workload, seed=args.seed, train_fraction=args.train_fraction, params=params)
    test = factory.test_workload
    check_fill(test, config)
    extra = [b for b in BASELINES if b not in names] if reference else []
    import numpy as np

    from balanceroute.warm import announce

    if not args.quiet:
        announce()  # a cold numba cache: say so, rather than a silent first minute

    # work = output tokens (a run's time goes with its decode steps, not its request count),
    # those of the first n requests standing in for the n finished; a policy's predictor fit
    # comes before the first simulation and is not extrapolated (start_work)
    tokens = np.concatenate([[0], np.cumsum(test.output_len, dtype=np.float64)])
    runs = len(names) + len(extra)
    with progress(len(test) * runs, "simulating", "req", quiet=args.quiet,
                  work_total=float(tokens[-1]) * runs) as bar:
        done = [0]
        bar.set_postfix_str("building the policies (brh-* fit their predictors)")

        def on_progress(n_finished: int) -> None:
            bar.update(n_finished - done[0], work=float(tokens[n_finished] - tokens[done[0]]))
            done[0] = n_finished

        started = [0]

        def on_policy(name: str) -> None:
            if started[0]:
                on_progress(len(test))  # the previous run is over: count what it left out
            else:
                bar.start_work()  # the predictors are fitted: extrapolate from here
            started[0] += 1
            done[0] = 0
            bar.set_postfix_str(name)

        records = compare_policies(test, names, config, seed=args.seed, factory=factory,
                                   on_policy=on_policy, progress=on_progress, reference=extra,
                                   on_result=(lambda r: _write_series(series_path, r.series))
                                   if series_path else None)
        on_progress(len(test))
    if not args.json and args.csv != "-":
        print(f"workload {test.name}: {len(test):,} requests simulated"
              + (f" (the preceding {len(factory.train_workload):,} fit the predictors)"
                 if factory.train_workload is not None else "")
              + f"; G={config.num_replicas}, B={config.slots}, {config.mode}, "
              f"pool {config.pool_target}, seed {args.seed}"
              + ("; gain vs the best of all five baselines on the same requests" if reference else ""))
    _emit(records, args)
    if len(names) == 1 and not args.json and args.csv != "-":
        print()
        _print_metrics(records[0])
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    names = policy_names_arg(args.policy, "--policy")
    if len(names) != 1:
        raise ValueError(f"--policy takes one policy; use `balanceroute compare --policies "
                         f"{args.policy}` for several")
    return _run_compare(args, names, reference=False)


def _cmd_compare(args: argparse.Namespace) -> int:
    return _run_compare(args, policy_names_arg(args.policies, "--policies", quiet=args.quiet), reference=True)


def _cmd_workloads(args: argparse.Namespace) -> int:
    from balanceroute.core.workloads import list_workloads

    for name, description in list_workloads():
        print(f"{name:18s} {description}")
    return 0


def _add_output_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("output")
    g.add_argument("--json", action="store_true", help="print one JSON record per policy")
    g.add_argument("--csv", metavar="PATH", help="write one CSV row per policy ('-' for stdout)")
    g.add_argument("--train-fraction", type=float, default=0.5,
                   help="the leading share of the trace that fits predictors (brh-*); every "
                        "policy is simulated on the rest, whichever are compared; 0 = simulate "
                        "it all (no brh-* rows) (default: 0.5)")
    g.add_argument("--params", action="append", default=[], metavar="FILE",
                   help="policy parameters from a file `balanceroute tune --write-params` wrote "
                        "(repeatable, one policy per file)")
    from balanceroute.progress import add_quiet_arg

    add_quiet_arg(g)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``simulate``, ``compare`` and ``workloads``."""
    p = sub.add_parser("simulate", help="simulate one policy on a workload",
                       description="Simulate one policy on the step-synchronous DP decode cluster.")
    p.add_argument("--policy", default="br0", help="policy name (default: %(default)s)")
    p.add_argument("--series", metavar="CSV",
                   help="write the per-step series (I(k), M(k), ΣL, τ, active, pool) to this CSV")
    add_workload_args(p)
    add_cluster_args(p)
    _add_output_args(p)
    p.set_defaults(handler=_cmd_simulate)

    p = sub.add_parser("compare", help="compare policies on the same workload and seed",
                       description="Simulate several policies on the same workload, cluster and "
                                   "seed and print a table shaped like the paper's Table 1.")
    p.add_argument("--policies", default=None,
                   help="comma-separated policy names (default: all registered)")
    add_workload_args(p)
    add_cluster_args(p)
    _add_output_args(p)
    p.set_defaults(handler=_cmd_compare)

    p = sub.add_parser("workloads", help="list the bundled workloads")
    p.set_defaults(handler=_cmd_workloads)

    from balanceroute.analysis.quality import QUALITY_POLICIES

    for name, module, add, run, help_text, description in (
        ("bench", "bench", "add_bench_args", "run_bench_command",
         "time the routing tick and the simulator on this machine",
         "Tick latency (P50/P99) of BR-0 and BR-H on saturated states and simulator replica-steps "
         "per second, each against a pure-Python reference timed in the same run."),
        ("predictors", "predictors", "add_predictors_args", "run_predictors",
         "calibration of the termination predictors (held out)",
         "Fit every predictor on the training part of a trace and report AUC, Brier score and ECE "
         "on the held-out part."),
        ("tune", "tune", "add_tune_args", "run_tune",
         "search BR-H's H, gamma, beta, S_greedy on the training split", None),
        ("quality", "quality_cli", "add_quality_args", "run_quality",
         "the decision-quality matrix and its acceptance rules",
         f"Run the quality matrix (saturated and open-loop cells for {', '.join(QUALITY_POLICIES)}) "
         "or the TTFT experiments; print per-cell numbers and how many cells break each rule."),
        ("foreign", "foreign", "add_foreign_args", "run_foreign",
         "load the router did not send: foreign traffic, two routers, a restart (simulated)",
         "Simulate 10 % and 30 % foreign traffic, two routers splitting the traffic and a router "
         "restart, each router seeing its own ledger and the engines' periodic reports; print the "
         "mean imbalance against one BR router with full knowledge over held-out draws."),
        ("reproduce", "reproduce", "add_arguments", "run_reproduce",
         "regenerate every table and figure next to the paper's",
         "Run the declared experiment grids (cached per cell), write tidy CSVs, PNG figures and "
         "REPORT.md with our numbers next to the paper's."),
        ("report", "frontdoor", "add_report_args", "run_report",
         "rewrite the generated numbers of README.md and docs/ from the committed CSVs",
         "Rewrite (--readme) or check (--check) every generated block of README.md and docs/*.md: "
         "each is written by code from the committed CSV its marker names."),
    ):
        mod = importlib.import_module(f"balanceroute.analysis.{module}")
        p = sub.add_parser(name, help=help_text, description=description)
        getattr(mod, add)(p)
        p.set_defaults(handler=getattr(mod, run))
