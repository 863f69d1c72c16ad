"""The tick kernels' home: a policy imports nothing of the engine that applies it, and the
fused loop's cache entry goes stale with an edit of the tick it links in."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from balanceroute.core import _jit, _kernels, _tick_kernels

needs_numba = pytest.mark.skipif(not _jit.HAVE_NUMBA, reason="numba is not installed")


def test_policies_import_nothing_of_the_engine():
    """The policies, the two-stage tick and the compiled-tick contract load without the
    simulator, its fused loop or the loop's kernels."""
    code = ("import sys\n"
            "import balanceroute.core.policies, balanceroute.core.tick_contract\n"
            "engine = ('simulator', 'fused', '_kernels', 'replica_engine')\n"
            "print(sorted(m for m in sys.modules\n"
            "             if m.rsplit('.', 1)[-1] in engine and m.startswith('balanceroute')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


@needs_numba
def test_fused_loop_cache_is_stamped_with_the_tick_source():
    """An edit of the tick file changes the loop's cache stamp (numba stamps a function with
    its own file only, and the loop carries a compiled copy of the tick)."""
    with open(_tick_kernels.__file__, "rb") as f:
        tick = hashlib.sha256(f.read()).digest()
    loop_stamp = _kernels.simulate_loop._cache._cache_file._source_stamp
    assert isinstance(loop_stamp, tuple) and loop_stamp[-1] == tick
    assert _tick_kernels.two_stage_tick._cache._cache_file._source_stamp != loop_stamp


@needs_numba
def test_stamp_follows_the_linked_file(tmp_path):
    """``stamp_cache_with`` keys the entry by the other file's text: a changed text, a new
    stamp; the same text, the same stamp."""
    callee = tmp_path / "callee.py"

    def stamp() -> object:
        fn = _jit.njit(stamp_with=(str(callee),))(lambda x: x + 1)
        return fn._cache._cache_file._source_stamp

    callee.write_text("a = 1\n")
    first = stamp()
    assert stamp() == first
    callee.write_text("a = 2\n")
    assert stamp() != first
