"""The numba kernels, compiled once and kept in numba's on-disk cache.

The first run on an empty cache compiles the tick and the fused simulation loop (tens of
seconds); every later process loads them from the cache in well under a second. Build the
cache ahead of time, right after installing::

    python -m balanceroute.warm        # compiles, or says the cache is already warm

Commands that run the kernels call :func:`announce` first, so a cold cache shows as one
line ("compiling the numba kernels once ...") rather than as a silent minute; ``reproduce``
warms the cache in its own process before it starts its workers, so they load the kernels
instead of each compiling them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

__all__ = ["announce", "kernels_cached", "warm_kernels"]


def _entry_points() -> list:
    from balanceroute.core import _kernels, _tick_kernels

    return [_tick_kernels.two_stage_tick, _kernels.simulate_loop]


def kernels_cached() -> bool | None:
    """Whether numba's cache holds a compiled version of each kernel entry point for today's
    source (``None``: numba absent, or its cache cannot be read)."""
    from balanceroute.core._jit import HAVE_NUMBA

    if not HAVE_NUMBA:
        return None
    try:  # numba's cache index: {} when missing or written for another version of the source
        return all(bool(d._cache._cache_file._load_index()) for d in _entry_points())
    except Exception:  # noqa: BLE001 - a private numba API: unknown rather than wrong
        return None


def warm_kernels() -> dict[str, float]:
    """Run BR-0 (tick + fused loop) and BR-H (tick with growth, projection) on a tiny
    workload, which compiles every kernel the simulator and the proxy call, or loads it from
    the cache; returns the seconds each took."""
    import numpy as np

    from balanceroute.core.policies import get_policy
    from balanceroute.core.simulator import SimConfig, simulate
    from balanceroute.core.workloads.base import Workload

    tiny = Workload(name="warm", prompt_len=np.array([5, 7, 9, 11]),
                    output_len=np.array([2, 1, 3, 2]))
    config = SimConfig(num_replicas=2, slots=1)
    seconds: dict[str, float] = {}
    for name in ("br0", "brh"):
        t0 = time.perf_counter()
        simulate(tiny, get_policy(name), config)
        seconds[name] = time.perf_counter() - t0
    return seconds


def announce(write: Callable[[str], None] | None = None) -> bool:
    """One line through ``write`` (default: stderr) when the kernels are not cached yet;
    returns whether they were not (so the caller can warm them first)."""
    if kernels_cached() is not False:
        return False
    (write or (lambda text: print(text, file=sys.stderr, flush=True)))(
        "compiling the numba kernels once (about a minute on a laptop; later runs load them "
        "from numba's cache; `python -m balanceroute.warm` does it ahead of time)")
    return True


def main() -> int:
    """``python -m balanceroute.warm``: compile the kernels into numba's cache."""
    cold = kernels_cached() is False
    seconds = warm_kernels()
    state = "compiled" if cold else "loaded from the cache (already warm)"
    print(f"numba kernels {state}: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
