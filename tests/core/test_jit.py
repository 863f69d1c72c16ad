"""``core._jit.njit``: a public kernel is compiled once per argument types, whatever constants its
compiled callers pass; a private helper keeps numba's per-constant versions."""

from __future__ import annotations

import pytest

from balanceroute.core._jit import HAVE_NUMBA, njit

pytestmark = pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed")


def test_a_constant_argument_compiles_no_version_of_its_own() -> None:
    @njit(cache=False)
    def scaled(x, k, flag):
        return x * k if flag else x

    @njit(cache=False)
    def callers(x, k, flag):
        # constants (-1, 2, True, False) next to variables of the same types
        return scaled(x, -1, True) + scaled(x, 2, False) + scaled(x, k, flag)

    assert callers(3.0, 4, True) == -3.0 + 3.0 + 12.0
    assert len(scaled.signatures) == 1, scaled.signatures  # numba alone makes three
    assert "Literal" not in str(scaled.signatures[0])


def test_a_function_called_from_python_still_compiles_per_type() -> None:
    @njit(cache=False)
    def twice(x):
        return 2 * x

    assert twice(2) == 4 and twice(2.5) == 5.0
    assert len(twice.signatures) == 2


def test_a_private_helper_keeps_its_constant_versions() -> None:
    @njit(cache=False)
    def _scaled(x, flag):
        return -x if flag else x

    @njit(cache=False)
    def caller(x, flag):
        return _scaled(x, True) + _scaled(x, flag)

    assert caller(2.0, False) == 0.0
    assert len(_scaled.signatures) == 2  # Literal[bool](True) and bool, as numba compiles them
