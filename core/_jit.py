"""numba, when it is importable: ``njit`` compiles, and ``HAVE_NUMBA`` says whether it does.

numba is a core dependency, but the package still imports and runs without it: ``njit`` then
returns the function unchanged, and callers that would be slow as plain Python (the two-stage
tick, the fused simulation loop) check ``HAVE_NUMBA`` and take their numpy path instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["HAVE_NUMBA", "njit"]

F = TypeVar("F", bound=Callable[..., Any])

try:
    from numba import njit as _numba_njit
except ImportError:  # pragma: no cover - exercised only where numba is absent
    HAVE_NUMBA = False

    def njit(*args: Any, **kwargs: Any) -> Any:
        """No numba: the decorated function stays plain Python."""
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return lambda fn: fn

else:
    HAVE_NUMBA = True

    def njit(*args: Any, **kwargs: Any) -> Any:
        """``numba.njit`` with an on-disk cache (no fastmath: results must equal the references
        bit for bit, so floating-point operations keep their written order)."""
        kwargs.setdefault("cache", True)
        return _numba_njit(*args, **kwargs)
