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
    display,
    iter_json_lines,
    parse_float,
    parse_int,
    stem,
)
from .base import Workload, WorkloadError

__all__ = ["MOONCAKE_SOURCE", "load_bundled_mooncake", "load_mooncake", "prefix_hash"]

MOONCAKE_SOURCE = (
    "Mooncake FAST'25 conversation trace (kvcache-ai/Mooncake), Apache-2.0; "
    "Qin et al., Mooncake, FAST 2025"
)
"""Citation of the bundled Mooncake trace."""

FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
"""The fields every line must carry."""


def prefix_hash(hash_ids: Sequence[int]) -> int:
    """A stable 63-bit identity of a full ``hash_ids`` list (BLAKE2b of its int64 bytes).

    Equal lists give equal values on every machine and run (unlike Python's ``hash``).
    """
    data = np.asarray(hash_ids, dtype="<i8").tobytes()
    digest = hashlib.blake2b(data, digest_size=8, person=b"mooncake-hashids").digest()
    return int.from_bytes(digest, "little") >> 1


def load_mooncake(
    path: TracePath, *, name: str | None = None, source: str = MOONCAKE_SOURCE
) -> Workload:
    """The requests of a Mooncake JSON-lines trace; ``arrival_s`` = (timestamp − first) / 1000.

    ``prefix_hash`` is :func:`prefix_hash` of each line's ``hash_ids``.
    """
    where = display(path)
    lines, times, prompt, output, hashes = [], [], [], [], []
    for ln, obj in iter_json_lines(path):
        at = f"{where}:{ln}"
        for field in FIELDS:
            if field not in obj:
                raise WorkloadError(f"{at}: field {field}: missing")
        ids = obj["hash_ids"]
        if not isinstance(ids, list) or any(
            isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids
        ):
            raise WorkloadError(f"{at}: field hash_ids: expected a list of non-negative integers")
        lines.append(ln)
        times.append(parse_float(obj["timestamp"], at, "timestamp"))
        prompt.append(parse_int(obj["input_length"], at, "input_length"))
        output.append(parse_int(obj["output_length"], at, "output_length"))
        hashes.append(prefix_hash(ids))
    arrays = [np.array(prompt, dtype=np.int64), np.array(output, dtype=np.int64)]
    check_lengths(arrays[0], lines, path, "input_length")
    check_lengths(arrays[1], lines, path, "output_length")
    ms = np.array(times, dtype=np.float64)
    check_nondecreasing(ms, lines, path, "timestamp")
    return Workload(
        name=name or stem(path),
        prompt_len=arrays[0],
        output_len=arrays[1],
        arrival_s=(ms - ms[0]) / 1000.0,
        prefix_hash=np.array(hashes, dtype=np.int64),
        source=source,
    )


def load_bundled_mooncake() -> Workload:
    """The bundled Mooncake conversation trace as ``mooncake-conv``."""
    path = bundled_file("mooncake", "conversation_trace.jsonl")
    return load_mooncake(path, name="mooncake-conv")
