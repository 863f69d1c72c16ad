"""Draw the dashboard's panels (``dashboard.PANELS``) from scraped ``/metrics`` samples.

Each target's local recipe is evaluated on the samples the way its PromQL would be in Grafana
(a rate is the counter's increase over a sliding window divided by the window; a quantile is
interpolated in the histogram's bucket increases over that window, as ``histogram_quantile``
does). Used by ``scrape_run.py``; the layout follows the panels' grid widths.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from dashboard import PANELS, Target

WINDOW_S = 15.0
_KEY = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _split(key: str) -> tuple[str, dict[str, str]]:
    m = _KEY.match(key)
    if m is None:
        return key, {}
    return m["name"], dict(_LABEL.findall(m["labels"] or ""))


def _series(samples: list[dict], name: str) -> dict[tuple, list[tuple[float, float]]]:
    """label set → [(t, value)] of metric ``name``."""
    out: dict[tuple, list[tuple[float, float]]] = {}
    for s in samples:
        for key, value in s["m"].items():
            n, labels = _split(key)
            if n == name:
                out.setdefault(tuple(sorted(labels.items())), []).append((s["t"], value))
    return out


def _windowed(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(t, increase over the last WINDOW_S / WINDOW_S) for each sample with a full window."""
    out, j = [], 0
    for t, v in points:
        while points[j][0] < t - WINDOW_S:
            j += 1
        t0, v0 = points[max(j - 1, 0)]
        if t - t0 >= WINDOW_S * 0.8:
            out.append((t, max(v - v0, 0.0) / (t - t0)))
    return out


def _quantile(samples: list[dict], hist: str, q: float) -> list[tuple[float, float]]:
    buckets: dict[float, list[tuple[float, float]]] = {}
    for labels, pts in _series(samples, hist + "_bucket").items():
        le = dict(labels).get("le")
        if le is not None:
            buckets[float(le)] = _windowed(pts)
    bounds = sorted(buckets)
    if not bounds:
        return []
    out = []
    for i, (t, _) in enumerate(buckets[bounds[0]]):
        counts = [buckets[b][i][1] for b in bounds]
        total = counts[-1]
        if total <= 0:
            continue
        rank, prev_b, prev_c = q * total, 0.0, 0.0
        for b, c in zip(bounds, counts, strict=True):
            if c >= rank:
                if math.isinf(b):
                    value = prev_b
                else:
                    value = prev_b + (b - prev_b) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 0)
                out.append((t, value))
                break
            prev_b, prev_c = b, c
    return out


def evaluate(samples: list[dict], target: Target) -> list[tuple[str, list[tuple[float, float]]]]:
    """The target's lines: (legend, [(t, value)])."""
    if target.local[0] == "none":  # not drawn in the screenshot (a table value in Grafana)
        return []
    kind, name = target.local[0], target.local[1]
    if kind == "gauge":
        pts = [p for s in _series(samples, name).values() for p in s]
        return [(target.legend, sorted(pts))]
    if kind == "gauge_sum":
        acc: dict[float, float] = {}
        for pts in _series(samples, name).values():
            for t, v in pts:
                acc[t] = acc.get(t, 0.0) + v
        return [(target.legend, sorted(acc.items()))]
    if kind == "per_replica":
        lines = []
        for labels, pts in sorted(_series(samples, name).items(), key=lambda kv: int(dict(kv[0]).get("replica", 0))):
            lines.append((target.legend.replace("{{replica}}", dict(labels).get("replica", "?")), pts))
        return lines
    if kind == "rate":
        acc = {}
        for pts in _series(samples, name).values():
            for t, v in _windowed(pts):
                acc[t] = acc.get(t, 0.0) + v
        return [(target.legend, sorted(acc.items()))]
    if kind == "rate_by":
        label = target.local[2]
        groups: dict[str, dict[float, float]] = {}
        for labels, pts in _series(samples, name).items():
            g = groups.setdefault(dict(labels).get(label, ""), {})
            for t, v in _windowed(pts):
                g[t] = g.get(t, 0.0) + v
        return [(target.legend.split("{{")[0] + key if "{{" in target.legend else target.legend,
                 sorted(v.items())) for key, v in sorted(groups.items())]
    if kind == "rate_where":
        label, value = target.local[2], target.local[3]
        acc = {}
        for labels, pts in _series(samples, name).items():
            if dict(labels).get(label) == value:
                for t, v in _windowed(pts):
                    acc[t] = acc.get(t, 0.0) + v
        return [(target.legend, sorted(acc.items()))]
    if kind == "quantile":
        return [(target.legend, _quantile(samples, name, target.local[2]))]
    raise ValueError(f"unknown local recipe {kind!r}")


_SCALE = {"percentunit": (100.0, "%"), "s": (1.0, "s"), "reqps": (1.0, "req/s"), "short": (1.0, ""),
          "none": (1.0, "")}


def render(samples: list[dict], out: str | Path, *, title: str) -> Path:
    """Draw every panel of :data:`dashboard.PANELS` into one PNG (dark, like Grafana's default)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: list[list] = [[]]
    for p in PANELS:
        if sum(q.width for q in rows[-1]) + p.width > 24:
            rows.append([])
        rows[-1].append(p)
    plt.style.use("dark_background")
    fig = plt.figure(figsize=(15, 3.0 * len(rows) + 0.6), dpi=100)
    gs = fig.add_gridspec(len(rows), 24, hspace=0.55, wspace=4.0, top=1 - 0.7 / fig.get_figheight())
    for r, row in enumerate(rows):
        x = 0
        for p in row:
            ax = fig.add_subplot(gs[r, x:x + p.width])
            x += p.width
            scale, suffix = _SCALE.get(p.unit, (1.0, ""))
            if "per KV token" in p.title:  # seconds per token: read in µs
                scale, suffix = 1e6, "µs per token"
            for t in p.targets:
                for legend, pts in evaluate(samples, t):
                    if not pts:
                        continue
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(xs, [y * scale for y in ys], lw=1.2, label=legend)
            ax.set_title(p.title, fontsize=10, loc="left")
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.2)
            if suffix:
                ax.set_ylabel(suffix, fontsize=9)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7, loc="upper left", ncol=2, framealpha=0.4)
            else:
                ax.text(0.5, 0.5, "no events in this run", transform=ax.transAxes, ha="center",
                        va="center", fontsize=9, alpha=0.7)
            if r == len(rows) - 1:
                ax.set_xlabel("seconds into the run", fontsize=9)
    fig.suptitle(title, fontsize=11, y=1 - 0.15 / fig.get_figheight())
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)
    return out
