"""Subcommands for experiments: ``simulate`` and ``compare`` (and, as they land, more)."""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from typing import Any

__all__ = ["add_cluster_args", "add_workload_args", "config_from_args", "register", "workload_from_args"]

DEFAULT_REQUESTS = 20_000


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """``--workload``, ``--requests``, ``--seed`` and the workload filters."""
    g = parser.add_argument_group("workload")
    g.add_argument("--workload", default="servegen-r1",
                   help="a bundled name (see `balanceroute workloads`) or a trace file path "
                        "(default: %(default)s)")
    g.add_argument("--requests", type=int, default=DEFAULT_REQUESTS,
                   help="use the first N requests (generators draw N) (default: %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="seed for generators and random policies")
    g.add_argument("--min-output", type=int, default=None, help="keep requests with output >= this")
    g.add_argument("--max-output", type=int, default=None, help="keep requests with output <= this")


def add_cluster_args(parser: argparse.ArgumentParser) -> None:
    """The simulated cluster: replicas, slots, pool, step model, arrival mode."""
    g = parser.add_argument_group("cluster")
    g.add_argument("--replicas", "-G", type=int, default=8, help="DP decode replicas G (default: 8)")
    g.add_argument("--slots", "-B", type=int, default=64, help="slots per replica B (default: 64)")
    g.add_argument("--mode", choices=("saturated", "open_loop"), default="saturated",
                   help="saturated: pool kept full in trace order; open_loop: trace timestamps")
    g.add_argument("--pool-size", type=int, default=None,
                   help="saturated pool target (default: 2*G)")
    g.add_argument("--rate-scale", type=float, default=1.0,
                   help="open loop: multiply the arrival rate by this")
    g.add_argument("--prefill-delay", type=float, default=0.0,
                   help="open loop: seconds from arrival to prefill completion")
    g.add_argument("--step-model", default="",
                   help="step time tau = b + max_g(a*L_g + c*n_g), e.g. 'b=0.03,a=2e-7,c=0' "
                        "(default: b=0.03 s, a=2e-7 s/token, c=0)")


def workload_from_args(args: argparse.Namespace):
    """Load the workload the arguments name."""
    from balanceroute.core.workloads import load_workload

    if args.requests is not None and args.requests < 1:
        raise ValueError(f"--requests must be >= 1, got {args.requests}")
    return load_workload(
        args.workload, requests=args.requests, seed=args.seed,
        min_output=args.min_output, max_output=args.max_output,
    )


def config_from_args(args: argparse.Namespace, **overrides: Any):
    """The :class:`SimConfig` the arguments describe."""
    from balanceroute.core.simulator import SimConfig, StepModel

    return SimConfig(
        num_replicas=args.replicas, slots=args.slots, mode=args.mode, pool_size=args.pool_size,
        rate_scale=args.rate_scale, prefill_delay_s=args.prefill_delay,
        step_model=StepModel.parse(args.step_model), **overrides,
    )


def _policy_names(text: str | None) -> list[str]:
    from balanceroute.analysis.policies import (
        all_policy_names,
        default_policy_names,
        missing_extras,
    )

    valid = all_policy_names()
    if not text:
        for name, extra in missing_extras().items():
            print(f"note: {name} left out: install balanceroute[{extra}] for it", file=sys.stderr)
        return default_policy_names()
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(map(repr, unknown))}; valid: {', '.join(valid)}")
    return names


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


def _run_compare(args: argparse.Namespace, names: list[str]) -> int:
    from tqdm import tqdm

    from balanceroute.analysis.compare import compare_policies
    from balanceroute.analysis.policies import make_factory

    workload = workload_from_args(args)
    series_path = getattr(args, "series", None)
    config = config_from_args(args, record_series=bool(series_path))
    factory = make_factory(workload, num_replicas=config.num_replicas, seed=args.seed,
                           train_fraction=args.train_fraction, names=names)
    test = factory.test_workload
    total = len(test) * len(names)
    with tqdm(total=total, desc="simulating", unit="req", file=sys.stderr,
              disable=args.quiet or None) as bar:
        done = [0]

        def progress(n_finished: int) -> None:
            bar.update(n_finished - done[0])
            done[0] = n_finished

        def on_policy(name: str) -> None:
            done[0] = 0
            bar.set_postfix_str(name)

        records = compare_policies(test, names, config, seed=args.seed, factory=factory,
                                   on_policy=on_policy, progress=progress,
                                   on_result=(lambda r: _write_series(series_path, r.series))
                                   if series_path else None)
    if not args.json and args.csv != "-":
        print(f"workload {test.name}: {len(test):,} requests"
              + (f" (predictors fitted on the preceding {len(factory.train_workload):,})"
                 if factory.train_workload is not None else "")
              + f"; G={config.num_replicas}, B={config.slots}, {config.mode}, "
              f"pool {config.pool_target}, seed {args.seed}")
    _emit(records, args)
    if len(names) == 1 and not args.json and args.csv != "-":
        print()
        _print_metrics(records[0])
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    return _run_compare(args, _policy_names(args.policy))


def _cmd_compare(args: argparse.Namespace) -> int:
    return _run_compare(args, _policy_names(args.policies))


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
                   help="for predictor-based policies (brh-*): the leading share of the trace "
                        "used to fit predictors; the rest is simulated (default: 0.5)")
    g.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


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

    p = sub.add_parser("bench", help="time the routing tick and the simulator on this machine",
                       description="Tick latency (P50/P99) of BR-0 and BR-H on saturated states "
                                   "and simulator replica-steps per second, each against a "
                                   "pure-Python reference timed in the same run.")
    from balanceroute.analysis.bench import add_bench_args, run_bench_command

    add_bench_args(p)
    p.set_defaults(handler=run_bench_command)

    from balanceroute.analysis.predictors import add_predictors_args, run_predictors
    from balanceroute.analysis.tune import add_tune_args, run_tune

    p = sub.add_parser("predictors", help="calibration of the termination predictors (held out)",
                       description="Fit every predictor on the training part of a trace and "
                                   "report AUC, Brier score and ECE on the held-out part.")
    add_predictors_args(p)
    p.set_defaults(handler=run_predictors)

    p = sub.add_parser("tune", help="search BR-H's H, gamma, beta, S_greedy on the training split")
    add_tune_args(p)
    p.set_defaults(handler=run_tune)

    from balanceroute.analysis.quality import add_quality_args, run_quality

    p = sub.add_parser("quality", help="the decision-quality matrix and its acceptance rules",
                       description="Run the quality matrix (saturated and open-loop cells for "
                                   "jsq, least_load, bfio-h0, br0, brh-survival, brh-oracle) or "
                                   "the TTFT experiments; print per-cell numbers and how many "
                                   "cells break each rule.")
    add_quality_args(p)
    p.set_defaults(handler=run_quality)

    p = sub.add_parser("reproduce", help="regenerate every table and figure next to the paper's",
                       description="Run the declared experiment grids (cached per cell), write "
                                   "tidy CSVs, PNG figures and REPORT.md with our numbers next "
                                   "to the paper's.")
    from balanceroute.analysis.reproduce import add_arguments, run_reproduce

    add_arguments(p)
    p.set_defaults(handler=run_reproduce)
