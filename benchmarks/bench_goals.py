"""The speed goals, each figure printed next to its reference and goal, in one run.

    python benchmarks/bench_goals.py                  # ticks, simulator, start-up, compile
    python benchmarks/bench_goals.py --rounds 20 --states 60 --json
    python benchmarks/bench_goals.py --reproduce      # also `reproduce --quick`, warm cache (minutes)

The machine is shared, so every figure that can be is a ratio against a baseline measured in
the same run, in alternating rounds (A B A B ...): the simulator's BR-0 fused loop against JSQ's
fused loop, ``balanceroute --version`` against a bare interpreter start. Tick P99s are over
``--states`` saturated states of each state's median over ``--rounds`` rounds (a preemption
hits one round, not one state), in CPU time of the timing thread (wall time beside it), next
to the paper's 2,770 µs; the simulator counts replica-steps per CPU-second too. The load average is printed
before and after each section; a figure measured at a load above the core count is flagged.
The proxy's CPU per relayed token is ``benchmarks/bench_proxy.py --section peer`` (it needs
vllm-router: ``make bench-venv``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

PAPER_TICK_US = 2770.0

#: (policy, G, pool, goal P99 µs) — the tick goals.
TICK_GOALS = (("br0", 8, 256, 50.0), ("br0", 8, 2048, 50.0), ("brh", 8, 256, 200.0),
              ("brh", 64, 2048, 1000.0))


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f}/{five:.2f}"


def _busy() -> bool:
    return os.getloadavg()[0] > (os.cpu_count() or 1)


def _row(figure: str, value: str, reference: str, goal: str, load: str, **extra: Any) -> dict:
    return {"figure": figure, "value": value, "reference": reference, "goal": goal, "load": load,
            **extra}


def _tick_cpu_us(policy: Any, cases: list, rounds: int) -> tuple[float, float]:
    """P50/P99 over states of each state's median CPU time of ``policy.assign`` (this thread's
    CPU: another process's preemption is not counted), ``rounds`` rounds over all states."""
    import gc

    times = np.empty((rounds, len(cases)))
    policy.assign(*cases[0])
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            for j, (state, pool) in enumerate(cases):
                t0 = time.thread_time_ns()
                policy.assign(state, pool)
                times[r, j] = time.thread_time_ns() - t0
    finally:
        if gc_was:
            gc.enable()
    per_state = np.median(times, axis=0) / 1e3
    return float(np.percentile(per_state, 50)), float(np.percentile(per_state, 99))


def bench_ticks(states: int, rounds: int, horizon: int = 80) -> list[dict]:
    """Tick P50/P99 of the goal cells (decisions checked against the reference)."""
    from balanceroute.analysis.bench import (
        _build_tick_policy,
        _resized_pool,
        _tick_cell,
        capture_states,
    )
    from balanceroute.core.predictors import split_workload
    from balanceroute.core.workloads import load_workload

    rng = np.random.default_rng(0)
    rows = []
    for g_count in sorted({g for _, g, _, _ in TICK_GOALS}):
        need = int(g_count * 64 * 1.6 + 40 * g_count * (300 + 3 * states) / 1000) + 4000
        train, test = split_workload(load_workload("servegen-r1", requests=2 * need, seed=0), 0.5)
        captured = capture_states(test, num_replicas=g_count, slots=64, count=states,
                                  warmup_steps=300)
        for name, g, size, goal in TICK_GOALS:
            if g != g_count:
                continue
            load0 = _load()
            policy = _build_tick_policy(name, train, test, horizon)
            cases = [(state, _resized_pool(test, size, rng)) for state, _ in captured]
            cell = _tick_cell(policy, cases, rounds, budget_s=0.5)  # wall; decisions checked
            p50, p99 = _tick_cpu_us(policy, cases, rounds)
            rows.append(_row(
                f"{name} tick P99 (CPU), G = {g}, pool {size}", f"{p99:,.0f} µs",
                f"paper {PAPER_TICK_US:,.0f} µs (ours / paper {p99 / PAPER_TICK_US:.3f}); P50 "
                f"{p50:,.0f} µs; wall P99 {cell['p99_us']:,.0f} µs", f"≤ {goal:,.0f} µs",
                f"{load0} → {_load()}", p50_us=p50, p99_us=p99, wall_p50_us=cell["p50_us"],
                wall_p99_us=cell["p99_us"], states=cell["states"], rounds=rounds,
                same_decisions=cell["same_decisions"], met=p99 <= goal))
    return rows


