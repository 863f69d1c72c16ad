"""Workloads: trace loaders, distribution-matched generators, transforms and the registry.

``load_workload(spec)`` takes a bundled name (see :func:`list_workloads`) or a file path, whose
format is recognised from its content: CSV with the Azure, vidur or plain header; JSON lines
of objects with ``hash_ids`` as Mooncake, other JSON lines or a JSON list as plain; a folder of
ServeGen ``chunk-N-*`` files. Files may be gzipped.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import replace as _replace
from pathlib import Path
from typing import Any

import numpy as np

from ._io import display, read_text
from .azure2023 import load_azure2023, load_bundled_azure2023
from .azure2024 import generate_azure2024, load_azure2024_histograms
from .base import Workload, WorkloadError
from .mooncake import load_bundled_mooncake, load_mooncake, prefix_hash
from .plain import load_plain
from .servegen import ServeGenPool, load_bundled_servegen, load_servegen
from .shapes import SHAPES, Shape, generate_shape
from .transforms import LengthBounds, clip_lengths, filter_lengths, head, scale_rate
from .vidur import load_vidur

__all__ = [
    "WORKLOADS",
    "LengthBounds",
    "SHAPES",
    "ServeGenPool",
    "Shape",
    "Workload",
    "WorkloadError",
    "clip_lengths",
    "detect_format",
    "filter_lengths",
    "generate_azure2024",
    "generate_shape",
    "head",
    "list_workloads",
    "load_azure2023",
    "load_bundled_servegen",
    "load_mooncake",
    "load_plain",
    "load_servegen",
    "load_vidur",
    "load_workload",
    "prefix_hash",
    "scale_rate",
]

Loader = Callable[..., Workload]
"""A registry entry: ``fn(*, requests, rng, bounds, **options) -> Workload``."""


def _servegen_r1(
    *,
    requests: int | None,
    rng: np.random.Generator,
    bounds: LengthBounds,
    start_s: float | str = 0.0,
    comonotone: bool = False,
) -> Workload:
    """ServeGen DeepSeek-R1 reasoning workload, generated from 73 clients' per-window arrival and
    length distributions (one day, 1.38 M requests, 43 % of outputs > 1000); from time 0."""
    return load_bundled_servegen().generate(
        requests, rng, start_s=start_s, bounds=bounds, comonotone=comonotone, name="servegen-r1"
    )


def _azure_conv_2023(**_: Any) -> Workload:
    """Azure LLM inference trace 2023, conversation: 19,366 requests over 58 min (replay)."""
    return load_bundled_azure2023("conv")


def _azure_code_2023(**_: Any) -> Workload:
    """Azure LLM inference trace 2023, code: 8,819 requests over 57 min (replay)."""
    return load_bundled_azure2023("code")


def _mooncake_conv(**_: Any) -> Workload:
    """Mooncake FAST'25 conversation trace (Kimi): 12,031 requests over 1 h with prefix-block
    hashes (replay)."""
    return load_bundled_mooncake()


def _azure2024(
    name: str,
    floor: int | None,
    requests: int | None,
    rng: np.random.Generator,
    bounds: LengthBounds,
    **options: Any,
) -> Workload:
    if requests is None:
        raise WorkloadError(f"{name} is a generator: pass requests=N")
    lows = [v for v in (floor, bounds.min_output) if v is not None]
    rest = LengthBounds(bounds.min_prompt, bounds.max_prompt, None, bounds.max_output)
    return generate_azure2024(
        requests,
        rng,
        min_output=max(lows) if lows else None,
        bounds=rest,
        histograms=load_azure2024_histograms(),
        name=name,
        **options,
    )


def _azure_2024(
    *,
    requests: int | None,
    rng: np.random.Generator,
    bounds: LengthBounds,
    traces: tuple[str, ...] = ("conv", "code"),
    rate: float | None = None,
) -> Workload:
    """Azure LLM inference trace 2024 (conv+code, one week), DISTRIBUTION-MATCHED from exact
    log2 histograms, not a replay; synthetic Poisson arrivals."""
    return _azure2024("azure-2024", None, requests, rng, bounds, traces=traces, rate=rate)


def _azure_2024_long(
    *,
    requests: int | None,
    rng: np.random.Generator,
    bounds: LengthBounds,
    traces: tuple[str, ...] = ("conv", "code"),
    rate: float | None = None,
) -> Workload:
    """Azure 2024 outputs > 1000 (the paper's workload; output bins >= 1024, 58,423 real
    requests), DISTRIBUTION-MATCHED from exact log2 histograms, not a replay."""
    return _azure2024("azure-2024-long", 1024, requests, rng, bounds, traces=traces, rate=rate)


def _shape_loader(name: str) -> Loader:
    shape = SHAPES[name]

    def load(*, requests: int | None, rng: np.random.Generator, bounds: LengthBounds,
             rate: float | None = None) -> Workload:
        if requests is None:
            raise WorkloadError(f"{name} is a generator: pass requests=N")
        use = shape if rate is None else _replace(shape, rate=float(rate))
        return generate_shape(use, requests, rng, name=name, bounds=bounds)

    load.__doc__ = (f"Parametric shape (core/workloads/shapes.py), GENERATED from parameters: "
                    f"{shape.doc}; arrivals at {shape.rate:g} req/s unless ``rate``.")
    return load


WORKLOADS: dict[str, Loader] = {
    "servegen-r1": _servegen_r1,
    "azure-conv-2023": _azure_conv_2023,
    "azure-code-2023": _azure_code_2023,
    "mooncake-conv": _mooncake_conv,
    "azure-2024": _azure_2024,
    "azure-2024-long": _azure_2024_long,
    **{name: _shape_loader(name) for name in SHAPES},
}
"""Bundled workload names → loaders (``fn(*, requests, rng, bounds, **options)``)."""


def list_workloads() -> list[tuple[str, str]]:
    """``(name, description)`` of every bundled workload."""
    return [(name, " ".join((fn.__doc__ or "").split())) for name, fn in WORKLOADS.items()]


def detect_format(path: str | os.PathLike) -> str:
    """The trace format of ``path``: ``azure``, ``vidur``, ``plain``, ``mooncake`` or
    ``servegen`` (a folder), recognised from the content (so any extension and gzip work)."""
    p = Path(path)
    if p.is_dir():
        return "servegen"
    text = read_text(p)
    first = text.lstrip()[:1]
    if first in ("[", "{"):
        line = text.lstrip().splitlines()[0]
        return "mooncake" if first == "{" and '"hash_ids"' in line else "plain"
    header = {h.strip().strip('"') for h in text.lstrip().splitlines()[0].split(",")}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
        return "azure"
    if {"num_prefill_tokens", "num_decode_tokens"} <= header:
        return "vidur"
    if header & {"input_length", "prompt_len"} and header & {"output_length", "output_len"}:
        return "plain"
    raise WorkloadError(
        f"{display(path)}:1: unknown CSV header {sorted(header)}; expected "
        "TIMESTAMP,ContextTokens,GeneratedTokens (Azure), num_prefill_tokens,num_decode_tokens "
        "(vidur) or input_length,output_length (plain)"
    )


def _load_file(
    path: str | os.PathLike,
    *,
    requests: int | None,
    rng: np.random.Generator,
    bounds: LengthBounds,
    **options: Any,
) -> Workload:
    fmt = detect_format(path)
    if fmt == "servegen":
        _check_options(ServeGenPool.generate, options, display(path))
        return load_servegen(path).generate(requests, rng, bounds=bounds, **options)
    loader = {
        "azure": load_azure2023,
        "vidur": load_vidur,
        "plain": load_plain,
        "mooncake": load_mooncake,
    }[fmt]
    _check_options(loader, options, display(path))
    return loader(path, **options)


def _check_options(fn: Callable[..., Any], options: dict[str, Any], spec: str) -> None:
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = sorted(set(params) - {"self", "requests", "rng", "bounds", "path"})
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise WorkloadError(
            f"{spec}: unknown option(s) {', '.join(unknown)} (accepted: {', '.join(accepted)})"
        )


def load_workload(
    spec: str | os.PathLike,
    *,
    requests: int | None = None,
    seed: int = 0,
    min_output: int | None = None,
    max_output: int | None = None,
    min_prompt: int | None = None,
    max_prompt: int | None = None,
    clip_prompt: int | None = None,
    clip_output: int | None = None,
    rate_scale: float = 1.0,
    **options: Any,
) -> Workload:
    """A bundled workload by name, or a trace file (format detected) or ServeGen folder.

    Steps: load (generators draw from ``np.random.default_rng(seed)``), keep requests with
    lengths within the inclusive bounds (``min_output=1001`` = outputs > 1000), take the first
    ``requests`` (generators produce that many after filtering), cap lengths at ``clip_*``,
    divide arrival times by ``rate_scale``. ``options`` go to the loader (e.g. ``start_s`` for
    ServeGen, ``traces``/``rate`` for Azure 2024, ``time_unit`` for plain files).
    """
    bounds = LengthBounds(min_prompt, max_prompt, min_output, max_output)
    rng = np.random.default_rng(seed)
    if requests is not None and requests < 0:
        raise WorkloadError(f"requests must be >= 0, not {requests}")
    key = os.fspath(spec)
    if key in WORKLOADS:
        _check_options(WORKLOADS[key], options, key)
        workload = WORKLOADS[key](requests=requests, rng=rng, bounds=bounds, **options)
    elif os.path.exists(key):
        workload = _load_file(key, requests=requests, rng=rng, bounds=bounds, **options)
    else:
        raise WorkloadError(
            f"unknown workload {key!r}: not a bundled name ({', '.join(WORKLOADS)}) "
            "nor an existing file"
        )
    workload = filter_lengths(workload, bounds)
    if requests is not None:
        workload = head(workload, requests)
    if clip_prompt is not None or clip_output is not None:
        workload = clip_lengths(workload, max_prompt=clip_prompt, max_output=clip_output)
    return scale_rate(workload, rate_scale)
