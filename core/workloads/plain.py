"""Plain request tables: CSV, JSON (a list of objects) or JSON lines with the fields
``input_length`` and ``output_length`` and optionally a time, a client and a prefix hash.

The column-table builder here is shared by the vidur loader, which is the same table with
vidur's column names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ._io import (
    Record,
    TracePath,
    check_lengths,
    check_nondecreasing,
    column,
    float_column,
    int_column,
    read_csv,
    read_json_records,
    read_text,
    stem,
)
from .base import Workload, WorkloadError

__all__ = ["PLAIN_COLUMNS", "Columns", "load_plain", "load_table", "records_to_workload"]


@dataclass(frozen=True)
class Columns:
    """Accepted names (first match wins) of each column of a request table.

    ``arrival_s`` columns hold seconds used as-is; ``timestamp`` columns hold a clock in
    ``time_unit`` that is rebased so the first row arrives at 0.
    """

    prompt: tuple[str, ...]
    output: tuple[str, ...]
    arrival_s: tuple[str, ...] = ()
    timestamp: tuple[str, ...] = ()
    client: tuple[str, ...] = ()
    prefix_hash: tuple[str, ...] = ()


PLAIN_COLUMNS = Columns(
    prompt=("input_length", "prompt_len"),
    output=("output_length", "output_len"),
    arrival_s=("arrival_s",),
    timestamp=("timestamp",),
    client=("client",),
    prefix_hash=("prefix_hash",),
)
"""The plain format's column names (``prompt_len``/``output_len`` are accepted aliases)."""

_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def records_to_workload(
    records: Sequence[Record],
    keys: dict[str, object | None],
    path: TracePath,
    *,
    name: str | None = None,
    source: str = "",
    time_unit: str = "s",
) -> Workload:
    """A workload from parsed records; ``keys`` maps each :class:`Columns` field to the list
    index or dict key holding it in every record (``None``: the column is absent)."""
    if time_unit not in _TIME_UNITS:
        raise WorkloadError(f"time_unit must be one of {sorted(_TIME_UNITS)}, not {time_unit!r}")

    def ints(field: str) -> np.ndarray | None:
        key = keys.get(field)
        return None if key is None else int_column(records, key, str(key))

    prompt = int_column(records, keys["prompt"], str(keys["prompt"]))
    output = int_column(records, keys["output"], str(keys["output"]))
    check_lengths(prompt, records, str(keys["prompt"]))
    check_lengths(output, records, str(keys["output"]))
    arrival = None
    for field in ("arrival_s", "timestamp"):
        key = keys.get(field)
        if key is not None and arrival is None:
            arrival = float_column(records, key, str(key))
            check_nondecreasing(arrival, records, str(key))
            if field == "timestamp":
                arrival = (arrival - arrival[0]) * _TIME_UNITS[time_unit]
    return Workload(
        name=name or stem(path),
        prompt_len=prompt,
        output_len=output,
        arrival_s=arrival,
        prefix_hash=ints("prefix_hash"),
        client=ints("client"),
        source=source or f"{stem(path)} (user-supplied trace)",
    )


def _key_map(present: Sequence[str], columns: Columns, path: TracePath) -> dict[str, object]:
    required = ("prompt", "output")
    return {
        field: (
            None
            if (i := column(present, names, path, required=field in required)) is None
            else present[i]
        )
        for field, names in vars(columns).items()
    }


def load_table(
    path: TracePath,
    columns: Columns = PLAIN_COLUMNS,
    *,
    name: str | None = None,
    source: str = "",
    time_unit: str = "s",
) -> Workload:
    """A request table read from CSV (with a header), a JSON list of objects or JSON lines; the
    format is recognised from the content (``[`` → JSON list, ``{`` → JSON lines, else CSV)."""
    text = read_text(path)
    if text.lstrip()[:1] in ("[", "{"):
        records = read_json_records(path, text=text)
        keys = _key_map(list(records[0][1]), columns, path)
    else:
        header, rows = read_csv(path, text=text)
        keys = _key_map(header, columns, path)
        records = [(where, dict(zip(header, fields, strict=True))) for where, fields in rows]
    return records_to_workload(records, keys, path, name=name, source=source, time_unit=time_unit)


def load_plain(
    path: TracePath, *, name: str | None = None, source: str = "", time_unit: str = "s"
) -> Workload:
    """A plain trace: ``input_length``, ``output_length`` and optional ``arrival_s`` (seconds) or
    ``timestamp`` (in ``time_unit``, rebased to the first row), ``client``, ``prefix_hash``."""
    return load_table(path, PLAIN_COLUMNS, name=name, source=source, time_unit=time_unit)
