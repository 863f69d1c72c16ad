"""Shared reading helpers for the trace loaders: files (plain or gzipped), bundled data, CSV rows
and JSON records with file/line/field error reporting, and length and time column checks.

Every error is a :class:`WorkloadError` whose message starts with ``<file>:<line>:`` (or
``<file>: item <i>:`` inside a JSON list) and names the field.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
import zlib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .base import WorkloadError

try:
    from importlib.resources.abc import Traversable
except ImportError:  # Python 3.10
    from importlib.abc import Traversable

__all__ = [
    "Record",
    "TracePath",
    "bundled_dir",
    "bundled_file",
    "check_lengths",
    "check_nondecreasing",
    "column",
    "display",
    "find_file",
    "float_column",
    "node",
    "int_column",
    "parse_float",
    "parse_int",
    "read_csv",
    "read_json_records",
    "read_text",
    "stem",
]

TracePath = str | os.PathLike | Traversable
"""A trace file: a path, or a ``Traversable`` such as a bundled resource."""

Record = tuple[str, Any]
"""A parsed row: its location label (``"file:line"``) and its fields (a list or a dict)."""

DATA_PACKAGE = "balanceroute.data"
"""The package holding the bundled traces."""

_GZIP_MAGIC = b"\x1f\x8b"


def display(path: TracePath) -> str:
    """The name of ``path`` as used in error messages."""
    return os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)


def stem(path: TracePath) -> str:
    """The file name of ``path`` without directories and extensions (a default workload name)."""
    return display(path).replace("\\", "/").rsplit("/", 1)[-1].split(".")[0]


def node(path: TracePath) -> Traversable:
    """``path`` as a ``Traversable`` (a ``pathlib.Path`` for plain paths)."""
    return Path(path) if isinstance(path, (str, os.PathLike)) else path


def bundled_dir(name: str) -> Traversable:
    """The bundled data folder ``name`` under ``balanceroute.data``."""
    try:
        folder = resources.files(DATA_PACKAGE).joinpath(name)
    except ModuleNotFoundError as exc:
        raise WorkloadError(f"bundled data package {DATA_PACKAGE} is not installed") from exc
    if not folder.is_dir():
        raise WorkloadError(f"bundled folder {name} is missing from {DATA_PACKAGE}")
    return folder


def find_file(folder: Traversable, name: str) -> Traversable:
    """The file ``name`` in ``folder``, or its ``.gz`` variant."""
    for candidate in (name, name + ".gz"):
        child = folder.joinpath(candidate)
        if child.is_file():
            return child
    raise WorkloadError(f"{display(folder)}: no file {name} (or {name}.gz)")


def bundled_file(folder: str, name: str) -> Traversable:
    """The bundled file ``folder/name`` under ``balanceroute.data``, or its ``.gz`` variant."""
    return find_file(bundled_dir(folder), name)


def read_text(path: TracePath) -> str:
    """The text of ``path`` (UTF-8, optional BOM), gunzipped if it is gzip data."""
    name = display(path)
    try:
        raw = node(path).read_bytes()
    except FileNotFoundError:
        raise WorkloadError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise WorkloadError(f"{name}: is a directory, expected a trace file") from None
    except OSError as exc:
        raise WorkloadError(f"{name}: cannot read ({exc.strerror or exc})") from None
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
    path: TracePath, *, header: bool = True, text: str | None = None
) -> tuple[list[str], list[Record]]:
    """The header fields (``[]`` if ``header`` is false) and the data rows as records.

    Blank lines are skipped; a row whose field count differs from the first row's is an error.
    ``text`` is the file's content if the caller has already read it.
    """
    name = display(path)
    reader = csv.reader(io.StringIO(read_text(path) if text is None else text, newline=""))
    rows: list[Record] = []
    width = -1
    try:
        for fields in reader:
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue
            where = f"{name}:{reader.line_num}"
            if width < 0:
                width = len(fields)
            elif len(fields) != width:
                raise WorkloadError(f"{where}: {len(fields)} fields, expected {width}")
            rows.append((where, [f.strip() for f in fields]))
    except csv.Error as exc:
        raise WorkloadError(f"{name}:{reader.line_num}: malformed CSV ({exc})") from None
    head = rows.pop(0)[1] if header and rows else []
    if not rows:
        raise WorkloadError(f"{name}: no data rows")
    return head, rows


def read_json_records(path: TracePath, *, text: str | None = None) -> list[Record]:
    """The objects of a JSON file holding a list of objects, or of a JSON-lines file."""
    name = display(path)
    text = read_text(path) if text is None else text
    records: list[Record] = []
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{name}:{exc.lineno}: invalid JSON ({exc.msg})") from None
        records = [(f"{name}: item {i}", obj) for i, obj in enumerate(items)]
    else:
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append((f"{name}:{lineno}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{name}:{lineno}: invalid JSON ({exc.msg})") from None
    for where, obj in records:
        if not isinstance(obj, dict):
            raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if not records:
        raise WorkloadError(f"{name}: no records")
    return records


def column(
    header: Sequence[str], names: Sequence[str], path: TracePath, *, required: bool = True
) -> int | None:
    """Index of the first of ``names`` present in ``header`` (``None`` if absent and optional)."""
    for n in names:
        if n in header:
            return list(header).index(n)
    if required:
        raise WorkloadError(
            f"{display(path)}:1: missing column {' or '.join(names)} (header: {','.join(header)})"
        )
    return None


_INT64_MAX = 2**63 - 1


def parse_int(value: Any, where: str, field: str) -> int:
    """``value`` (text or JSON number) as an int64; integral floats such as ``12.0`` are
    accepted."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _in_range(value, where, field)
    if isinstance(value, str):
        try:
            parsed = int(value)
        except ValueError:
            pass
        else:
            return _in_range(parsed, where, field)
    number = _as_float(value)
    if not math.isfinite(number) or number != int(number):
        raise WorkloadError(f"{where}: field {field}: {value!r} is not an integer")
    return _in_range(int(number), where, field)


