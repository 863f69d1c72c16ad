"""A small benchmark library of clairvoyant instances with proven optima or bound/incumbent pairs.

``balanceroute/data/benchmarks/clairvoyant.json`` holds records ``{"instance": {...},
"optimum": x | null, "bound": lb, "incumbent": ub, "method": "..."}``: ``optimum`` when proven
(then bound = incumbent = optimum), otherwise the best proven lower bound and the best
work-conserving schedule's Σ I known, with the method that proved the bound. Load them with
:func:`load_benchmarks`; ``balanceroute gap --load FILE`` takes a library file too.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from .instances import ClairvoyantInstance

__all__ = ["is_benchmark_library", "load_benchmarks"]


def load_benchmarks(path: str | Path | None = None) -> list[tuple[ClairvoyantInstance, dict[str, Any]]]:
    """Every benchmark of a library file (default: the shipped one) as ``(instance, record)``."""
    if path is None:
        text = resources.files("balanceroute.data").joinpath("benchmarks/clairvoyant.json").read_text()
    else:
        text = Path(path).read_text()
    try:
        records = json.loads(text)["records"]
        return [(ClairvoyantInstance.from_json(r["instance"]), r) for r in records]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path or 'the shipped library'}: not a benchmark library ({exc})") from None


def is_benchmark_library(path: str | Path) -> bool:
    """True when ``path`` is a JSON library (``{"records": [...]}``) rather than one instance."""
    try:
        return "records" in json.loads(Path(path).read_text())
    except (ValueError, TypeError, OSError):
        return False
