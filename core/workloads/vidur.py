"""vidur request traces: CSV with ``num_prefill_tokens``, ``num_decode_tokens`` and optionally
``arrived_at`` (seconds), as vidur's trace-replay and trace-length generators read them
(``TraceReplayRequestGenerator``, ``TraceRequestLengthGenerator``); other columns are ignored."""

from __future__ import annotations

from ._io import TracePath
from .base import Workload
from .plain import Columns, load_table

__all__ = ["VIDUR_COLUMNS", "load_vidur"]

VIDUR_COLUMNS = Columns(
    prompt=("num_prefill_tokens",),
    output=("num_decode_tokens",),
    arrival_s=("arrived_at",),
)
"""vidur's column names."""


def load_vidur(path: TracePath, *, name: str | None = None, source: str = "") -> Workload:
    """The requests of a vidur trace CSV (``arrival_s`` = ``arrived_at`` as-is, if present).

    Unlike vidur, which clips token counts to at least 1, a length below 1 is an error here.
    """
    return load_table(path, VIDUR_COLUMNS, name=name, source=source)
