"""DISTRIBUTION-MATCHED Azure LLM inference trace 2024 workloads (not a replay).

Only exact log2-binned histograms (bins ``[low, high)``) of the week-long 2024 conv and code
traces and their summary exist here, not the per-request files. A request is drawn as: a
(trace, output bin) cell with probability proportional to its count, an output length uniform
over the integers of the bin capped at the trace's maximum (conv 1500, code 5000), and an input
length from the same trace's input histogram, drawn the same way, INDEPENDENTLY of the output:
the marginals match the data at bin resolution, the joint distribution is not available.
Arrival times are SYNTHETIC: a Poisson process.

``min_output`` selects whole output bins: it is rounded up to the next bin edge because lengths
inside a bin cannot be separated. The paper's "outputs > 1000" thus uses the bins >= 1024
(58,423 real requests; outputs 1001..1023 share the bin [512, 1024)).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ._io import TracePath, bundled_file, column, display, float_column, int_column, read_csv
from .base import Workload, WorkloadError
from .transforms import LengthBounds

__all__ = [
    "AZURE2024_CITATION",
    "TRACES",
    "Azure2024Histograms",
    "generate_azure2024",
    "load_azure2024_histograms",
]

TRACES = ("conv", "code")
"""The 2024 traces; a request's ``client`` is its trace's index here (0 conv, 1 code)."""

AZURE2024_CITATION = (
    "Azure LLM inference trace 2024 (Azure/AzurePublicDataset) exact log2 histograms, data "
    "CC-BY-4.0; Stojkovic et al., DynamoLLM, HPCA 2025"
)
"""Citation of the bundled 2024 aggregates."""

_BATCH_LIMIT = 50_000_000


class Azure2024Histograms:
    """Per-trace histograms ``{trace: (low, high, count)}`` for ``output`` and ``input``, with
    the trace maxima, request counts and durations from the summary."""

    def __init__(self, histograms: TracePath, summary: TracePath) -> None:
        """Read the histogram CSV (``trace,kind,bin_low,bin_high,count``) and the summary CSV."""
        header, rows = read_csv(histograms)
        cols = [
            column(header, (c,), histograms)
            for c in ("trace", "kind", "bin_low", "bin_high", "count")
        ]
        low, high, count = (int_column(rows, cols[i], header[cols[i]]) for i in (2, 3, 4))
        self.output: dict[str, tuple[NDArray[np.int64], ...]] = {}
        self.input: dict[str, tuple[NDArray[np.int64], ...]] = {}
        head, srows = read_csv(summary)
        scols = [
            column(head, (c,), summary)
            for c in ("trace", "requests", "window_minutes", "input_max", "output_max")
        ]
        by_trace = {fields[scols[0]]: (where, fields) for where, fields in srows}
        self.max_input: dict[str, int] = {}
        self.max_output: dict[str, int] = {}
        self.requests: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        for trace in TRACES:
            key = f"{trace}_2024"
            if key not in by_trace:
                raise WorkloadError(f"{display(summary)}: no row for trace {key}")
            rec = [by_trace[key]]
            self.requests[trace] = int(int_column(rec, scols[1], "requests")[0])
            self.seconds[trace] = float(float_column(rec, scols[2], "window_minutes")[0]) * 60
            self.max_input[trace] = int(int_column(rec, scols[3], "input_max")[0])
            self.max_output[trace] = int(int_column(rec, scols[4], "output_max")[0])
            for kind, table in (("output", self.output), ("input", self.input)):
                sel = np.array([f[cols[0]] == key and f[cols[1]] == kind for _, f in rows])
                if not sel.any() or count[sel].sum() <= 0:
                    raise WorkloadError(f"{display(histograms)}: no {kind} histogram for {key}")
                if (count[sel] < 0).any() or (high[sel] <= low[sel]).any():
                    raise WorkloadError(f"{display(histograms)}: invalid {kind} bins for {key}")
                table[trace] = (low[sel], high[sel], count[sel])

    def output_edge(self, min_output: int | None) -> int:
        """``min_output`` rounded up to the next output bin edge (1 if ``None``)."""
        if min_output is None or min_output <= 1:
            return 1
        edges = np.unique(np.concatenate([t[0] for t in self.output.values()]))
        above = edges[edges >= min_output]
        if above.size == 0:
            raise WorkloadError(f"min_output={min_output} is above every output bin")
        return int(above[0])


def load_azure2024_histograms() -> Azure2024Histograms:
    """The bundled 2024 histograms and summary."""
    return Azure2024Histograms(
        bundled_file("azure2024", "azure_trace_histograms_2024_output.csv"),
        bundled_file("azure2024", "azure_trace_summary.csv"),
    )


def _cells(
    table: tuple[NDArray[np.int64], ...], cap: int, min_low: int
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Bins with low >= ``min_low`` and a positive count, as (low, capped high, count)."""
    low, high, count = table
    keep = (low >= min_low) & (count > 0)
    lo = np.maximum(low[keep], 1)
    hi = np.minimum(high[keep], cap + 1)
    if (hi <= lo).any():
        raise WorkloadError(f"a histogram bin with requests lies above the trace maximum {cap}")
    return lo, hi, count[keep]