def _as_float(value: Any) -> float:
    """``float(value)``, or NaN for a bool or anything ``float`` refuses."""
    if isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _in_range(number: int, where: str, field: str) -> int:
    if abs(number) > _INT64_MAX:
        raise WorkloadError(f"{where}: field {field}: {number} is out of range (|n| < 2^63)")
    return number


def parse_float(value: Any, where: str, field: str) -> float:
    """``value`` (text or JSON number) as a finite float."""
    number = _as_float(value)
    if not math.isfinite(number):
        raise WorkloadError(f"{where}: field {field}: {value!r} is not a finite number")
    return number


def _field(fields: Any, key: Any, where: str, name: str) -> Any:
    try:
        return fields[key]
    except (KeyError, IndexError):
        raise WorkloadError(f"{where}: field {name}: missing") from None


def int_column(records: Sequence[Record], key: Any, field: str) -> NDArray[np.int64]:
    """Field ``key`` (a list index or dict key) of every record parsed as integers."""
    return np.array(
        [parse_int(_field(f, key, w, field), w, field) for w, f in records], dtype=np.int64
    )


def float_column(records: Sequence[Record], key: Any, field: str) -> NDArray[np.float64]:
    """Field ``key`` (a list index or dict key) of every record parsed as finite floats."""
    return np.array(
        [parse_float(_field(f, key, w, field), w, field) for w, f in records], dtype=np.float64
    )


def check_lengths(values: NDArray[np.int64], records: Sequence[Record], field: str) -> None:
    """Raise naming the first record whose length ``field`` is below 1."""
    bad = np.flatnonzero(values < 1)
    if bad.size:
        i = int(bad[0])
        raise WorkloadError(
            f"{records[i][0]}: field {field}: {int(values[i])} is not a positive length"
        )


def check_nondecreasing(times: NDArray[np.float64], records: Sequence[Record], field: str) -> None:
    """Raise naming the first record whose time ``field`` is earlier than the one before it."""
    bad = np.flatnonzero(np.diff(times) < 0)
    if bad.size:
        i = int(bad[0]) + 1
        raise WorkloadError(
            f"{records[i][0]}: field {field}: time goes backwards ({times[i]:g} after "
            f"{times[i - 1]:g}); rows must be in arrival order"
        )
