"""Policy parameter files: what ``balanceroute tune`` writes and ``--params FILE`` reads.

One file holds one policy's parameters and where they came from::

    {"format": "balanceroute-params/1",
     "policy": "brh-survival",
     "params": {"horizon": 80, "gamma": 0.95, "beta": 64.0, "s_greedy": 8},
     "provenance": {"command": "tune", "workload": "azure-2024-long", ...}}

``simulate``/``compare`` apply it to the row of that name, ``serve`` to its policy.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["FORMAT", "ParamsFile", "read_params", "write_params"]

FORMAT = "balanceroute-params/1"


class ParamsFile(dict):
    """``policy name → params`` read from one or more files (a plain dict, with ``sources``)."""

    sources: dict[str, str]


def _check_value(path: str, key: str, value: Any) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int):
        return
    if isinstance(value, float) and math.isfinite(value):
        return
    raise ValueError(f"{path}: params.{key}: {value!r} is not a finite number, string, "
                     "boolean or null")


def read_params(paths: list[str] | tuple[str, ...] | None) -> ParamsFile:
    """Read ``--params`` files; raise ``ValueError`` with a one-line reason for a bad one, or
    when two files name the same policy."""
    out = ParamsFile()
    out.sources = {}
    for path in paths or ():
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except FileNotFoundError:
            raise ValueError(f"--params {path}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--params {path}: cannot read ({exc})") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"--params {path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"--params {path}: not a parameter file (expected "
                             f'"format": "{FORMAT}", as `balanceroute tune --write-params` writes)')
        policy, params = doc.get("policy"), doc.get("params")
        if not isinstance(policy, str) or not policy:
            raise ValueError(f"--params {path}: \"policy\" must be a policy name")
        if not isinstance(params, dict):
            raise ValueError(f"--params {path}: \"params\" must be an object")
        for key, value in params.items():
            _check_value(path, key, value)
        if policy in out:
            raise ValueError(f"--params {path}: policy {policy!r} already set by "
                             f"{out.sources[policy]}")
        out[policy] = dict(params)
        out.sources[policy] = path
    return out


def write_params(path: str | os.PathLike, policy: str, params: Mapping[str, Any],
                 provenance: Mapping[str, Any]) -> None:
    """Write one policy's parameters (and how they were found) as a ``--params`` file."""
    doc = {"format": FORMAT, "policy": policy, "params": dict(params),
           "provenance": {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                          for k, v in provenance.items()}}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")
