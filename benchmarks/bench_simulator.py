"""Simulator speed in replica-steps per second (steps × G / wall time): the fused compiled loop
and the generic loop (``policy.assign`` every tick) against the naive per-request-object
reference simulator (``benchmarks.reference.naive_simulate``), same run, same results.

    python benchmarks/bench_simulator.py [--requests 20000] [--replicas 16] [--naive-budget S] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from balanceroute.analysis.bench import BenchConfig, bench_simulator, format_records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="servegen-r1")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--policies", default="jsq,br0")
    parser.add_argument("--naive-budget", type=float, default=None,
                        help="cap the naive reference at this many seconds (default: full run)")
    parser.add_argument("--json", action="store_true", help="print JSON records")
    args = parser.parse_args()
    cfg = replace(BenchConfig(), workload=args.workload, sim_requests=args.requests,
                  sim_replicas=args.replicas, slots=args.slots,
                  sim_policies=tuple(args.policies.split(",")), naive_budget_s=args.naive_budget)
    records = bench_simulator(cfg, log=lambda s: print(s, file=sys.stderr))
    print(json.dumps(records, indent=2) if args.json else format_records(records))


if __name__ == "__main__":
    main()
