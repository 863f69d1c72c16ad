"""Azure LLM inference trace loader (``TIMESTAMP,ContextTokens,GeneratedTokens``).

Reads the 2023 Splitwise files (naive timestamps with 7 fractional digits) and any CSV of the same
schema, e.g. the 2024 one-week files whose timestamps carry a UTC offset.
"""

from __future__ import annotations

import re

import numpy as np
from numpy.typing import NDArray

from ._io import (
    Record,
    TracePath,
    bundled_file,
    check_lengths,
    check_nondecreasing,
    column,
    int_column,
    read_csv,
    stem,
)
from .base import Workload, WorkloadError

__all__ = ["AZURE2023_SOURCE", "load_azure2023", "load_bundled_azure2023"]

AZURE2023_SOURCE = (
    "Azure LLM inference trace 2023 (Azure/AzurePublicDataset), CC-BY-4.0; "
    "Patel et al., Splitwise, ISCA 2024"
)
"""Citation of the bundled 2023 files."""

HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""The columns of an Azure trace CSV."""

_TZ = re.compile(r"(Z|[+-]\d{2}:?\d{2})$")


def _utc_offset_ns(suffix: str) -> int:
    if suffix == "Z":
        return 0
    sign = -1 if suffix[0] == "-" else 1
    digits = suffix[1:].replace(":", "")
    return sign * (int(digits[:2]) * 60 + int(digits[2:])) * 60 * 1_000_000_000


def _is_timestamp(text: str) -> bool:
    try:
        return not np.isnat(np.datetime64(text, "ns"))
    except ValueError:
        return False


def parse_timestamps(texts: list[str], records: list[Record]) -> NDArray[np.float64]:
    """Seconds of each timestamp after the first one (nanosecond exact; UTC offsets honoured)."""
    naive, offsets = [], np.zeros(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        m = _TZ.search(text)
        if m and len(text) > 10:  # a bare date such as 2024-05-10 has no offset
            offsets[i] = _utc_offset_ns(m.group(1))
            text = text[: m.start()]
        naive.append(text)
    try:
        stamps = np.array(naive, dtype="datetime64[ns]")
        bad = np.flatnonzero(np.isnat(stamps)).tolist()
    except ValueError:
        bad = [i for i, text in enumerate(naive) if not _is_timestamp(text)] or [0]
    if bad:
        raise WorkloadError(
            f"{records[bad[0]][0]}: field TIMESTAMP: {texts[bad[0]]!r} is not a timestamp"
        )
    ns = stamps.astype(np.int64) - offsets
    return (ns - ns[0]).astype(np.float64) / 1e9


def load_azure2023(
    path: TracePath, *, name: str | None = None, source: str = AZURE2023_SOURCE
) -> Workload:
    """The requests of an Azure trace CSV; ``arrival_s`` counts from the first row."""
    header, rows = read_csv(path)
    cols = [column(header, (h,), path) for h in HEADER]
    prompt = int_column(rows, cols[1], HEADER[1])
    output = int_column(rows, cols[2], HEADER[2])
    check_lengths(prompt, rows, HEADER[1])
    check_lengths(output, rows, HEADER[2])
    arrival = parse_timestamps([fields[cols[0]] for _, fields in rows], rows)
    check_nondecreasing(arrival, rows, HEADER[0])
    return Workload(
        name=name or stem(path),
        prompt_len=prompt,
        output_len=output,
        arrival_s=arrival,
        source=source,
    )


def load_bundled_azure2023(kind: str) -> Workload:
    """The bundled 2023 trace ``kind`` (``"conv"`` or ``"code"``) as ``azure-<kind>-2023``."""
    if kind not in ("conv", "code"):
        raise WorkloadError(f"Azure 2023 trace kind must be 'conv' or 'code', not {kind!r}")
    path = bundled_file("azure2023", f"AzureLLMInferenceTrace_{kind}.csv")
    return load_azure2023(path, name=f"azure-{kind}-2023", source=f"{AZURE2023_SOURCE} ({kind})")
