"""ServeGen client-distribution workloads (e.g. the bundled DeepSeek-R1 reasoning workload).

Per client N (``chunk-N-*``): ``chunk-N-trace.csv`` rows ``start_s, rate, cv, dist, shape,
scale`` for consecutive windows (10 minutes over one day) and ``chunk-N-dataset.json`` with
stringified input/output length PDFs per 6-hour window. Generation follows ServeGen's
``generate_workload`` at the trace's own rates, with these choices:

* a window holds exactly ``round(rate × window)`` requests (the rates are such counts / 600);
  their times are the interior points of ``n + 1`` inter-arrival gaps drawn from the window's
  distribution (``Gamma(shape, scale)`` or ``Weibull(shape, scale)`` as ``scipy.stats`` reads
  them; an empty or ``Exponential`` name means exponential gaps) and rescaled to span the
  window, as ServeGen rescales them (so the scale parameter cancels);
* lengths come from the latest non-empty dataset window at or before the request's window
  (ServeGen's rule); input and output are drawn independently (the data holds only marginals;
  ServeGen's own generator reuses one uniform for all fields, ``comonotone=True`` mimics that);
* ``prefix_hash`` is ``None`` (the data has no prompt identity); ``client`` is N; the
  ``reason_ratio`` PDFs (reasoning share of the output) are not used;
* the day repeats cyclically when more requests are asked for than remain in it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._io import (
    TracePath,
    bundled_dir,
    display,
    find_file,
    float_column,
    node,
    parse_float,
    parse_int,
    read_csv,
    read_text,
)
from .base import Workload, WorkloadError
from .transforms import LengthBounds

__all__ = [
    "SERVEGEN_R1_SOURCE",
    "LengthPdfs",
    "ServeGenPool",
    "load_bundled_servegen",
    "load_servegen",
]

SERVEGEN_R1_SOURCE = (
    "ServeGen reason/deepseek-r1 client distributions (alibaba/ServeGen), Apache-2.0; "
    "Xiang et al., ServeGen, arXiv 2505.09999 (2025)"
)
"""Citation of the bundled ServeGen data."""

_CHUNK = re.compile(r"^chunk-(\d+)-trace\.csv(\.gz)?$")
_LENGTH_FIELDS = ("input_tokens", "output_tokens")


@dataclass(frozen=True)
class LengthPdfs:
    """Discrete length distributions stacked into one array: group g owns
    ``values[starts[g]:starts[g + 1]]`` with CDF ``cdf - g`` (increasing, ending at exactly 1)."""

    values: NDArray[np.int64]
    cdf: NDArray[np.float64]
    starts: NDArray[np.int64]

    @classmethod
    def stack(cls, pdfs: list[tuple[NDArray[np.int64], NDArray[np.float64]]]) -> LengthPdfs:
        """Stack ``(values, probabilities)`` pairs, one per group."""
        sizes = np.array([len(v) for v, _ in pdfs], dtype=np.int64)
        cdfs = []
        for g, (_, p) in enumerate(pdfs):
            c = np.cumsum(p) / p.sum()
            c[-1] = 1.0
            cdfs.append(g + c)
        return cls(
            values=np.concatenate([v for v, _ in pdfs]) if pdfs else np.zeros(0, np.int64),
            cdf=np.concatenate(cdfs) if cdfs else np.zeros(0),
            starts=np.concatenate([[0], np.cumsum(sizes)]),
        )

    def sample(self, groups: NDArray[np.int64], u: NDArray[np.float64]) -> NDArray[np.int64]:
        """The length at quantile ``u`` ∈ [0, 1) of each request's group (vectorised)."""
        idx = np.searchsorted(self.cdf, groups + u, side="right")
        idx = np.clip(idx, self.starts[groups], self.starts[groups + 1] - 1)
        return self.values[idx]

    def tail_share(self, threshold: int) -> NDArray[np.float64]:
        """P(length > ``threshold``) of every group."""
        sizes = np.diff(self.starts)
        g = np.repeat(np.arange(len(sizes)), sizes)
        local = self.cdf - g
        p = np.diff(local, prepend=0.0)
        firsts = self.starts[:-1][sizes > 0]
        p[firsts] = local[firsts]
        return np.bincount(g, weights=p * (self.values > threshold), minlength=len(sizes))


