"""Tick latency of BR-0 and BR-H (H = 80) against the literal pure-Python reference tick.

States come from saturated BR-0 simulations (G replicas, B = 64), captured once the cluster is
full; the pool is replaced by one of each wanted size drawn from the workload. Every cell times
``policy.assign`` (BR-H: survival forecast + projection + two-stage tick) and the same policy
deciding with ``reference_tick``; the decisions are checked to be identical. Also prints the
numba compile and cache-load times (child processes).

    python benchmarks/bench_tick.py [--quick] [--json] [--replicas 8,16,64,256] [--pools 64,256,2048]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from balanceroute.analysis.bench import (
    QUICK,
    BenchConfig,
    bench_compile,
    bench_ticks,
    format_records,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="G in {8, 64}, pools {256, 2048}")
    parser.add_argument("--json", action="store_true", help="print JSON records")
    parser.add_argument("--replicas", default=None, help="comma-separated G (default 8,16,64,256)")
    parser.add_argument("--pools", default=None, help="comma-separated pool sizes (default 64,256,2048)")
    parser.add_argument("--policies", default=None, help="br0,brh")
    parser.add_argument("--horizon", type=int, default=80)
    parser.add_argument("--snapshots", type=int, default=None, help="states per G")
    args = parser.parse_args()
    cfg = QUICK if args.quick else BenchConfig()
    changes: dict = {"horizon": args.horizon}
    if args.replicas:
        changes["replicas"] = tuple(int(x) for x in args.replicas.split(","))
    if args.pools:
        changes["pools"] = tuple(int(x) for x in args.pools.split(","))
    if args.policies:
        changes["policies"] = tuple(args.policies.split(","))
    if args.snapshots:
        changes["snapshots"] = args.snapshots
    cfg = replace(cfg, **changes)
    records = [bench_compile()] + bench_ticks(cfg, log=lambda s: print(s, file=sys.stderr))
    print(json.dumps(records, indent=2) if args.json else format_records(records))


if __name__ == "__main__":
    main()
