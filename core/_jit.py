"""numba, when it is importable: ``njit`` compiles, and ``HAVE_NUMBA`` says whether it does.

numba is a core dependency, but the package still imports and runs without it: ``njit`` then
returns the function unchanged, and callers that would be slow as plain Python (the two-stage
tick, the fused simulation loop) check ``HAVE_NUMBA`` and take their numpy path instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["HAVE_NUMBA", "njit"]

F = TypeVar("F", bound=Callable[..., Any])

try:
    from numba import njit as _numba_njit
except ImportError:  # pragma: no cover - exercised only where numba is absent
    HAVE_NUMBA = False

    def njit(*args: Any, stamp_with: tuple[str, ...] = (), **kwargs: Any) -> Any:
        """No numba: the decorated function stays plain Python."""
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return lambda fn: fn

else:
    from numba.core import types as _types

    HAVE_NUMBA = True

    def njit(*args: Any, stamp_with: tuple[str, ...] = (), **kwargs: Any) -> Any:
        """``numba.njit`` with an on-disk cache (no fastmath: results must equal the references
        bit for bit, so floating-point operations keep their written order); a public kernel
        (no leading underscore) is compiled once per argument *types*
        (:func:`one_version_per_type`), a private helper per constant too, as numba does.

        ``stamp_with``: further source files whose compiled code the function links in (its
        callees in other modules); its cache entry is valid only for today's text of those files
        as well as its own (:func:`stamp_cache_with`)."""
        kwargs.setdefault("cache", True)
        if len(args) == 1 and callable(args[0]):
            return _versions(_numba_njit(**kwargs)(args[0]), stamp_with)
        decorate = _numba_njit(*args, **kwargs)
        return lambda fn: _versions(decorate(fn), stamp_with)

    def _versions(dispatcher: Any, stamp_with: tuple[str, ...] = ()) -> Any:
        if stamp_with:
            stamp_cache_with(dispatcher, stamp_with)
        private = dispatcher.py_func.__name__.startswith("_")
        return dispatcher if private else one_version_per_type(dispatcher)

    def stamp_cache_with(dispatcher: Any, paths: tuple[str, ...]) -> None:
        """Key ``dispatcher``'s on-disk cache by the text of ``paths`` as well as its own file.

        numba stamps a cache entry with the defining file alone (a hash of its text), yet a
        compiled caller carries a copy of every compiled callee it calls: the fused loop holds
        the tick kernels, which live in another file. Stamped with both, an edit of the tick
        makes the cached loop stale (numba then compiles it again) instead of leaving it running
        the old tick. Without numba's cache object (``cache=False``) this does nothing.
        """
        cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
        if cache_file is None or not hasattr(cache_file, "_source_stamp"):
            return
        texts = []
        for path in paths:
            with open(path, "rb") as f:
                texts.append(hashlib.sha256(f.read()).digest())
        cache_file._source_stamp = (cache_file._source_stamp, *texts)

    def one_version_per_type(dispatcher: Any) -> Any:
        """Make compiled callers of ``dispatcher`` pass their constant arguments by type.

        numba compiles a callee once per *value* of every constant a compiled caller passes it
        (``Literal[bool](False)`` next to ``bool``), with that version's callees again: the
        fused simulation loop, calling the tick kernel with constant flags, compiled a second
        copy of the whole tick. Typed by ``unliteral`` argument types, a kernel is compiled
        once per type signature and the fused loop links the tick the policy calls (the same
        code, deciding the same way). Private helpers keep numba's constant specialisation
        (their constant flags fold away, which the tick's latency relies on). On an empty
        cache the fused loop's compile halved and the whole took 0.82x the CPU (34 against
        42 CPU-seconds, quiet machine), tick and simulator speed unchanged in alternating runs
        (`benchmarks/README.md`).
        """
        typed = dispatcher.get_call_template

        def get_call_template(args: Any, kws: Any) -> Any:
            return typed(tuple(_types.unliteral(a) for a in args),
                         {k: _types.unliteral(v) for k, v in kws.items()})

        dispatcher.get_call_template = get_call_template
        return dispatcher
