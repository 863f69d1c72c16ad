"""How fast the decision and the simulator are on this machine (``balanceroute bench``).

Every figure is a ratio against a baseline measured in the same run:

* **tick latency** of BR-0 and BR-H (``policy.assign``: for BR-H the forecast and the projection
  included) on states captured from saturated BR-0 simulations (a recording wrapper keeps
  :class:`ClusterState`/:class:`PoolView` snapshots once the cluster is full), with the pool
  replaced by one of the wanted size drawn from the workload; against the same policy whose
  decision is made by the literal pure-Python reference
  (:func:`~balanceroute.analysis.reference.reference_tick`). Both make the same decisions (checked
  on every timed state). The first call (compilation or cache load) is reported apart.
* **simulator speed** in replica-steps per second (steps × G / wall time) of a saturated run, for
  the fused compiled loop and the generic loop, against the per-request-object reference
  simulator (:func:`~balanceroute.analysis.reference.naive_simulate`).
* **compile time** of the numba kernels (fresh cache) and their cached load time, and **peak
  memory** (``ru_maxrss``) of a long run, each measured in a child process.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

__all__ = [
    "QUICK",
    "BenchConfig",
    "capture_states",
    "format_records",
    "run_bench",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """What ``balanceroute bench`` measures.

    ``replicas`` × ``pools`` × ``policies`` tick-latency cells on ``snapshots`` saturated states
    per G (B = ``slots``), each timed ``repeats`` times; the reference gets at most
    ``reference_budget_s`` of wall time per cell. The simulator is timed on ``sim_requests``
    requests at G = ``sim_replicas``; the naive reference simulator runs to the end unless
    ``naive_budget_s`` caps it (its rate is then that of the loaded prefix of the run).
    """

    workload: str = "servegen-r1"
    replicas: tuple[int, ...] = (8, 16, 64, 256)
    pools: tuple[int, ...] = (64, 256, 2048)
    policies: tuple[str, ...] = ("br0", "brh")
    slots: int = 64
    horizon: int = 80
    snapshots: int = 40
    warmup_steps: int = 600
    repeats: int = 5
    reference_budget_s: float = 2.0
    sim_requests: int = 20_000
    sim_replicas: int = 16
    sim_policies: tuple[str, ...] = ("jsq", "br0")
    naive_budget_s: float | None = None
    memory_requests: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("replicas", "pools"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise ValueError(f"{name}={values!r} must be positive integers")
        unknown = [p for p in self.policies if p not in ("br0", "brh")]
        if unknown:
            raise ValueError(f"policies={unknown!r} must be among 'br0', 'brh'")
        if self.snapshots < 1 or self.repeats < 1:
            raise ValueError(f"{self.snapshots=} and {self.repeats=} must be >= 1")
        if self.horizon < 1:
            raise ValueError(f"{self.horizon=} must be >= 1")


QUICK = BenchConfig(
    replicas=(8, 64), pools=(256, 2048), snapshots=12, warmup_steps=300, repeats=3,
    reference_budget_s=0.4, sim_requests=4000, naive_budget_s=3.0,
)
"""About a minute on a laptop: two G, two pool sizes, a short simulator run."""


# ------------------------------------------------------------------------------ states


class _Enough(Exception):
    """Raised by the recorder to end a capture run early."""


class _Recorder:
    """Wraps a policy; keeps every ``stride``-th tick's inputs after ``warmup`` steps."""

    def __init__(self, policy: Any, *, warmup: int, count: int, stride: int) -> None:
        self.policy, self.name = policy, policy.name
        self.warmup, self.count, self.stride = warmup, count, stride
        self.states: list[tuple[Any, Any]] = []
        self._seen = 0

    def assign(self, state: Any, pool: Any) -> Any:
        if state.step >= self.warmup:
            if self._seen % self.stride == 0:
                self.states.append((state, pool))
                if len(self.states) >= self.count:
                    raise _Enough
            self._seen += 1
        return self.policy.assign(state, pool)


