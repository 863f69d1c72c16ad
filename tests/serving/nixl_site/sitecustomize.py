"""Stop NIXL's UCX progress thread from spinning a core, in the vLLM servers of the real-PD tests.

NIXL 1.5.1's Python agent hard-codes ``nixlAgentConfig.pthrDelay = 0``; the UCX backend's
progress thread passes ``ceil(pthrDelay µs → ms)`` as its ``poll()`` timeout, so it polls with a
0 ms timeout forever: one core per agent even when idle (measured here: 1.00 core for one idle
agent; the real-PD module runs four, on 2 cores, and saw load 55 and decode done-notices minutes
late). With the delay at ``NIXL_PTHR_DELAY_US`` (10 ms by default) the thread sleeps in
``poll()`` until UCX's event fd wakes it, or the delay passes (NIXL keeps the timeout for UCX
wake-ups that poll() misses): 0.01 core idle, and a 4 MiB read between two processes still
completes in about 17 ms (``nixl_probe.py``).

Python imports ``sitecustomize`` at start-up from ``sys.path``; the tests put this directory on
the servers' ``PYTHONPATH`` (inherited by vLLM's engine and worker processes). The patch
replaces the bindings' ``nixlAgentConfig`` with a subclass whose ``pthrDelay`` is never below
the delay: nothing else in NIXL or vLLM changes. docs/real-pd.md gives the same recipe for a
CPU box of one's own.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from types import ModuleType

DELAY_US = int(os.environ.get("NIXL_PTHR_DELAY_US", "10000"))


def _patch(bindings: ModuleType) -> None:
    base = bindings.nixlAgentConfig

    class AgentConfig(base):  # type: ignore[misc, valid-type]
        @property
        def pthrDelay(self) -> int:  # noqa: N802 - NIXL's name
            return base.pthrDelay.__get__(self)

        @pthrDelay.setter
        def pthrDelay(self, us: int) -> None:  # noqa: N802
            base.pthrDelay.__set__(self, max(int(us), DELAY_US))

    bindings.nixlAgentConfig = AgentConfig


class _PatchNixlBindings(importlib.abc.MetaPathFinder):
    """Patches ``nixl*._bindings`` (``nixl_cu12``, ``nixl_cu13``, …) right after it loads."""

    def find_spec(self, name: str, path, target=None):  # noqa: ANN001, ANN201 - importlib's protocol
        if not (name.startswith("nixl") and name.endswith("._bindings")):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is None:
                continue
            exec_module = spec.loader.exec_module

            def exec_and_patch(module: ModuleType, exec_module=exec_module) -> None:  # noqa: ANN001
                exec_module(module)
                _patch(module)

            spec.loader.exec_module = exec_and_patch
            return spec
        return None


sys.meta_path.insert(0, _PatchNixlBindings())
