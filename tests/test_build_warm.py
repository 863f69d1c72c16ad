"""A regular build ships the numba kernels compiled (setup.py): the wheel's package, unpacked
somewhere else, loads every kernel from the cache it carries and compiles none; an edit of a
kernel's source makes that cache stale instead of running the old code; a build with
``BALANCEROUTE_BUILD_WARM=0`` carries no cache (and the same check then fails).

One wheel is built here with the suite's own interpreter (``--no-build-isolation``: no download),
which compiles the kernels once (about 30 CPU-seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from balanceroute.core._jit import HAVE_NUMBA
from tests.factories import built_package

_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from balanceroute import warm
from balanceroute.core import _kernels, _tick_kernels
cached = warm.kernels_cached()
out = {"file": _tick_kernels.__file__, "cached": cached}
if cached:
    warm.warm_kernels()
    kernels = (_tick_kernels.two_stage_tick, _kernels.simulate_loop)
    out["hits"] = sum(sum(k.stats.cache_hits.values()) for k in kernels)
    out["misses"] = sum(sum(k.stats.cache_misses.values()) for k in kernels)
print(json.dumps(out))
"""


def _child(site: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(site)], env=env, cwd=site, timeout=600,
                          capture_output=True, text=True, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(site)), out  # the unpacked copy ran, not the source tree
    return out


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed")
def test_a_built_wheel_loads_its_kernels_and_compiles_none(tmp_path) -> None:
    site = built_package(tmp_path, "site", warm=True)
    assert any((site / "balanceroute" / "core" / "__pycache__").glob("_tick_kernels.two_stage_tick-*.nbi"))
    out = _child(site)
    assert out["cached"] is True and out["hits"] >= 2 and out["misses"] == 0, out
    # the cache is keyed by the text of the source: an edited kernel file is not run from it
    tick = site / "balanceroute" / "core" / "_tick_kernels.py"
    tick.write_text(tick.read_text() + "\n# edited after the build\n")
    assert _child(site)["cached"] is False


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed")
def test_a_wheel_built_without_warming_carries_no_kernels(tmp_path) -> None:
    site = built_package(tmp_path, "bare", warm=False)
    assert not list(site.rglob("*.nbi"))
    assert _child(site)["cached"] is False