def capture_states(
    workload: Any, *, num_replicas: int, slots: int, count: int, warmup_steps: int,
    stride: int = 3,
) -> list[tuple[Any, Any]]:
    """``count`` (ClusterState, PoolView) pairs met by BR-0 in a saturated run on ``workload``
    (G = ``num_replicas``, B = ``slots``), every ``stride``-th tick from step ``warmup_steps``
    on: a full cluster with the free slots the completions of one step leave."""
    from balanceroute.core.policies import get_policy
    from balanceroute.core.simulator import SimConfig, simulate

    recorder = _Recorder(get_policy("br0"), warmup=warmup_steps, count=count, stride=stride)
    config = SimConfig(num_replicas=num_replicas, slots=slots, check_assignments=False)
    try:
        simulate(workload, recorder, config, engine="generic")
    except _Enough:
        pass
    if not recorder.states:
        raise ValueError(f"workload {workload.name!r} is too short to reach step {warmup_steps} "
                         f"at G={num_replicas}, B={slots}")
    return recorder.states


def _resized_pool(workload: Any, size: int, rng: np.random.Generator) -> Any:
    """``size`` pooled requests drawn from ``workload`` (FIFO: the head waited longest, < 1 s)."""
    from balanceroute.core.state import PoolView

    rows = np.sort(rng.choice(len(workload), size=size, replace=size > len(workload)))
    wait = np.sort(rng.uniform(0.0, 1.0, size))[::-1].copy()
    return PoolView(prompt_len=workload.prompt_len[rows].astype(np.int64), wait=wait,
                    request_ids=rows.astype(np.int64))


# ------------------------------------------------------------------------------ ticks


def _reference_assign(proj_loads, free_slots, prompt_len, wait, *, d, alpha, beta, s_greedy,
                      r_max, deadline_s, growth=None, **options):
    """``two_stage_assign``'s contract answered by the pure-Python reference."""
    from balanceroute.core.state import Assignment

    from .reference import reference_tick

    pairs = reference_tick(
        np.asarray(proj_loads, dtype=np.float64).tolist(), np.asarray(free_slots).tolist(),
        np.asarray(prompt_len).tolist(), np.asarray(wait, dtype=np.float64).tolist(),
        d=np.asarray(d, dtype=np.float64).tolist(), alpha=alpha, beta=beta, s_greedy=s_greedy,
        r_max=r_max, deadline_s=deadline_s,
        growth=None if growth is None else np.asarray(growth, dtype=np.float64).tolist(),
        **options,  # score, stage1, growth_steps, ttft_slo_s
    )
    return Assignment(pool_index=np.array([i for i, _ in pairs], dtype=np.int64),
                      replica=np.array([g for _, g in pairs], dtype=np.int64))


def _build_tick_policy(name: str, train: Any, test: Any, horizon: int) -> Any:
    from balanceroute.core.policies import get_policy

    if name == "br0":
        return get_policy("br0")
    from balanceroute.catalogue import build_policy

    return build_policy("brh-survival", {"horizon": horizon}, train=train, test=test)


def _timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[int, Any]:
    """Nanoseconds ``fn(*args, **kwargs)`` took, and its result."""
    t0 = time.perf_counter_ns()
    out = fn(*args, **kwargs)
    return time.perf_counter_ns() - t0, out


def _percentile_us(ns: Sequence[int] | np.ndarray, q: float) -> float:
    return float(np.percentile(np.asarray(ns, dtype=np.float64), q) / 1e3) if len(ns) else float("nan")


def _tick_cell(policy: Any, cases: list[tuple[Any, Any]], repeats: int, budget_s: float,
               ) -> dict[str, Any]:
    """Time ``policy.assign`` on every case ``repeats`` times (rounds over all cases, so a
    burst of load from other processes hits one round, not one state), and the same policy
    deciding with the reference (its ``tick_fn``) once per case while ``budget_s`` lasts; check
    their decisions agree.

    ``p50_us``/``p99_us`` are percentiles over states of each state's median time (robust to
    preemption on a shared machine); ``p99_raw_us`` is over every single timing.
    """
    first_ns, _ = _timed(policy.assign, *cases[0])
    times = np.empty((repeats, len(cases)), dtype=np.int64)
    decisions = []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for rep in range(repeats):
            for j, (state, pool) in enumerate(cases):
                times[rep, j], out = _timed(policy.assign, state, pool)
                if rep == 0:
                    decisions.append(out)
        ref: list[int] = []
        same = True
        spent = 0.0
        reference = replace(policy, tick_fn=_reference_assign)  # the rest of the tick unchanged
        for (state, pool), out in zip(cases, decisions, strict=True):
            dt, want = _timed(reference.assign, state, pool)
            ref.append(dt)
            same = same and np.array_equal(want.pool_index, out.pool_index) \
                and np.array_equal(want.replica, out.replica)
            spent += dt / 1e9
            if spent > budget_s:
                break
    finally:
        if gc_was:
            gc.enable()
    per_state = np.median(times, axis=0)
    p50, p99 = _percentile_us(per_state, 50), _percentile_us(per_state, 99)
    r50, r99 = _percentile_us(ref, 50), _percentile_us(ref, 99)
    return {
        "states": len(cases), "timings": int(times.size),
        "placed_mean": float(np.mean([len(o) for o in decisions])),
        "placed_max": int(max(len(o) for o in decisions)),
        "p50_us": p50, "p99_us": p99, "max_us": float(per_state.max() / 1e3),
        "p99_raw_us": _percentile_us(times.ravel(), 99),
        "first_call_ms": first_ns / 1e6,
        "reference_ticks": len(ref), "reference_p50_us": r50, "reference_p99_us": r99,
        "speedup_p50": r50 / p50, "speedup_p99": r99 / p99, "same_decisions": bool(same),
    }


