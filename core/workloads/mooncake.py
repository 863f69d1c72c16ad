"""Mooncake trace loader: JSON lines with ``timestamp`` (ms), ``input_length``, ``output_length``
and ``hash_ids`` (ids of the 512-token prefix blocks of the prompt)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from ._io import (
    TracePath,
    bundled_file,
    check_lengths,
    check_nondecreasing,
    float_column,
    int_column,
    read_json_records,
    stem,
)
from .base import Workload, WorkloadError

__all__ = ["MOONCAKE_SOURCE", "load_bundled_mooncake", "load_mooncake", "prefix_hash"]

MOONCAKE_SOURCE = (
    "Mooncake FAST'25 conversation trace (kvcache-ai/Mooncake), Apache-2.0; "
    "Qin et al., Mooncake, FAST 2025"
)
"""Citation of the bundled Mooncake trace."""


def prefix_hash(hash_ids: Sequence[int]) -> int:
    """A stable 63-bit identity of a full ``hash_ids`` list (BLAKE2b of its int64 bytes).

    Equal lists give equal values on every machine and run (unlike Python's ``hash``).
    """
    data = np.asarray(hash_ids, dtype="<i8").tobytes()
    digest = hashlib.blake2b(data, digest_size=8, person=b"mooncake-hashids").digest()
    return int.from_bytes(digest, "little") >> 1


def _hash_ids(obj: dict, where: str) -> list[int]:
    ids = obj.get("hash_ids")
    if not isinstance(ids, list) or not all(type(i) is int and 0 <= i < 2**63 for i in ids):
        shown = "missing" if ids is None else "expected a list of non-negative integers"
        raise WorkloadError(f"{where}: field hash_ids: {shown}")
    return ids


def load_mooncake(
    path: TracePath, *, name: str | None = None, source: str = MOONCAKE_SOURCE
) -> Workload:
    """The requests of a Mooncake JSON-lines trace; ``arrival_s`` = (timestamp − first) / 1000.

    ``prefix_hash`` is :func:`prefix_hash` of each line's ``hash_ids``.
    """
    records = read_json_records(path)
    prompt = int_column(records, "input_length", "input_length")
    output = int_column(records, "output_length", "output_length")
    ms = float_column(records, "timestamp", "timestamp")
    hashes = np.array([prefix_hash(_hash_ids(obj, where)) for where, obj in records], np.int64)
    check_lengths(prompt, records, "input_length")
    check_lengths(output, records, "output_length")
    check_nondecreasing(ms, records, "timestamp")
    return Workload(
        name=name or stem(path),
        prompt_len=prompt,
        output_len=output,
        arrival_s=(ms - ms[0]) / 1000.0,
        prefix_hash=hashes,
        source=source,
    )


def load_bundled_mooncake() -> Workload:
    """The bundled Mooncake conversation trace as ``mooncake-conv``."""
    path = bundled_file("mooncake", "conversation_trace.jsonl")
    return load_mooncake(path, name="mooncake-conv")
