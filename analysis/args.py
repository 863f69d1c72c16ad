"""Shared command-line arguments of the experiment commands (``simulate``, ``compare``,
``tune``, ``predictors``): the workload, the simulated cluster and the sanity limits, and how
they become a :class:`~balanceroute.core.workloads.base.Workload` and a
:class:`~balanceroute.core.simulator.SimConfig`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from balanceroute.cli_checks import flag_error

__all__ = [
    "DEFAULT_REQUESTS", "add_cluster_args", "add_workload_args", "check_fill", "config_from_args",
    "limits_from_args", "policy_names_arg", "warn", "workload_from_args",
]

DEFAULT_REQUESTS = 20_000
#: SimConfig fields and the flags that set them (for error messages).
SIM_FLAGS = {"num_replicas": "--replicas", "slots": "--slots", "pool_size": "--pool-size",
             "rate_scale": "--rate-scale", "prefill_delay_s": "--prefill-delay", "mode": "--mode"}


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """``--workload``, ``--requests``, ``--seed``, the workload filters and ``--limit``."""
    g = parser.add_argument_group("workload")
    g.add_argument("--workload", default="servegen-r1",
                   help="a bundled name (see `balanceroute workloads`) or a trace file path "
                        "(default: %(default)s)")
    g.add_argument("--requests", type=int, default=DEFAULT_REQUESTS,
                   help="use the first N requests (generators draw N) (default: %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="seed for generators and random policies")
    g.add_argument("--min-output", type=int, default=None, help="keep requests with output >= this")
    g.add_argument("--max-output", type=int, default=None, help="keep requests with output <= this")
    g.add_argument("--limit", action="append", default=[], metavar="KEY=N",
                   help="raise or lower a sanity limit (repeatable): max_tokens (per prompt or "
                        "output, 2097152), max_replicas (4096), max_slots (65536), "
                        "max_requests (10000000), max_pool (1000000)")


def add_cluster_args(parser: argparse.ArgumentParser) -> None:
    """The simulated cluster: replicas, slots, pool, step model, arrival mode."""
    g = parser.add_argument_group("cluster")
    g.add_argument("--replicas", "-G", type=int, default=8, help="DP decode replicas G (default: 8)")
    g.add_argument("--slots", "-B", type=int, default=64, help="slots per replica B (default: 64)")
    g.add_argument("--mode", choices=("saturated", "open_loop"), default="saturated",
                   help="saturated: pool kept full in trace order; open_loop: trace timestamps")
    g.add_argument("--pool-size", type=int, default=None,
                   help="saturated pool target (default: 2*G)")
    g.add_argument("--rate-scale", type=float, default=None,
                   help="open loop: multiply the arrival rate by this (default: 1)")
    g.add_argument("--prefill-delay", type=float, default=None,
                   help="open loop: seconds from arrival to prefill completion (default: 0)")
    g.add_argument("--step-model", default="",
                   help="step time tau = b + max_g(a*L_g + c*n_g), e.g. 'b=0.03,a=2e-7,c=0' "
                        "(default: b=0.03 s, a=2e-7 s/token, c=0)")


def warn(message: str) -> None:
    """A one-line warning on stderr (printed even with ``--quiet``)."""
    print(f"balanceroute: warning: {message}", file=sys.stderr)


def limits_from_args(args: argparse.Namespace):
    """The :class:`~balanceroute.core.limits.Limits` of ``--limit`` (defaults otherwise)."""
    from balanceroute.core.limits import Limits

    return Limits.parse(getattr(args, "limit", None))


def workload_from_args(args: argparse.Namespace):
    """Load the workload the arguments name, within the sanity limits."""
    from balanceroute.core.workloads import load_workload

    limits = limits_from_args(args)
    if args.requests is not None and args.requests < 1:
        raise ValueError(f"--requests must be >= 1, got {args.requests}")
    limits.check("max_requests", args.requests, "--requests")
    for flag in ("min_output", "max_output"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    workload = load_workload(
        args.workload, requests=args.requests, seed=args.seed,
        min_output=args.min_output, max_output=args.max_output,
    )
    if len(workload) == 0:
        raise ValueError(f"{workload.name}: no request left after the length filters")
    limits.check_workload(workload)
    return workload


def config_from_args(args: argparse.Namespace, **overrides: Any):
    """The :class:`SimConfig` the arguments describe, within the sanity limits; warns about
    flags that the chosen mode ignores."""
    from balanceroute.core.dynamics import StepModel
    from balanceroute.core.simulator import SimConfig

    limits = limits_from_args(args)
    limits.check("max_replicas", args.replicas, "--replicas")
    limits.check("max_slots", args.slots, "--slots")
    limits.check("max_pool", args.pool_size, "--pool-size")
    if args.mode == "saturated":
        for flag, value in (("--rate-scale", args.rate_scale), ("--prefill-delay", args.prefill_delay)):
            if value is not None:
                warn(f"{flag} applies to --mode open_loop and is ignored in saturated mode")
    elif args.pool_size is not None:
        warn("--pool-size applies to --mode saturated and is ignored in open-loop mode")
    try:
        return SimConfig(
            num_replicas=args.replicas, slots=args.slots, mode=args.mode, pool_size=args.pool_size,
            rate_scale=1.0 if args.rate_scale is None else args.rate_scale,
            prefill_delay_s=0.0 if args.prefill_delay is None else args.prefill_delay,
            step_model=StepModel.parse(args.step_model), **overrides,
        )
    except ValueError as exc:  # name the flag, not the field
        raise flag_error(exc, SIM_FLAGS) from None


def check_fill(workload, config) -> None:
    """Warn when the run cannot fill the cluster (fewer requests than G·B slots)."""
    total = config.num_replicas * config.slots
    if len(workload) < total:
        warn(f"{len(workload):,} simulated requests for G*B = {total:,} slots: the cluster never "
             "fills, so every policy places each request on arrival and the comparison says "
             "little (use more --requests or fewer --slots)")


def policy_names_arg(text: str | None, option: str, *, quiet: bool = False) -> list[str]:
    """The policy names of a comma-separated ``option`` (``None``: the default rows, with a note
    per row left out for a missing extra); ``ValueError`` for an empty, unknown or repeated
    name."""
    from balanceroute.catalogue import CATALOGUE, default_names, missing_extras

    valid = list(CATALOGUE)
    if text is None:
        for name, extra in ({} if quiet else missing_extras()).items():
            print(f"note: {name} left out: install the {extra} extra for it (pip install '.[{extra}]')", file=sys.stderr)
        return default_names()
    names = [n.strip() for n in text.split(",")]
    if not any(names):
        raise ValueError(f"{option} {text!r} names no policy; valid: {', '.join(valid)}")
    if "" in names:
        raise ValueError(f"{option} {text!r} has an empty name between commas")
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(map(repr, unknown))}; valid: {', '.join(valid)}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{option} names {', '.join(map(repr, repeated))} more than once")
    return names
