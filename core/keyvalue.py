"""``KEY=VALUE`` settings (a step model, sanity limits), parsed once with one-line errors."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

__all__ = ["parse_key_values"]

T = TypeVar("T")


def parse_key_values(items: Iterable[str], valid: Sequence[str], cast: Callable[[str], T], *,
                     what: str, expected: str, kind: str) -> dict[str, T]:
    """``{key: cast(value)}`` from ``"key=value"`` items, each key one of ``valid`` and given at
    most once. ``ValueError`` messages start with ``what`` (e.g. ``"--limit"``); ``expected``
    describes a good item, ``kind`` a good value ("an integer")."""
    values: dict[str, T] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or key not in valid:
            raise ValueError(f"{what} {item!r}: expected {expected}")
        if key in values:
            raise ValueError(f"{what} {key} given twice")
        try:
            values[key] = cast(raw)
        except ValueError:
            raise ValueError(f"{what} {item!r}: {raw.strip()!r} is not {kind}") from None
    return values
