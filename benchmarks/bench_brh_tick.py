"""Scheduling-tick cost of BR-H against BR-0, measured in the same run on the same states.

A saturated simulation (the paper's regime) is run once per policy with ``assign`` wrapped by a
timer; only ticks that place something are counted. Prints P50/P99 per tick in ms and the
ratio to BR-0 (the paper: tick P50 1.20 ms / P99 2.77 ms at G = 8).

    python benchmarks/bench_brh_tick.py [--workload servegen-r1] [--replicas 8] [--requests 6000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from balanceroute.catalogue import build_policy
from balanceroute.core.predictors import split_workload
from balanceroute.core.simulator import SimConfig, simulate
from balanceroute.core.workloads import load_workload


class _Timed:
    """Wraps a policy; records the wall time of every tick that assigns something."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.name = policy.name
        self.times: list[float] = []

    def assign(self, state, pool):
        start = time.perf_counter()
        out = self.policy.assign(state, pool)
        if len(out):
            self.times.append(time.perf_counter() - start)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="servegen-r1")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--policies", default="br0,brh-survival,brh-oracle,brh-learned")
    args = parser.parse_args()
    train, test = split_workload(load_workload(args.workload, requests=args.requests), 0.5)
    config = SimConfig(num_replicas=args.replicas, slots=args.slots)
    base = None
    print(f"{args.workload}: {len(test):,} requests, G={args.replicas}, B={args.slots}, pool {config.pool_target}")
    for name in args.policies.split(","):
        try:
            timed = _Timed(build_policy(name, train=train, test=test))
        except ImportError as exc:
            print(f"{name:14s} skipped: {exc}")
            continue
        simulate(test, timed, config)
        t = np.array(timed.times) * 1e3
        p50, p99 = np.percentile(t, [50, 99])
        base = base or (p50, p99)
        print(f"{name:14s} ticks {t.size:6d}  P50 {p50:6.3f} ms  P99 {p99:6.3f} ms  "
              f"(x{p50 / base[0]:.1f} / x{p99 / base[1]:.1f} of {args.policies.split(',')[0]})")


if __name__ == "__main__":
    main()