def bench_ticks(cfg: BenchConfig, *, log: Callable[[str], None] = lambda s: None,
                ) -> list[dict[str, Any]]:
    """One record per policy × G × pool size (see the module docstring)."""
    from balanceroute.core.predictors import split_workload
    from balanceroute.core.workloads import load_workload

    rng = np.random.default_rng(cfg.seed)
    records = []
    for g_count in cfg.replicas:
        # enough requests to fill G·B slots and keep the pool full past the warm-up
        need = int(g_count * cfg.slots * 1.6 + 40 * g_count * (cfg.warmup_steps + 3 * cfg.snapshots) / 1000) + 4000
        train, test = split_workload(load_workload(cfg.workload, requests=2 * need, seed=cfg.seed), 0.5)
        log(f"capturing {cfg.snapshots} saturated states at G={g_count} ...")
        states = capture_states(test, num_replicas=g_count, slots=cfg.slots, count=cfg.snapshots,
                                warmup_steps=cfg.warmup_steps)
        for name in cfg.policies:
            policy = _build_tick_policy(name, train, test, cfg.horizon)
            for size in cfg.pools:
                cases = [(state, _resized_pool(test, size, rng)) for state, _ in states]
                cell = _tick_cell(policy, cases, cfg.repeats, cfg.reference_budget_s)
                records.append({"kind": "tick", "policy": name if name == "br0" else f"brh(H={cfg.horizon})",
                                "replicas": g_count, "slots": cfg.slots, "pool": size,
                                "free_slots_mean": float(np.mean([s.free_slots.sum() for s, _ in cases])),
                                **cell})
                log(_tick_line(records[-1]))
    return records


# --------------------------------------------------------------------------- simulator


def bench_simulator(cfg: BenchConfig, *, log: Callable[[str], None] = lambda s: None,
                    ) -> list[dict[str, Any]]:
    """Replica-steps per second of the fused loop, the generic loop and the naive reference."""
    from balanceroute.core.policies import get_policy
    from balanceroute.core.simulator import SimConfig, simulate
    from balanceroute.core.workloads import load_workload

    from .reference import naive_simulate

    workload = load_workload(cfg.workload, requests=cfg.sim_requests, seed=cfg.seed)
    # no KV lease: the loops are timed as they are (a leased run may re-run in the generic loop)
    # and the naive reference does not model the lease's re-prefill
    config = SimConfig(num_replicas=cfg.sim_replicas, slots=cfg.slots, lease=None)
    g_count = cfg.sim_replicas
    records = []
    for name in cfg.sim_policies:
        row: dict[str, Any] = {"kind": "simulator", "policy": name, "requests": len(workload),
                               "replicas": g_count, "slots": cfg.slots}
        simulate(workload.take(np.arange(min(200, len(workload)))), get_policy(name), config)  # compile/load
        for engine in ("fused", "generic"):
            dt, res = _timed(simulate, workload, get_policy(name), config, engine=engine)
            row[f"{engine}_s"] = dt / 1e9
            row[f"{engine}_replica_steps_per_s"] = res.metrics["steps"] * g_count / (dt / 1e9)
            row["steps"] = int(res.metrics["steps"])
        dt, naive = _timed(naive_simulate, workload, get_policy(name), config,
                           time_limit_s=cfg.naive_budget_s)
        partial = bool(naive.get("partial", False))
        row["naive_steps"] = naive["steps"] if partial else int(naive["metrics"]["steps"])
        row["naive_partial"] = partial
        row["naive_s"] = naive["seconds"] if partial else dt / 1e9
        row["naive_replica_steps_per_s"] = row["naive_steps"] * g_count / row["naive_s"]
        for engine in ("fused", "generic"):
            row[f"{engine}_vs_naive"] = row[f"{engine}_replica_steps_per_s"] / row["naive_replica_steps_per_s"]
        records.append(row)
        log(_sim_line(row))
    return records


