"""Seeded instance factories shared by tests and benchmarks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

from balanceroute.core.state import ClusterState, PoolView, validate_assignment
from balanceroute.core.workloads.base import Workload


def random_tick(
    rng: np.random.Generator, *, replicas: int, pool: int, slots: int = 8, max_prompt: int = 4000
) -> tuple[ClusterState, PoolView]:
    """A mid-run looking tick: random loads and occupancy, a pool of random prompts."""
    active = rng.integers(0, slots + 1, size=replicas)
    loads = (active * rng.integers(200, 3000, size=replicas)).astype(np.int64)
    state = ClusterState(
        loads=loads, free_slots=(slots - active).astype(np.int64), num_active=active.astype(np.int64)
    )
    view = PoolView(
        prompt_len=rng.integers(1, max_prompt, size=pool).astype(np.int64),
        wait=rng.uniform(0.0, 5.0, size=pool),
        request_ids=np.arange(pool, dtype=np.int64),
    )
    return state, view


def lognormal_workload(
    n: int, *, seed: int = 0, prompt_mu: float = 6.0, output_mu: float = 6.5, rate: float | None = None
) -> Workload:
    """Heavy-tailed synthetic requests (lognormal lengths), optionally Poisson arrivals."""
    rng = np.random.default_rng(seed)
    prompt = rng.lognormal(prompt_mu, 1.0, n).astype(np.int64) + 1
    output = np.minimum(rng.lognormal(output_mu, 1.0, n).astype(np.int64) + 1, 16_384)
    arrival = np.cumsum(rng.exponential(1.0 / rate, n)) if rate else None
    return Workload(name=f"lognormal-{seed}", prompt_len=prompt, output_len=output, arrival_s=arrival)


def ledger_tick(ledger, policy, now: float) -> list:
    """One scheduling tick of a proxy ``Ledger`` as the dispatcher runs it: ``policy.assign`` on
    ``ledger.build_tick(now)``, applied; the tickets placed."""
    inputs = ledger.build_tick(now)
    if inputs is None:
        return []
    state, view = inputs
    decision = policy.assign(state, view)
    validate_assignment(state, view, decision)  # the dispatcher checks it before the ledger applies it
    return ledger.apply(state, view, decision)


ROOT = Path(__file__).resolve().parents[1]
#: What a build of the package reads (pyproject.toml's package-dir roots and their metadata).
PACKAGE_SOURCES = ("pyproject.toml", "setup.py", "README.md", "balanceroute", "core", "solvers",
                   "serving", "analysis")


def built_package(tmp: Path, name: str, *, warm: bool) -> Path:
    """The package as ``pip install .`` ships it: its wheel built (with this interpreter's
    numba and setuptools, no download) from a copy of the sources, unpacked into ``tmp/name``;
    ``warm``: with the numba kernels compiled into it (setup.py), else
    ``BALANCEROUTE_BUILD_WARM=0``."""
    src = tmp / f"{name}-src"
    for part in PACKAGE_SOURCES:
        path = ROOT / part
        if path.is_dir():
            shutil.copytree(path, src / part, ignore=shutil.ignore_patterns(
                "__pycache__", "*.so", "*.egg-info"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / part)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["BALANCEROUTE_BUILD_WARM"] = "1" if warm else "0"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp / f"{name}-dist"), str(src)], env=env, check=True, timeout=900,
                   capture_output=True)
    (wheel,) = (tmp / f"{name}-dist").glob("balanceroute-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp / name)
    return tmp / name
