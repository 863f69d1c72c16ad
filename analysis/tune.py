"""``balanceroute tune``: choose BR-H's H, γ, β and S_greedy on the training split only.

The training part of the trace is split again in trace order: the predictor is fitted on its
first part and each candidate is simulated on its second part, so the held-out test part that
``compare`` reports on is never touched. Candidates are the shipped defaults followed by a
seeded random sample of a grid (without repeats); ``br0`` on the same part is the reference.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Literal

import numpy as np

from balanceroute.core.workloads.base import Workload

__all__ = ["TuneGrid", "add_tune_args", "format_tune", "run_tune", "tune_brh"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneGrid:
    """Candidate values; β is searched as β/G so one grid serves every G."""

    horizon: tuple[int, ...] = (40, 80, 160, 240)
    gamma: tuple[float, ...] = (0.86, 0.95, 0.99, 1.0)
    beta_per_replica: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0)
    s_greedy: tuple[int, ...] = (0, 8, 16, 32)

    def __post_init__(self) -> None:
        for name in ("horizon", "gamma", "beta_per_replica", "s_greedy"):
            if not getattr(self, name):
                raise ValueError(f"grid {name} must not be empty")
        if min(self.horizon) < 1:
            raise ValueError(f"grid {self.horizon=} must be >= 1")

    def points(self) -> list[tuple[int, float, float, int]]:
        """Every (H, γ, β/G, S_greedy) combination."""
        return list(product(self.horizon, self.gamma, self.beta_per_replica, self.s_greedy))


def tune_brh(
    train: Workload,
    *,
    num_replicas: int,
    slots: int = 64,
    pool_size: int | None = None,
    predictor: str = "survival",
    trials: int = 16,
    seed: int = 0,
    grid: TuneGrid | None = None,
    inner_fraction: float = 0.5,
    objective: Literal["mean_imbalance", "throughput_tok_s"] = "mean_imbalance",
    progress: Callable[[int, int, dict], None] | None = None,
) -> list[dict]:
    """Simulate ``trials`` candidates on the inner split of ``train``; best first.

    Each record holds ``horizon, gamma, beta, beta_per_replica, s_greedy`` (``policy="brh"``)
    and the run's ``mean_imbalance``, ``throughput_tok_s``, ``tpot_ms_p95``; one ``br0`` record
    is included. ``progress(done, total, record)`` is called after every simulation.
    """
    from balanceroute.core.policies import get_policy
    from balanceroute.core.policies.brh import BRHPolicy
    from balanceroute.core.predictors import fit_predictor, split_workload
    from balanceroute.core.simulator import SimConfig, simulate

    if trials < 1:
        raise ValueError(f"{trials=} must be >= 1")
    if objective not in ("mean_imbalance", "throughput_tok_s"):
        raise ValueError(f"{objective=} must be 'mean_imbalance' or 'throughput_tok_s'")
    grid = grid or TuneGrid()
    fit_part, eval_part = split_workload(train, inner_fraction)
    config = SimConfig(num_replicas=num_replicas, slots=slots, pool_size=pool_size)
    default = BRHPolicy()
    g = float(num_replicas)
    first = (default.horizon, default.gamma, default.beta_for(num_replicas) / g, default.s_greedy)
    points = [p for p in grid.points() if p != first]
    rng = np.random.default_rng(seed)
    chosen = [first] + [points[i] for i in rng.permutation(len(points))[: trials - 1]]
    total = len(chosen) + 1
    fitted: dict[int, object] = {}
    records: list[dict] = []

    def run(policy, record: dict) -> None:
        metrics = simulate(eval_part, policy, config).metrics
        record.update({k: metrics[k] for k in ("mean_imbalance", "throughput_tok_s", "tpot_ms_p95")})
        records.append(record)
        if progress is not None:
            progress(len(records), total, record)

    run(get_policy("br0", s_greedy=default.s_greedy), {"policy": "br0"})
    for horizon, gamma, beta_g, s_greedy in chosen:
        if horizon not in fitted:
            fitted[horizon] = fit_predictor(predictor, fit_part, horizon=horizon, seed=seed)
        policy = BRHPolicy(
            predictor=fitted[horizon], horizon=horizon, gamma=gamma, beta=beta_g * g,
            s_greedy=s_greedy,
        ).bind(eval_part)
        run(policy, {"policy": "brh", "predictor": predictor, "horizon": horizon, "gamma": gamma,
                     "beta": beta_g * g, "beta_per_replica": beta_g, "s_greedy": s_greedy,
                     "default": (horizon, gamma, beta_g, s_greedy) == first})
    sign = 1.0 if objective == "mean_imbalance" else -1.0
    return sorted(records, key=lambda r: sign * r[objective])


def add_tune_args(parser: argparse.ArgumentParser) -> None:
    """Flags of ``balanceroute tune``."""
    from balanceroute.analysis.args import add_workload_args
    from balanceroute.progress import add_quiet_arg

    add_workload_args(parser)
    g = parser.add_argument_group("tuning")
    g.add_argument("--train-fraction", type=float, default=0.5,
                   help="leading share of the trace to tune on; the rest is never used "
                        "(default: %(default)s)")
    g.add_argument("--replicas", "-G", type=int, default=8, help="DP decode replicas G (default: 8)")
    g.add_argument("--slots", "-B", type=int, default=64, help="slots per replica B (default: 64)")
    g.add_argument("--pool-size", type=int, default=None, help="saturated pool target (default: 2*G)")
    g.add_argument("--horizon", "-H", default=None,
                   help="comma-separated candidate windows H (default: 40,80,160,240)")
    g.add_argument("--predictor", default="survival", help="predictor to tune with (default: survival)")
    g.add_argument("--trials", type=int, default=16, help="candidates simulated (default: 16)")
    g.add_argument("--objective", choices=("mean_imbalance", "throughput_tok_s"),
                   default="mean_imbalance", help="what to optimise (default: %(default)s)")
    g.add_argument("--json", action="store_true", help="print the records as JSON")
    g.add_argument("--write-params", metavar="FILE",
                   help="write the chosen parameters as a file that simulate/compare/serve "
                        "take with --params FILE")
    add_quiet_arg(g)


def format_tune(records: Sequence[dict], limit: int = 10) -> str:
    """The best ``limit`` records (and br0) as a plain-text table."""
    shown = list(records[:limit])
    shown += [r for r in records[limit:] if r["policy"] == "br0"]
    header = ["policy", "H", "gamma", "beta (beta/G)", "S_greedy", "mean imbalance", "TPOT P95 (ms)", "tok/s"]
    rows = []
    for r in shown:
        if r["policy"] == "br0":
            rows.append(["br0", "-", "-", "-", "-"])
        else:
            rows.append([
                "brh" + (" (default)" if r.get("default") else ""), str(r["horizon"]), f"{r['gamma']:g}",
                f"{r['beta']:g} ({r['beta_per_replica']:g})", str(r["s_greedy"]),
            ])
        rows[-1] += [f"{r['mean_imbalance']:,.0f}", f"{r['tpot_ms_p95']:.1f}", f"{r['throughput_tok_s']:,.0f}"]
    widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=True)]
    line = lambda row: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))  # noqa: E731
    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows)])


def run_tune(args: argparse.Namespace) -> int:
    """Handler of ``balanceroute tune``."""
    from balanceroute.analysis.args import limits_from_args, workload_from_args
    from balanceroute.catalogue import CATALOGUE
    from balanceroute.cli_checks import output_file
    from balanceroute.core.predictors import split_workload
    from balanceroute.progress import progress

    variants = {e.predictor: n for n, e in CATALOGUE.items() if n.startswith("brh-")}
    if args.predictor not in variants:
        raise ValueError(f"--predictor {args.predictor!r}: choose one of {', '.join(variants)}")
    variant = variants[args.predictor]
    if args.trials < 1:
        raise ValueError(f"--trials={args.trials} must be >= 1")
    output_file(args.write_params, "--write-params")
    limits = limits_from_args(args)
    limits.check("max_replicas", args.replicas, "--replicas")
    limits.check("max_slots", args.slots, "--slots")
    limits.check("max_pool", args.pool_size, "--pool-size")
    grid = TuneGrid()
    if args.horizon:
        try:
            horizons = tuple(int(h) for h in args.horizon.split(",") if h.strip())
        except ValueError:
            raise ValueError(f"--horizon {args.horizon!r}: expected integers like 40,80,160") from None
        grid = TuneGrid(horizon=horizons, gamma=grid.gamma, beta_per_replica=grid.beta_per_replica,
                        s_greedy=grid.s_greedy)
    train, _ = split_workload(workload_from_args(args), args.train_fraction)
    with progress(args.trials + 1, "tuning", "runs", quiet=args.quiet) as bar:
        records = tune_brh(
            train, num_replicas=args.replicas, slots=args.slots, pool_size=args.pool_size,
            predictor=args.predictor, trials=args.trials, seed=args.seed, grid=grid,
            objective=args.objective, progress=lambda done, total, rec: bar.update(1),
        )
    best = next(r for r in records if r["policy"] == "brh")
    base = next(r for r in records if r["policy"] == "br0")
    if args.write_params:
        from balanceroute.params import write_params

        write_params(args.write_params, variant,
                     {k: best[k] for k in ("horizon", "gamma", "beta", "s_greedy")},
                     {"command": "tune", "workload": train.name, "requests": len(train),
                      "train_fraction": args.train_fraction, "seed": args.seed,
                      "replicas": args.replicas, "slots": args.slots,
                      "objective": args.objective, "trials": args.trials,
                      "mean_imbalance": best["mean_imbalance"],
                      "br0_mean_imbalance": base["mean_imbalance"]})
    if args.json:
        print(json.dumps([{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                          for r in records], indent=2))
        return 0
    print(f"tuned on {train.name} ({len(train):,} requests: predictor fitted on the first half, "
          f"candidates simulated on the second); G={args.replicas}, B={args.slots}, "
          f"objective {args.objective}")
    print(format_tune(records))
    change = 100.0 * (best["mean_imbalance"] / base["mean_imbalance"] - 1.0)
    print(f"chosen: horizon={best['horizon']} gamma={best['gamma']:g} beta={best['beta']:g} "
          f"(= {best['beta_per_replica']:g}·G) s_greedy={best['s_greedy']} "
          f"({change:+.1f}% imbalance vs br0 on the tuning split)")
    if args.write_params:
        print(f"written to {args.write_params}: pass it as --params {args.write_params}")
    return 0