def _parse_pdf(text: object, where: str) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """A stringified ``{length: probability, ...}`` dict, parsed as JSON (never ``eval``)."""
    if (
        not isinstance(text, str)
        or not text.strip().startswith("{")
        or not text.strip().endswith("}")
    ):
        raise WorkloadError(f"{where}: expected a string holding a {{length: probability}} dict")
    try:
        flat = json.loads("[" + text.strip()[1:-1].replace(":", ",") + "]")
    except json.JSONDecodeError:
        raise WorkloadError(f"{where}: not a {{length: probability}} dict") from None
    if len(flat) % 2 or not all(isinstance(x, (int, float)) for x in flat):
        raise WorkloadError(f"{where}: not a {{length: probability}} dict")
    keys, probs = np.array(flat[0::2], dtype=np.float64), np.array(flat[1::2], dtype=np.float64)
    if (probs < 0).any() or not np.isfinite(probs).all():
        raise WorkloadError(f"{where}: negative or non-finite probability")
    if (keys != np.round(keys)).any() or (keys[probs > 0] < 1).any():
        raise WorkloadError(f"{where}: lengths must be positive integers")
    keep = probs > 0
    order = np.argsort(keys[keep], kind="stable")
    return keys[keep][order].astype(np.int64), probs[keep][order]


