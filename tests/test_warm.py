"""``balanceroute.warm``: a cold numba cache is seen and announced (in a fresh interpreter with an
empty ``NUMBA_CACHE_DIR``; nothing is compiled here)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from balanceroute.core._jit import HAVE_NUMBA

_CHILD = """
from balanceroute.warm import announce, kernels_cached
lines = []
print(kernels_cached(), announce(lines.append), lines)
"""


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed")
def test_an_empty_cache_is_announced(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}, timeout=120,
                         check=True).stdout
    assert out.startswith("False True ") and "compiling the numba kernels once" in out, out
