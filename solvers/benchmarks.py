"""A small benchmark library of clairvoyant instances with proven optima or bound/incumbent pairs.

``balanceroute/data/benchmarks/clairvoyant.json`` holds records ``{"instance": {...},
"optimum": x | null, "bound": lb, "incumbent": ub, "method": "..."}``: ``optimum`` when proven
(then bound = incumbent = optimum), otherwise the best proven lower bound and the best
work-conserving schedule's Σ I known, with the method that proved the bound. Load them with
:func:`load_benchmarks`; ``balanceroute gap --load`` takes the instances too.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from .instances import ClairvoyantInstance

__all__ = ["load_benchmarks"]


def load_benchmarks() -> list[tuple[ClairvoyantInstance, dict[str, Any]]]:
    """Every shipped benchmark as ``(instance, record)``."""
    text = resources.files("balanceroute.data").joinpath("benchmarks/clairvoyant.json").read_text()
    return [(ClairvoyantInstance.from_json(r["instance"]), r) for r in json.loads(text)["records"]]
