"""``balanceroute bench`` on a tiny configuration: it runs, its records are complete, and the
compiled tick decides exactly as the reference on every captured state (no timing asserted)."""

from __future__ import annotations

import json

from balanceroute.analysis.bench import BenchConfig, bench_simulator, bench_ticks, format_records
from balanceroute.cli import main

TINY = BenchConfig(replicas=(2,), pools=(8, 40), slots=4, snapshots=3, warmup_steps=30, repeats=2,
                   reference_budget_s=1.0, sim_requests=150, sim_replicas=2, horizon=12)


def test_tick_records_agree_with_the_reference():
    records = bench_ticks(TINY)
    assert [(r["policy"], r["pool"]) for r in records] == [
        ("br0", 8), ("br0", 40), ("brh(H=12)", 8), ("brh(H=12)", 40)]
    for r in records:
        assert r["kind"] == "tick" and r["same_decisions"]
        assert r["p50_us"] > 0 and r["p99_us"] >= r["p50_us"] and r["reference_ticks"] >= 1
        assert r["timings"] == TINY.repeats * r["states"]


def test_simulator_records_and_table():
    records = bench_simulator(TINY)
    assert [r["policy"] for r in records] == ["jsq", "br0"]
    for r in records:
        assert r["naive_steps"] == r["steps"] and not r["naive_partial"]
        assert r["fused_replica_steps_per_s"] > 0 and r["generic_replica_steps_per_s"] > 0
    table = format_records(records)
    assert "fused/naive" in table and "br0" in table


def test_cli_prints_json_records(capsys):
    assert main(["bench", "--json", "--replicas", "2", "--pools", "8", "--policies", "br0",
                 "--no-sim", "--no-compile", "--quick"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert len(records) == 1 and {"p50_us", "p99_us", "replicas", "pool"} <= records[0].keys()
    assert main(["bench", "--pools", "x"]) == 2