# -------------------------------------------------------------- child processes: compile, RSS

_COMPILE_CHILD = """
import json, time
t0 = time.perf_counter()
import numpy as np
from balanceroute.core.simulator import SimConfig, simulate
from balanceroute.core.two_stage import two_stage_assign
from balanceroute.core.policies import get_policy
from balanceroute.core.workloads.base import Workload
t1 = time.perf_counter()
two_stage_assign(np.zeros((2, 3)), np.array([1, 1]), np.array([5, 7, 9]), np.zeros(3),
                 d=np.ones(3), alpha=1.0, beta=2.0, s_greedy=0, r_max=4, deadline_s=30.0,
                 growth=np.zeros((3, 3)))
t2 = time.perf_counter()
w = Workload(name="tiny", prompt_len=np.array([5, 7, 9]), output_len=np.array([2, 1, 3]))
simulate(w, get_policy("br0"), SimConfig(num_replicas=2, slots=1))
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "tick_kernel_s": t2 - t1, "fused_loop_s": t3 - t2}))
"""

_MEMORY_CHILD = """
import json, resource, sys, time
import numpy as np
from balanceroute.core.policies import get_policy
from balanceroute.core.simulator import SimConfig, simulate
from balanceroute.core.workloads.base import Workload
path, name, policy, engine = sys.argv[1:5]
def peak_mib():  # VmHWM (resettable on Linux), else the process-lifetime ru_maxrss
    try:
        with open("/proc/self/status") as f:
            return int(f.read().split("VmHWM:")[1].split()[0]) / 1024
    except (OSError, IndexError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
tiny = Workload(name="tiny", prompt_len=np.array([5, 7]), output_len=np.array([2, 1]))
simulate(tiny, get_policy(policy), SimConfig(num_replicas=2, slots=1), engine=engine)
with np.load(path) as data:
    workload = Workload(name=name, prompt_len=data["prompt"], output_len=data["output"])
reset = reset_peak()
before = peak_mib()
t0 = time.perf_counter()
res = simulate(workload, get_policy(policy), SimConfig(num_replicas=16, slots=64), engine=engine)
dt = time.perf_counter() - t0
print(json.dumps({"workload": name, "requests": len(workload), "steps": res.metrics["steps"],
                  "seconds": dt, "rss_before_mib": before, "peak_rss_mib": peak_mib(),
                  "peak_reset": reset, "mean_output": float(workload.output_len.mean())}))
"""


def _child(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 900) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, timeout=timeout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"benchmark child failed: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_compile() -> dict[str, Any]:
    """First-call times in a child process with an empty numba cache (compilation), then in a
    second child reusing that cache (what every later process pays)."""
    with tempfile.TemporaryDirectory() as cache:
        cold = _child(_COMPILE_CHILD, env={"NUMBA_CACHE_DIR": cache})
        warm = _child(_COMPILE_CHILD, env={"NUMBA_CACHE_DIR": cache})
    return {"kind": "compile", **{f"cold_{k}": v for k, v in cold.items()},
            **{f"cached_{k}": v for k, v in warm.items()}}


def _short_outputs(n: int, seed: int = 0) -> Any:
    """Lognormal lengths with short outputs (mean ≈ 12 tokens): the shape of
    ``tests/factories.lognormal_workload(n, output_mu=2.0)``, so a huge run takes few steps."""
    from balanceroute.core.workloads.base import Workload

    rng = np.random.default_rng(seed)
    prompt = rng.lognormal(6.0, 1.0, n).astype(np.int64) + 1
    output = np.minimum(rng.lognormal(2.0, 1.0, n).astype(np.int64) + 1, 16_384)
    return Workload(name="lognormal-short", prompt_len=prompt, output_len=output)