def bench_simulator(rounds: int, requests: int = 20_000) -> list[dict]:
    """BR-0's fused loop against JSQ's, G = 16, B = 64, alternating rounds; replica-steps per
    CPU-second of the simulating thread (a run lasts milliseconds: wall time on a shared
    machine is mostly other processes' preemptions)."""
    from balanceroute.core.policies import get_policy
    from balanceroute.core.simulator import SimConfig, simulate
    from balanceroute.core.workloads import load_workload

    workload = load_workload("servegen-r1", requests=requests, seed=0)
    config = SimConfig(num_replicas=16, slots=64)
    for name in ("jsq", "br0"):  # compile or load first
        simulate(workload.take(np.arange(200)), get_policy(name), config, engine="fused")
    load0 = _load()
    rate: dict[str, list[float]] = {"jsq": [], "br0": []}
    for _ in range(rounds):
        for name in ("jsq", "br0"):
            t0 = time.thread_time()  # this thread's CPU: a preemption by another process is not
            res = simulate(workload, get_policy(name), config, engine="fused")  # counted
            rate[name].append(res.metrics["steps"] * 16 / (time.thread_time() - t0))
    ratio = np.array(rate["br0"]) / np.array(rate["jsq"])
    br0, jsq = float(np.median(rate["br0"])), float(np.median(rate["jsq"]))
    return [_row("simulator, br0 fused, G = 16 (replica-steps per CPU-s)", f"{br0 / 1e6:.1f} M",
                 f"jsq fused {jsq / 1e6:.1f} M, same run; br0 / jsq {np.median(ratio):.2f} "
                 f"(rounds {ratio.min():.2f}-{ratio.max():.2f})", "≥ 0.7× jsq",
                 f"{load0} → {_load()}", br0=br0, jsq=jsq, ratio=float(np.median(ratio)),
                 rounds=rounds, met=float(np.median(ratio)) >= 0.7)]


def _child_cpu(cmd: list[str], env: dict[str, str] | None = None, *, unset: tuple[str, ...] = (),
               cwd: str | None = None) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one child process run to its end (and its children's),
    with ``env`` added to this environment and ``unset`` taken out of it; ``RuntimeError`` if
    it failed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    child = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
    done = subprocess.run(cmd, env=child, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[-3:])} failed: {done.stderr.strip()[-500:]}")
    return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime), wall


def bench_version(rounds: int) -> list[dict]:
    """``balanceroute --version`` against ``python -c pass``, alternating."""
    load0 = _load()
    ours, bare = [], []
    cli = [sys.executable, "-m", "balanceroute.cli", "--version"]
    for _ in range(rounds):
        ours.append(_child_cpu(cli)[0])
        bare.append(_child_cpu([sys.executable, "-c", "pass"])[0])
    value = float(np.median(ours))
    return [_row("`balanceroute --version` (CPU s)", f"{value:.3f} s",
                 f"bare interpreter {np.median(bare):.3f} s, same run", "≤ 0.3 s",
                 f"{load0} → {_load()}", cpu_s=value, bare_cpu_s=float(np.median(bare)),
                 rounds=rounds, met=value <= 0.3)]


_COMPILE = """
import json, time
t0 = time.perf_counter()
from balanceroute.warm import warm_kernels
seconds = warm_kernels()
print(json.dumps({"total_s": time.perf_counter() - t0, **seconds}))
"""


