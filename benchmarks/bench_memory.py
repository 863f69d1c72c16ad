"""Peak RSS of 1,000,000-request saturated runs (G = 16, B = 64), each in a child process.

Three runs: BR-0 on ServeGen-R1 lengths (≈ 1.8 M steps, fused loop), BR-0 and JSQ (generic
loop, the baseline) on short lognormal outputs (≈ 32 k steps). Per-request outcome columns are
O(n); nothing grows with the number of steps, so the fused runs' peaks agree although their
step counts differ 50-fold.

    python benchmarks/bench_memory.py [--requests 1000000] [--json]
"""

from __future__ import annotations

import argparse
import json

from balanceroute.analysis.bench import bench_memory, format_records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true", help="print JSON records")
    args = parser.parse_args()
    records = [
        bench_memory(args.requests, policy="br0", engine="fused", source="servegen-r1"),
        bench_memory(args.requests, policy="br0", engine="fused", source="short"),
        bench_memory(args.requests, policy="jsq", engine="generic", source="short"),
    ]
    print(json.dumps(records, indent=2) if args.json else format_records(records))


if __name__ == "__main__":
    main()