def bench_memory(requests: int, *, policy: str = "br0", engine: str = "auto",
                 source: str = "servegen-r1", seed: int = 0) -> dict[str, Any]:
    """Peak RSS of one ``requests``-request saturated run (G = 16, B = 64) in a child process
    that loads the lengths from a file (generating them does not count). On Linux the peak is
    reset just before the run (``/proc/self/clear_refs``), so ``run_mib`` is what the run adds
    over the resident set it starts from (imports, compiled code, the lengths); elsewhere it is
    measured against the process's earlier peak. ``source`` is a workload name or ``"short"``
    (:func:`_short_outputs`)."""
    from balanceroute.core.workloads import load_workload

    workload = _short_outputs(requests, seed) if source == "short" else \
        load_workload(source, requests=requests, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lengths.npz")
        np.savez(path, prompt=workload.prompt_len.astype(np.int64),
                 output=workload.output_len.astype(np.int64))
        del workload
        out = _child(_MEMORY_CHILD, path, source, policy, engine)
    grown = out["peak_rss_mib"] - out["rss_before_mib"]
    return {"kind": "memory", "policy": policy, "engine": engine, **out,
            "run_mib": grown, "bytes_per_request": grown * 2**20 / requests}


# ------------------------------------------------------------------------------ report


def _tick_line(r: dict[str, Any]) -> str:
    return (f"{r['policy']:10s} G={r['replicas']:<4d} pool={r['pool']:<5d} "
            f"P50 {r['p50_us']:8.1f} us  P99 {r['p99_us']:8.1f} us  | reference P50 "
            f"{r['reference_p50_us']:10.1f} us (x{r['speedup_p50']:,.0f})")


def _sim_line(r: dict[str, Any]) -> str:
    return (f"{r['policy']:10s} fused {r['fused_replica_steps_per_s'] / 1e6:7.2f} M/s  generic "
            f"{r['generic_replica_steps_per_s'] / 1e6:6.2f} M/s  naive "
            f"{r['naive_replica_steps_per_s'] / 1e6:6.3f} M/s  (fused x{r['fused_vs_naive']:,.0f})")


def format_records(records: list[dict[str, Any]]) -> str:
    """The text tables ``balanceroute bench`` prints."""
    lines: list[str] = []
    ticks = [r for r in records if r["kind"] == "tick"]
    if ticks:
        lines.append("Tick latency (policy.assign; BR-H: forecast + projection included), "
                     f"saturated states, B = {ticks[0]['slots']}; P50/P99 over states of the "
                     "median of repeats")
        lines.append(f"{'policy':10s} {'G':>4s} {'pool':>5s} {'placed':>6s} {'P50 us':>9s} "
                     f"{'P99 us':>9s} {'ref P50 us':>11s} {'ref P99 us':>11s} {'x P50':>7s} "
                     f"{'x P99':>7s} {'same':>5s}")
        for r in ticks:
            lines.append(
                f"{r['policy']:10s} {r['replicas']:4d} {r['pool']:5d} {r['placed_mean']:6.1f} "
                f"{r['p50_us']:9.1f} {r['p99_us']:9.1f} {r['reference_p50_us']:11.0f} "
                f"{r['reference_p99_us']:11.0f} {r['speedup_p50']:7.0f} {r['speedup_p99']:7.0f} "
                f"{'yes' if r['same_decisions'] else 'NO':>5s}")
    sims = [r for r in records if r["kind"] == "simulator"]
    if sims:
        if lines:
            lines.append("")
        r0 = sims[0]
        lines.append(f"Simulator: saturated run, {r0['requests']:,} requests, G = {r0['replicas']}, "
                     f"B = {r0['slots']} (replica-steps per second)")
        lines.append(f"{'policy':10s} {'steps':>7s} {'fused':>10s} {'generic':>10s} {'naive':>10s} "
                     f"{'fused/naive':>12s} {'generic/naive':>14s}")
        for r in sims:
            lines.append(
                f"{r['policy']:10s} {r['steps']:7d} {r['fused_replica_steps_per_s']:10.3g} "
                f"{r['generic_replica_steps_per_s']:10.3g} {r['naive_replica_steps_per_s']:10.3g} "
                f"{r['fused_vs_naive']:12.0f} {r['generic_vs_naive']:14.1f}"
                + ("  (naive: loaded prefix)" if r["naive_partial"] else ""))
    for r in records:
        if r["kind"] == "compile":
            lines.append("")
            lines.append(f"numba: import {r['cold_import_s']:.2f} s; first tick {r['cold_tick_kernel_s']:.1f} s "
                         f"and fused loop {r['cold_fused_loop_s']:.1f} s to compile (cache empty), "
                         f"{r['cached_tick_kernel_s'] * 1e3:.0f} ms and "
                         f"{r['cached_fused_loop_s'] * 1e3:.0f} ms to load from the cache")
        if r["kind"] == "memory":
            lines.append("")
            lines.append(f"memory: {r['requests']:,}-request run ({r['workload']}, {r['policy']}, "
                         f"{r['engine']} engine), {r['steps']:,.0f} steps in {r['seconds']:.1f} s: "
                         f"peak RSS {r['peak_rss_mib']:.0f} MiB, of which the run "
                         f"{r['run_mib']:.0f} MiB ({r['bytes_per_request']:.0f} B/request)")
    return "\n".join(lines)


def run_bench(cfg: BenchConfig, *, ticks: bool = True, simulator: bool = True,
              compile_times: bool = True, log: Callable[[str], None] = lambda s: None,
              ) -> list[dict[str, Any]]:
    """Every measurement ``cfg`` asks for, as records (``kind`` = tick, simulator, compile,
    memory)."""
    records: list[dict[str, Any]] = []
    if compile_times:
        log("measuring numba compile times (child processes) ...")
        records.append(bench_compile())
    if ticks:
        records += bench_ticks(cfg, log=log)
    if simulator:
        records += bench_simulator(cfg, log=log)
    if cfg.memory_requests:
        log(f"measuring peak RSS of a {cfg.memory_requests:,}-request run (child process) ...")
        records.append(bench_memory(cfg.memory_requests))
    return records



# --------------------------------------------------------------------------------- CLI


def add_bench_args(parser: Any) -> None:
    """The options of ``balanceroute bench``."""
    parser.add_argument("--quick", action="store_true",
                        help="about a minute: G in {8, 64}, pools {256, 2048}, a 4,000-request "
                             "simulator run, a capped naive reference")
    parser.add_argument("--json", action="store_true",
                        help="print JSON records instead of tables: one per policy x G x pool "
                             "size (kind=tick, with p50_us/p99_us), plus kind=simulator/compile/memory")
    parser.add_argument("--replicas", "-G", help="comma-separated G values (default: 8,16,64,256)")
    parser.add_argument("--pools", help="comma-separated pool sizes (default: 64,256,2048)")
    parser.add_argument("--policies", help="tick policies among br0,brh (default: both)")
    parser.add_argument("--horizon", type=int, help="BR-H's H (default: 80, the paper's)")
    parser.add_argument("--workload", help="workload the states and requests come from "
                                           "(default: servegen-r1)")
    parser.add_argument("--sim-requests", type=int,
                        help="requests of the timed simulator run (default: 20000)")
    parser.add_argument("--memory", type=int, default=0, metavar="N",
                        help="also measure the peak RSS of an N-request run in a child process")
    parser.add_argument("--no-ticks", action="store_true", help="skip the tick latency table")
    parser.add_argument("--no-sim", action="store_true", help="skip the simulator speed table")
    parser.add_argument("--no-compile", action="store_true", help="skip the compile-time probe")


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--{name} must be comma-separated integers, got {text!r}") from None


def config_from_args(args: Any) -> BenchConfig:
    """The :class:`BenchConfig` ``balanceroute bench`` arguments describe."""
    changes: dict[str, Any] = {}
    if args.replicas:
        changes["replicas"] = _ints(args.replicas, "replicas")
    if args.pools:
        changes["pools"] = _ints(args.pools, "pools")
    if args.policies:
        changes["policies"] = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    if args.horizon is not None:
        changes["horizon"] = args.horizon
    if args.workload:
        changes["workload"] = args.workload
    if args.sim_requests is not None:
        if args.sim_requests < 1:
            raise ValueError(f"--sim-requests must be >= 1, got {args.sim_requests}")
        changes["sim_requests"] = args.sim_requests
    if args.memory:
        changes["memory_requests"] = args.memory
    return replace(QUICK if args.quick else BenchConfig(), **changes)


def run_bench_command(args: Any) -> int:
    """``balanceroute bench``: measure, then print the tables (or JSON records)."""
    cfg = config_from_args(args)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    records = run_bench(cfg, ticks=not args.no_ticks, simulator=not args.no_sim,
                        compile_times=not args.no_compile, log=log)
    if args.json:
        print(json.dumps(records, indent=2))
    else:
        print(format_records(records))
    return 0
