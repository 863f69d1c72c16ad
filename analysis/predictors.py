"""``balanceroute predictors``: held-out calibration of every termination predictor.

Each predictor is fitted on the leading ``--train-fraction`` of the trace and judged on the rest,
on trajectories sampled every H/2 steps: AUC, Brier score and expected calibration error of
``p_fin`` against ``[r ≤ H]``, the mean absolute error of ``mu_rem`` where the request does end in
the window, and the share of forecasts that pass BR-H's gate (``p_fin ≥ ½``). ``--simulate``
adds each ``brh-<predictor>`` row's routing outcome on the held-out part next to ``br0``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence

from balanceroute.core.workloads.base import Workload

__all__ = [
    "DEFAULT_PREDICTORS",
    "add_predictors_args",
    "calibration_records",
    "format_calibration",
    "run_predictors",
]

DEFAULT_PREDICTORS = ("oracle", "survival", "exact_match", "learned", "noise")
"""Predictors judged by default (``learned`` is skipped with a note when torch is missing)."""

_COLUMNS = (
    ("predictor", "predictor", "{}"),
    ("auc", "AUC", "{:.3f}"),
    ("brier", "Brier", "{:.4f}"),
    ("ece", "ECE", "{:.4f}"),
    ("mae_mu_rem", "MAE mu_rem", "{:.1f}"),
    ("gated_share", "passes gate", "{:.1%}"),
    ("fit_s", "fit (s)", "{:.1f}"),
    ("mean_imbalance", "BR-H imbalance", "{:,.0f}"),
    ("throughput_tok_s", "BR-H tok/s", "{:,.0f}"),
)


def add_predictors_args(parser: argparse.ArgumentParser) -> None:
    """Flags of ``balanceroute predictors``."""
    from balanceroute.analysis.args import add_workload_args

    add_workload_args(parser)
    g = parser.add_argument_group("predictors")
    g.add_argument("--predictors", default=",".join(DEFAULT_PREDICTORS),
                   help="comma-separated predictor names (default: %(default)s)")
    g.add_argument("--train-fraction", type=float, default=0.5,
                   help="leading share of the trace used for fitting; the rest is held out "
                        "(default: %(default)s)")
    g.add_argument("--horizon", "-H", type=int, default=None,
                   help="window H in decode steps (default: BR-H's default)")
    g.add_argument("--simulate", action="store_true",
                   help="also simulate brh-<predictor> and br0 on the held-out part")
    g.add_argument("--replicas", "-G", type=int, default=8, help="G for --simulate (default: 8)")
    g.add_argument("--slots", "-B", type=int, default=64, help="B for --simulate (default: 64)")
    g.add_argument("--json", action="store_true", help="print the records as JSON")


def calibration_records(
    train: Workload,
    test: Workload,
    names: Sequence[str],
    *,
    horizon: int,
    seed: int = 0,
    simulate_on: tuple[int, int] | None = None,
    on_predictor: Callable[[str], None] | None = None,
) -> list[dict]:
    """One record per predictor: held-out metrics of
    :func:`~balanceroute.core.predictors.evaluate_predictor`, ``fit_s`` and, with
    ``simulate_on=(G, B)``, the ``brh-<name>`` run's ``mean_imbalance`` and
    ``throughput_tok_s`` on ``test`` (plus a ``br0`` record for reference). A predictor whose
    extra is not installed gets a record with ``skipped`` set."""
    from balanceroute.core.policies import get_policy
    from balanceroute.core.policies.brh import BRHPolicy
    from balanceroute.core.predictors import PREDICTORS, evaluate_predictor, fit_predictor
    from balanceroute.core.simulator import SimConfig, simulate

    unknown = [n for n in names if n not in PREDICTORS]
    if unknown:
        raise ValueError(f"unknown predictor {', '.join(map(repr, unknown))}; valid: {', '.join(PREDICTORS)}")
    records: list[dict] = []
    config = None
    if simulate_on is not None:
        config = SimConfig(num_replicas=simulate_on[0], slots=simulate_on[1])
        base = simulate(test, get_policy("br0"), config).metrics
        records.append({"predictor": "(br0, no predictor)", "mean_imbalance": base["mean_imbalance"],
                        "throughput_tok_s": base["throughput_tok_s"]})
    for name in names:
        if on_predictor is not None:
            on_predictor(name)
        start = time.perf_counter()
        try:
            predictor = fit_predictor(name, train, horizon=horizon, seed=seed)
        except ImportError as exc:
            records.append({"predictor": name, "skipped": f"{exc} (install the extra)"})
            continue
        record: dict = {"predictor": name, "fit_s": time.perf_counter() - start}
        record.update(evaluate_predictor(predictor, test, horizon, seed=seed))
        if config is not None:
            policy = BRHPolicy(predictor=predictor, horizon=horizon, name=f"brh-{name}").bind(test)
            metrics = simulate(test, policy, config).metrics
            record["mean_imbalance"] = metrics["mean_imbalance"]
            record["throughput_tok_s"] = metrics["throughput_tok_s"]
        records.append(record)
    return records


def format_calibration(records: Sequence[dict]) -> str:
    """The records as a plain-text table (columns without values are left out)."""
    cols = [c for c in _COLUMNS if any(c[0] in r for r in records)]
    header = [h for _, h, _ in cols]
    rows: list[list[str] | str] = []
    for r in records:
        if "skipped" in r:  # one free-text line, kept out of the column widths
            rows.append(f"{r['predictor']}  skipped: {r['skipped']}")
            continue
        rows.append([
            "" if r.get(key) is None
            else "n/a" if isinstance(r[key], float) and math.isnan(r[key])
            else fmt.format(r[key])
            for key, _, fmt in cols
        ])
    table = [row for row in rows if isinstance(row, list)]
    widths = [max(len(x) for x in col) for col in zip(header, *table, strict=True)]

    def line(row: list[str]) -> str:
        cells = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        return "  ".join(cells).rstrip()

    out = [line(header), "  ".join("-" * w for w in widths)]
    out += [row if isinstance(row, str) else line(row) for row in rows]
    return "\n".join(out)


def run_predictors(args: argparse.Namespace) -> int:
    """Handler of ``balanceroute predictors``."""
    from balanceroute.analysis.args import workload_from_args
    from balanceroute.core.policies.brh import BRHPolicy
    from balanceroute.core.predictors import split_workload

    horizon = BRHPolicy().horizon if args.horizon is None else args.horizon
    if horizon < 1:
        raise ValueError(f"--horizon must be >= 1, got {horizon}")
    names = [n.strip() for n in args.predictors.split(",") if n.strip()]
    train, test = split_workload(workload_from_args(args), args.train_fraction)
    progress = None if args.json else (lambda name: print(f"fitting {name} ...", file=sys.stderr))
    records = calibration_records(
        train, test, names, horizon=horizon, seed=args.seed,
        simulate_on=(args.replicas, args.slots) if args.simulate else None, on_predictor=progress,
    )
    if args.json:
        print(json.dumps([{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                          for r in records], indent=2))
        return 0
    positive = next((r["positive_rate"] for r in records if "positive_rate" in r), math.nan)
    print(f"fitted on {train.name} ({len(train):,} requests), held out {test.name} "
          f"({len(test):,}); H = {horizon}, trajectories sampled every {max(horizon // 2, 1)} steps, "
          f"{positive:.1%} end within H")
    if test.prefix_hash is None:
        print("no prompt identity in this trace: exact_match is the survival fallback")
    print(format_calibration(records))
    return 0