def _draw(
    rng: np.random.Generator, lo: NDArray, hi: NDArray, count: NDArray, n: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``n`` (cell index, uniform integer length within the cell) draws."""
    cum = np.cumsum(count)
    cell = np.searchsorted(cum, rng.random(n) * cum[-1], side="right")
    cell = np.minimum(cell, len(count) - 1)
    return cell, rng.integers(lo[cell], hi[cell])


def generate_azure2024(
    requests: int,
    rng: np.random.Generator,
    *,
    traces: tuple[str, ...] = TRACES,
    min_output: int | None = None,
    rate: float | None = None,
    bounds: LengthBounds | None = None,
    histograms: Azure2024Histograms | None = None,
    name: str | None = None,
) -> Workload:
    """``requests`` distribution-matched requests of the 2024 ``traces`` (see the module doc).

    ``min_output`` keeps whole output bins (rounded up to a bin edge); further ``bounds`` are
    applied exactly by rejection (lengths are uniform within bins). ``rate`` (req/s) of the
    synthetic Poisson arrivals defaults to the real week-average rate of the selected bins
    (all traffic: 72.9 req/s; output bins >= 1024: 0.097 req/s); the first request is at 0.
    """
    hist = histograms if histograms is not None else load_azure2024_histograms()
    if requests < 0:
        raise WorkloadError(f"cannot generate {requests} requests")
    if not traces or any(t not in TRACES for t in traces):
        raise WorkloadError(f"traces must be a non-empty subset of {TRACES}, not {traces!r}")
    edge = hist.output_edge(min_output)
    ids = [TRACES.index(t) for t in traces]
    cells = [_cells(hist.output[t], hist.max_output[t], edge) for t in traces]
    trace_of = np.concatenate([np.full(len(c[0]), i) for i, c in zip(ids, cells, strict=True)])
    o_lo, o_hi, o_count = (np.concatenate([c[k] for c in cells]) for k in range(3))
    if o_count.sum() == 0:
        raise WorkloadError(f"no 2024 request of {traces} has an output >= {edge}")
    inputs = {i: _cells(hist.input[TRACES[i]], hist.max_input[TRACES[i]], 1) for i in ids}
    if rate is None:
        rate = sum(c[2].sum() / hist.seconds[t] for t, c in zip(traces, cells, strict=True))
    if not np.isfinite(rate) or rate <= 0:
        raise WorkloadError(f"rate must be a positive number of requests/s, not {rate!r}")

    parts: list[tuple[NDArray[np.int64], ...]] = []
    have, drawn = 0, 0
    while have < requests or not parts:
        accept = have / drawn if drawn else 1.0
        if drawn and have == 0 and drawn >= 1_000_000:
            shown = (bounds or LengthBounds()).describe()
            raise WorkloadError(f"no distribution-matched request satisfies {shown}")
        n = min(
            int(np.ceil((requests - have) / max(accept, 1e-9) * (1.1 if drawn else 1))),
            _BATCH_LIMIT,
        )
        cell, output = _draw(rng, o_lo, o_hi, o_count, n)
        client = trace_of[cell]
        prompt = np.empty(n, dtype=np.int64)
        for i, (lo, hi, count) in inputs.items():
            sel = client == i
            prompt[sel] = _draw(rng, lo, hi, count, int(sel.sum()))[1]
        keep = bounds.mask(prompt, output) if bounds is not None else slice(None)
        parts.append((prompt[keep], output[keep], client[keep]))
        drawn += n
        have += len(parts[-1][0])
    prompt, output, client = (np.concatenate([p[k] for p in parts])[:requests] for k in range(3))
    gaps = rng.exponential(1.0 / rate, size=max(requests - 1, 0))
    arrival = np.concatenate([[0.0], np.cumsum(gaps)])[:requests]
    label = "+".join(traces) + (f", outputs >= {edge}" if edge > 1 else "")
    extra = f"; bounds {bounds.describe()}" if bounds is not None and bounds.active else ""
    return Workload(
        name=name or f"azure-2024-{'-'.join(traces)}",
        prompt_len=prompt.astype(np.int64),
        output_len=output.astype(np.int64),
        arrival_s=arrival,
        client=client.astype(np.int64),
        source=(
            f"DISTRIBUTION-MATCHED, not a replay ({label}{extra}): output bin drawn in proportion "
            "to its count, length uniform within the bin up to the trace maximum; input drawn "
            "independently from the same trace's input histogram (exact marginals at bin "
            f"resolution, the joint is not available); SYNTHETIC Poisson arrivals at {rate:.4g} "
            f"req/s. {AZURE2024_CITATION}"
        ),
    )