def bench_compile() -> list[dict]:
    """The kernels compiled on an empty numba cache, then loaded from it (child processes);
    then what ``pip install .`` ships: the package's wheel built (which compiles the kernels
    into it, setup.py) and unpacked elsewhere, its first run on no other cache."""
    from pathlib import Path

    if not __package__:  # run as a script: the repository root holds ``tests.factories``
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.factories import built_package

    load0 = _load()
    cache = tempfile.mkdtemp(prefix="numba-cache-")
    try:
        env = {"NUMBA_CACHE_DIR": cache}
        cmd = [sys.executable, "-c", _COMPILE]
        cold_cpu, cold_wall = _child_cpu(cmd, env)
        warm_cpu, warm_wall = _child_cpu(cmd, env)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    rows = [_row("numba compile on an empty cache (CPU s)", f"{cold_cpu:.1f} s",
                 f"loaded from the cache {warm_cpu:.1f} s, same run (wall {cold_wall:.1f} / "
                 f"{warm_wall:.1f} s); 4 s + 8 s before the fill tick", "≤ 10 s, or shipped ahead",
                 f"{load0} → {_load()}", cold_cpu_s=cold_cpu, warm_cpu_s=warm_cpu,
                 cold_wall_s=cold_wall, warm_wall_s=warm_wall, met=cold_cpu <= 10)]
    load0 = _load()
    tmp = Path(tempfile.mkdtemp(prefix="built-package-"))
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        site = built_package(tmp, "site", warm=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        build_cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        first_cpu, first_wall = _child_cpu(  # numba's cache in the package only, as installed
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n" + _COMPILE],
            unset=("NUMBA_CACHE_DIR",), cwd=str(site))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows.append(_row("first run after `pip install .`, kernels shipped (CPU s)", f"{first_cpu:.1f} s",
                     f"the build compiled them: {build_cpu:.0f} CPU-s in `pip wheel`, same run",
                     "≤ 10 s, or shipped ahead", f"{load0} → {_load()}", first_cpu_s=first_cpu,
                     first_wall_s=first_wall, build_cpu_s=build_cpu, met=first_cpu <= 10))
    return rows


def bench_reproduce() -> list[dict]:
    """``balanceroute reproduce --quick`` on a warm numba cache, into a fresh folder."""
    out = tempfile.mkdtemp(prefix="reproduce-quick-")
    try:
        subprocess.run([sys.executable, "-m", "balanceroute.warm"], check=False,
                       stdout=subprocess.DEVNULL)
        load0 = _load()
        cpu, wall = _child_cpu([sys.executable, "-m", "balanceroute.cli", "reproduce", "--quick",
                                "--out", out, "-q"])
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return [_row("`reproduce --quick`, warm cache (wall)", f"{wall:.0f} s ({cpu:.0f} CPU-s)",
                 "README says 1 min", "≤ 120 s", f"{load0} → {_load()}", wall_s=wall,
                 cpu_s=cpu, met=wall <= 120)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds (default 10)")
    parser.add_argument("--states", type=int, default=40, help="saturated states per G (default 40)")
    parser.add_argument("--skip", default="", help="comma-separated: ticks,simulator,version,compile")
    parser.add_argument("--reproduce", action="store_true", help="also time reproduce --quick")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    sections = [("version", lambda: bench_version(args.rounds)),
                ("ticks", lambda: bench_ticks(args.states, args.rounds)),
                ("simulator", lambda: bench_simulator(args.rounds)),
                ("compile", bench_compile)]
    if args.reproduce:
        sections.append(("reproduce", bench_reproduce))
    print(f"load average (1/5 min) at the start: {_load()} on {os.cpu_count()} CPUs",
          file=sys.stderr)
    rows: list[dict] = []
    for name, run in sections:
        if name in skip:
            continue
        busy = _busy()
        for row in run():
            row["busy"] = busy or _busy()
            rows.append(row)
            print(f"{row['figure']}: {row['value']} | {row['reference']} | goal {row['goal']}"
                  f" | load {row['load']}" + (" (busy)" if row["busy"] else ""), file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("| figure | now | reference, same run | goal | met | load (1/5 min) |")
    print("|---|---:|---|---:|:---:|---|")
    for r in rows:
        print(f"| {r['figure']} | {r['value']} | {r['reference']} | {r['goal']} | "
              f"{'yes' if r['met'] else 'no'} | {r['load']}{' busy' if r['busy'] else ''} |")


if __name__ == "__main__":
    main()
