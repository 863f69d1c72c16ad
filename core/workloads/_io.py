"""Shared reading helpers for the trace loaders: files (plain or gzipped), bundled data, CSV rows
and JSON lines with file/line/field error reporting, and length and time column checks."""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
import zlib
from collections.abc import Iterator, Sequence
from importlib import resources
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .base import WorkloadError

try:
    from importlib.resources.abc import Traversable
except ImportError:  # Python 3.10
    from importlib.abc import Traversable

__all__ = [
    "TracePath",
    "bundled_file",
    "check_lengths",
    "check_nondecreasing",
    "column",
    "display",
    "float_column",
    "int_column",
    "iter_json_lines",
    "parse_float",
    "parse_int",
    "read_csv",
    "read_text",
    "stem",
]

TracePath = str | os.PathLike | Traversable
"""A trace file: a path, or a ``Traversable`` such as a bundled resource."""

_GZIP_MAGIC = b"\x1f\x8b"
DATA_PACKAGE = "balanceroute.data"


def display(path: TracePath) -> str:
    """The name of ``path`` as used in error messages."""
    return os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)


def stem(path: TracePath) -> str:
    """The file name of ``path`` without directories and extensions (a default workload name)."""
    return display(path).replace("\\", "/").rsplit("/", 1)[-1].split(".")[0]


def _as_traversable(path: TracePath) -> Traversable:
    if isinstance(path, (str, os.PathLike)):
        from pathlib import Path

        return Path(path)
    return path


def bundled_file(*parts: str) -> Traversable:
    """The bundled file ``parts`` under ``balanceroute.data``, or its ``.gz`` variant."""
    try:
        root = resources.files(DATA_PACKAGE)
    except ModuleNotFoundError as exc:
        raise WorkloadError(f"bundled data package {DATA_PACKAGE} is not installed") from exc
    node = root.joinpath(*parts)
    if node.is_file():
        return node
    gz = root.joinpath(*parts[:-1], parts[-1] + ".gz")
    if gz.is_file():
        return gz
    raise WorkloadError(f"bundled file {'/'.join(parts)} is missing from {DATA_PACKAGE}")


def read_text(path: TracePath) -> str:
    """The text of ``path`` (UTF-8, optional BOM), gunzipped if it is gzip data."""
    name = display(path)
    node = _as_traversable(path)
    try:
        raw = node.read_bytes()
    except FileNotFoundError:
        raise WorkloadError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise WorkloadError(f"{name}: is a directory, expected a trace file") from None
    except OSError as exc:
        raise WorkloadError(f"{name}: cannot read: {exc.strerror or exc}") from None
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise WorkloadError(f"{name}: corrupt gzip data ({exc})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise WorkloadError(f"{name}:{line}: not UTF-8 text") from None
    if not text.strip():
        raise WorkloadError(f"{name}: empty file")
    return text


def read_csv(
    path: TracePath, *, header: bool = True
) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header fields (``[]`` if ``header`` is false) and ``(line number, fields)`` rows.

    Blank lines are skipped; a row whose field count differs from the first row's is an error.
    """
    name = display(path)
    reader = csv.reader(io.StringIO(read_text(path), newline=""))
    rows: list[tuple[int, list[str]]] = []
    width = -1
    try:
        for fields in reader:
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue
            fields = [f.strip() for f in fields]
            if width < 0:
                width = len(fields)
            elif len(fields) != width:
                raise WorkloadError(
                    f"{name}:{reader.line_num}: {len(fields)} fields, expected {width}"
                )
            rows.append((reader.line_num, fields))
    except csv.Error as exc:
        raise WorkloadError(f"{name}:{reader.line_num}: malformed CSV ({exc})") from None
    head: list[str] = []
    if header:
        head = rows.pop(0)[1]
    if not rows:
        raise WorkloadError(f"{name}: no data rows")
    return head, rows


def column(
    header: Sequence[str], names: Sequence[str], path: TracePath, *, required: bool = True
) -> int | None:
    """Index of the first of ``names`` present in ``header`` (``None`` if absent and optional)."""
    lowered = [h.lower() for h in header]
    for n in names:
        if n.lower() in lowered:
            return lowered.index(n.lower())
    if required:
        raise WorkloadError(
            f"{display(path)}:1: missing column {' or '.join(names)} (header: {','.join(header)})"
        )
    return None


def iter_json_lines(path: TracePath) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line of a JSON-lines file."""
    name = display(path)
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{name}:{lineno}: invalid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise WorkloadError(f"{name}:{lineno}: expected a JSON object")
        yield lineno, obj


def parse_int(value: Any, where: str, field: str) -> int:
    """``value`` (text or JSON number) as an int; integral floats such as ``12.0`` are accepted."""
    if isinstance(value, bool):
        raise WorkloadError(f"{where}: field {field}: {value!r} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number != int(number):
        raise WorkloadError(f"{where}: field {field}: {value!r} is not an integer")
    return int(number)


def parse_float(value: Any, where: str, field: str) -> float:
    """``value`` (text or JSON number) as a finite float."""
    if isinstance(value, bool):
        raise WorkloadError(f"{where}: field {field}: {value!r} is not a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise WorkloadError(f"{where}: field {field}: {value!r} is not a finite number")
    return number


def int_column(rows: Sequence[tuple[int, Sequence[Any]]], index: int, path: TracePath,
               field: str) -> NDArray[np.int64]:
    """Field ``index`` of every ``(line, fields)`` row parsed as integers."""
    name = display(path)
    return np.array([parse_int(f[index], f"{name}:{ln}", field) for ln, f in rows],
                    dtype=np.int64)


def float_column(rows: Sequence[tuple[int, Sequence[Any]]], index: int, path: TracePath,
                 field: str) -> NDArray[np.float64]:
    """Field ``index`` of every ``(line, fields)`` row parsed as finite floats."""
    name = display(path)
    return np.array([parse_float(f[index], f"{name}:{ln}", field) for ln, f in rows],
                    dtype=np.float64)


def check_lengths(values: NDArray[np.int64], lines: Sequence[int], path: TracePath,
                  field: str) -> None:
    """Raise naming the first line whose length ``field`` is below 1."""
    bad = np.flatnonzero(values < 1)
    if bad.size:
        i = int(bad[0])
        raise WorkloadError(
            f"{display(path)}:{lines[i]}: field {field}: {int(values[i])} is not a positive length"
        )


def check_nondecreasing(times: NDArray[np.float64], lines: Sequence[int], path: TracePath,
                        field: str) -> None:
    """Raise naming the first line whose time ``field`` is earlier than the row before it."""
    bad = np.flatnonzero(np.diff(times) < 0)
    if bad.size:
        i = int(bad[0]) + 1
        raise WorkloadError(
            f"{display(path)}:{lines[i]}: field {field}: time goes backwards "
            f"({times[i]:g} after {times[i - 1]:g}); rows must be in arrival order"
        )