@dataclass(frozen=True)
class ServeGenPool:
    """The clients of a ServeGen workload as arrays over (client, window).

    ``counts[c, k]`` requests arrive in window k (start ``k × window_s``) of client
    ``clients[c]`` with inter-arrival ``shape[c, k]`` (Weibull where ``weibull[c, k]``, else
    Gamma) and lengths from group ``group[c, k]`` of ``input_pdfs`` / ``output_pdfs``.
    """

    clients: NDArray[np.int64]
    window_s: float
    counts: NDArray[np.int64]
    shape: NDArray[np.float64]
    weibull: NDArray[np.bool_]
    group: NDArray[np.int64]
    input_pdfs: LengthPdfs
    output_pdfs: LengthPdfs
    source: str = ""

    @property
    def period_s(self) -> float:
        """Length of the trace (one day for the bundled data); generation repeats after it."""
        return self.window_s * self.counts.shape[1]

    def busiest_start_s(self) -> float:
        """Start of the window with the most requests over all clients."""
        return float(np.argmax(self.counts.sum(axis=0))) * self.window_s

    def output_share(self, threshold: int) -> float:
        """Expected request-weighted share of outputs > ``threshold`` over the whole period."""
        tail = self.output_pdfs.tail_share(threshold)
        active = self.counts > 0
        return float((self.counts[active] * tail[self.group[active]]).sum() / self.counts.sum())

    def _windows(
        self, k0: int, k1: int, rng: np.random.Generator, comonotone: bool
    ) -> tuple[NDArray, ...]:
        """(arrival_s, prompt, output, client) of windows ``k0 ≤ k < k1`` (cyclic), unsorted."""
        n_slots = self.counts.shape[1]
        ks = np.arange(k0, k1)
        c, j = np.nonzero(self.counts[:, ks % n_slots])
        base = ks[j] % n_slots
        n = self.counts[c, base]
        shape, weib = self.shape[c, base], self.weibull[c, base]
        gaps = n + 1
        pair = np.repeat(np.arange(len(n)), gaps)
        x = np.empty(int(gaps.sum()))
        w = weib[pair]
        x[~w] = rng.standard_gamma(shape[pair][~w])
        x[w] = rng.weibull(shape[pair][w])
        first = np.cumsum(gaps) - gaps
        total = np.add.reduceat(x, first) if len(first) else np.zeros(0)
        even = ~np.isfinite(total) | (total <= 0)  # degenerate draws: spread evenly
        frac = np.where(even[pair], 1.0 / gaps[pair], x / np.where(even, 1.0, total)[pair])
        cum = np.cumsum(frac)
        within = cum - (cum[first] - frac[first])[pair]
        keep = np.ones(len(x), dtype=bool)
        keep[first + gaps - 1] = False
        pair = pair[keep]
        within = np.clip(within[keep], 0.0, 1.0 - 1e-9)  # stay inside the window despite rounding
        arrival = (ks[j][pair] + within) * self.window_s
        groups = self.group[c, base][pair]
        u_in = rng.random(len(pair))
        u_out = u_in if comonotone else rng.random(len(pair))
        return (
            arrival,
            self.input_pdfs.sample(groups, u_in),
            self.output_pdfs.sample(groups, u_out),
            self.clients[c][pair],
        )

    def generate(
        self,
        requests: int | None,
        rng: np.random.Generator,
        *,
        start_s: float | str = 0.0,
        bounds: LengthBounds | None = None,
        comonotone: bool = False,
        name: str = "servegen",
    ) -> Workload:
        """The first ``requests`` requests (within ``bounds``) from ``start_s`` on, all clients
        merged by time; ``requests=None``: every request of one period from ``start_s``.

        ``start_s`` is seconds after the first window's start (default 0, as ServeGen's
        ``generate_workload`` starts) or ``"busiest"`` (the window with the most requests);
        ``arrival_s`` counts from ``start_s``.
        """
        if isinstance(start_s, str):
            if start_s != "busiest":
                raise WorkloadError(f"start_s must be seconds or 'busiest', not {start_s!r}")
            start_s = self.busiest_start_s()
        if not math.isfinite(start_s) or start_s < 0:
            raise WorkloadError(f"start_s must be >= 0, not {start_s}")
        if requests is not None and requests < 0:
            raise WorkloadError(f"cannot generate {requests} requests")
        per_slot = self.counts.sum(axis=0)
        if per_slot.sum() == 0:
            raise WorkloadError("the ServeGen pool has no requests")
        n_slots = len(per_slot)
        k = int(start_s // self.window_s)
        limit = n_slots if requests is None else None
        parts: list[tuple[NDArray, ...]] = []
        have, raw = 0, 0
        while limit is not None or have < requests or not parts:
            if limit is None:
                accept = have / raw if raw else 1.0
                if raw >= per_slot.sum() and have == 0:
                    shown = (bounds or LengthBounds()).describe()
                    raise WorkloadError(f"no ServeGen request satisfies {shown}")
                want = (requests - have) / max(accept, 1e-9) * (1.1 if raw else 1.0)
                want = min(want, float(per_slot.sum()))  # at most a day per round: bounded memory
                reps = int(want // per_slot.sum()) + 2
                cum = np.cumsum(np.tile(np.roll(per_slot, -(k % n_slots)), reps))
                slots = min(int(np.searchsorted(cum, math.ceil(want))) + 1, len(cum))
            else:
                slots = limit
            arrival, prompt, output, client = self._windows(k, k + slots, rng, comonotone)
            raw += len(arrival)
            keep = arrival >= start_s
            if bounds is not None:
                keep &= bounds.mask(prompt, output)
            order = np.flatnonzero(keep)[np.argsort(arrival[keep], kind="stable")]
            parts.append((arrival[order] - start_s, prompt[order], output[order], client[order]))
            have += len(order)
            k += slots
            if limit is not None:
                break
        cols = [np.concatenate([p[i] for p in parts]) for i in range(4)]
        if requests is not None:
            cols = [col[:requests] for col in cols]
        label = f"start {start_s:g} s" + (
            f"; {bounds.describe()}" if bounds and bounds.active else ""
        )
        return Workload(
            name=name,
            prompt_len=cols[1].astype(np.int64),
            output_len=cols[2].astype(np.int64),
            arrival_s=cols[0].astype(np.float64),
            client=cols[3].astype(np.int64),
            source=f"generated from {self.source} ({label})",
        )


def _client_trace(path: TracePath) -> tuple[NDArray[np.float64], list[tuple[float, ...]]]:
    """Window starts and ``(rate, shape, weibull)`` rows of one trace CSV (the CV and the scale
    are not needed: the shape fixes the CV and the rescaling to the window cancels the scale)."""
    _, rows = read_csv(path, header=False)
    if len(rows[0][1]) != 6:
        raise WorkloadError(
            f"{rows[0][0]}: {len(rows[0][1])} fields, expected 6 "
            "(start_s, rate, cv, dist, shape, scale)"
        )
    starts = float_column(rows, 0, "start_s")
    rates = float_column(rows, 1, "rate")
    out = []
    for (where, fields), rate in zip(rows, rates, strict=True):
        dist = fields[3]
        if rate < 0:
            raise WorkloadError(f"{where}: field rate: {rate:g} is negative")
        if dist not in ("", "Gamma", "Weibull", "Exponential"):
            raise WorkloadError(f"{where}: field dist: unknown distribution {dist!r}")
        shape = parse_float(fields[4], where, "shape") if dist in ("Gamma", "Weibull") else 1.0
        if rate > 0 and shape <= 0:
            raise WorkloadError(f"{where}: field shape: {shape:g} is not positive")
        out.append((rate, shape, dist == "Weibull"))
    return starts, out


def _client_dataset(path: TracePath) -> list[tuple[int, tuple]]:
    """Sorted ``(window start, (input pdf, output pdf))`` of the non-empty dataset windows."""
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{display(path)}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise WorkloadError(f"{display(path)}: expected an object keyed by window start")
    windows = []
    for key, fields in data.items():
        where = f"{display(path)}: window {key}"
        start = parse_int(key, where, "window")
        if not isinstance(fields, dict) or any(f not in fields for f in _LENGTH_FIELDS):
            raise WorkloadError(f"{where}: expected fields {', '.join(_LENGTH_FIELDS)}")
        pdfs = tuple(_parse_pdf(fields[f], f"{where}: field {f}") for f in _LENGTH_FIELDS)
        if all(len(v) for v, _ in pdfs):  # ServeGen skips windows with an empty PDF
            windows.append((int(start), pdfs))
    return sorted(windows, key=lambda w: w[0])


def load_servegen(directory: TracePath, *, source: str = "") -> ServeGenPool:
    """The clients (``chunk-N-trace.csv`` + ``chunk-N-dataset.json``, either maybe gzipped)
    found in ``directory``."""
    folder = node(directory)
    if not folder.is_dir():
        raise WorkloadError(f"{display(directory)}: not a ServeGen data directory")
    found = {
        int(m.group(1)): child for child in folder.iterdir() if (m := _CHUNK.match(child.name))
    }
    if not found:
        raise WorkloadError(f"{display(directory)}: no chunk-N-trace.csv files")
    clients = sorted(found)
    grid, counts, shape, weib, group = None, [], [], [], []
    pdfs: list[tuple] = []
    for cid in clients:
        starts, rows = _client_trace(found[cid])
        if grid is None:
            grid = starts
            steps = np.diff(grid)
            if len(grid) < 2 or (steps <= 0).any() or len(set(steps.tolist())) > 1:
                raise WorkloadError(
                    f"{display(found[cid])}: needs two or more evenly spaced windows"
                )
        elif starts.shape != grid.shape or (starts != grid).any():
            raise WorkloadError(f"{display(found[cid])}: windows differ from client {clients[0]}'s")
        window = float(grid[1] - grid[0])
        ds_node = find_file(folder, f"chunk-{cid}-dataset.json")
        windows = _client_dataset(ds_node)
        ds_starts = np.array([w[0] for w in windows], dtype=np.float64)
        pos = np.searchsorted(ds_starts, grid, side="right") - 1
        n = np.rint(np.array([r[0] for r in rows]) * window).astype(np.int64)
        if ((pos < 0) & (n > 0)).any():
            k = int(np.flatnonzero((pos < 0) & (n > 0))[0])
            raise WorkloadError(
                f"{display(ds_node)}: no length data at or before window "
                f"{grid[k]:g} s, which has requests"
            )
        group.append(np.where(pos >= 0, pos + len(pdfs), -1))
        pdfs.extend(w[1] for w in windows)
        counts.append(n)
        shape.append([r[1] for r in rows])
        weib.append([r[2] for r in rows])
    return ServeGenPool(
        clients=np.array(clients, dtype=np.int64),
        window_s=window,
        counts=np.array(counts, dtype=np.int64),
        shape=np.array(shape, dtype=np.float64),
        weibull=np.array(weib, dtype=bool),
        group=np.array(group, dtype=np.int64),
        input_pdfs=LengthPdfs.stack([p[0] for p in pdfs]),
        output_pdfs=LengthPdfs.stack([p[1] for p in pdfs]),
        source=source or f"ServeGen data in {display(directory)}",
    )


def load_bundled_servegen() -> ServeGenPool:
    """The bundled ServeGen DeepSeek-R1 pool (73 clients, one day of 10-minute windows)."""
    return load_servegen(bundled_dir("servegen_deepseek_r1"), source=SERVEGEN_R1_SOURCE)
