"""The reproduction's figures: one PNG per claim, drawn only from the experiment CSVs' rows.

Each ``fig_*`` function takes rows (as read back by :func:`~.sweep.read_csv`) and a path, draws
with matplotlib's Agg backend and returns the path, or ``None`` when the rows hold nothing to
draw. Paper values (:mod:`.paper`) are drawn as hollow black-edged markers next to ours.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import paper, tables, theory

__all__ = [
    "FIGURES",
    "MAX_WIDTH_IN",
    "MIN_FONT_PT",
    "STYLE",
    "STYLE_VERSION",
    "draw_figure",
    "fig_quality_seeds",
    "fig_ttft_pareto",
    "figure_stamp",
    "fig_balls_into_bins",
    "fig_clairvoyant_gap",
    "fig_competitive_ratio",
    "fig_extreme_value",
    "fig_scaling_gain",
    "fig_scaling_imbalance",
    "fig_slots",
    "fig_step_model",
    "fig_table1_gain",
    "fig_table1_imbalance",
    "fig_tick_gap",
    "fig_tick_latency",
    "fig_tick_stages",
]

LABEL = {
    "random": "Random", "round_robin": "Round-robin", "power_of_two": "Power-of-two",
    "jsq": "JSQ", "least_load": "Least-load", "br0": "BR-0", "brh-survival": "BR-H (survival)",
    "brh-exact": "BR-H (exact match)", "brh-learned": "BR-H (learned)",
    "brh-oracle": "BR-H (oracle)",
}
COLOR = {
    "random": "#9e9e9e", "round_robin": "#8c564b", "power_of_two": "#e6ab02", "jsq": "#d95f02",
    "least_load": "#c51b7d", "br0": "#1b9e77", "brh-survival": "#7570b3", "brh-exact": "#66a61e",
    "brh-learned": "#17becf", "brh-oracle": "#1f78b4", "bfio-h0": "#a6761d",
    "bfio-h0-lease": "#e7298a", "bfio": "#666666",
}
MARKER = {"random": "x", "round_robin": "+", "power_of_two": "^", "jsq": "s", "least_load": "v",
          "br0": "o", "brh-survival": "D", "brh-exact": "P", "brh-learned": "*", "brh-oracle": "h",
          "bfio-h0": "<", "bfio-h0-lease": ">", "bfio": "X"}

STYLE: dict[str, Any] = {
    "figure.dpi": 150, "savefig.dpi": 150, "font.size": 9, "axes.titlesize": 10,
    "axes.labelsize": 9, "xtick.labelsize": 8, "ytick.labelsize": 8, "legend.fontsize": 8,
    "figure.titlesize": 10, "axes.grid": True, "grid.alpha": 0.3, "legend.framealpha": 0.85,
    "savefig.facecolor": "white",
}
"""The one matplotlib style of every figure (150 dpi; body text 9 pt)."""
MIN_FONT_PT = 8.0
"""No text in a figure is smaller: :func:`_save` raises smaller text to it. At 150 dpi and at most
:data:`MAX_WIDTH_IN` wide, 8 pt stays ≥ 10 px when a page shows the figure 1,000 px wide."""
MAX_WIDTH_IN = 10.5
"""The widest figure (inches); wider ones are scaled down on a page until their text is unreadable."""
STYLE_VERSION = "2"
"""Bumped when :data:`STYLE` or the layout rules change: a figure stamped with another version
was drawn before (``tests/analysis/test_figures_front.py``)."""

_SOURCE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("figure_source", default=None)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(STYLE)
    return plt


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _save(fig, path: str | Path, *, layout: bool = True) -> Path:
    """Lay out, raise any text below :data:`MIN_FONT_PT`, stamp (:func:`figure_stamp`) and write."""
    from matplotlib.text import Text

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    for text in fig.findobj(Text):
        if text.get_text() and text.get_fontsize() < MIN_FONT_PT:
            text.set_fontsize(MIN_FONT_PT)
    if layout:
        fig.tight_layout()
    width_in = fig.get_figwidth()
    if width_in > MAX_WIDTH_IN + 1e-9:
        raise ValueError(f"{width_in=} must be <= MAX_WIDTH_IN={MAX_WIDTH_IN} ({out.name})")
    stamp = {"style": STYLE_VERSION, "min_font_pt": MIN_FONT_PT, **(_SOURCE.get() or {})}
    fig.savefig(out, metadata={"balanceroute": json.dumps(stamp, sort_keys=True)})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return out


def figure_stamp(path: str | Path) -> dict:
    """The stamp :func:`_save` wrote into a PNG: ``style``, ``min_font_pt`` and, when drawn by
    :func:`draw_figure`, ``source`` (the CSV's file name) and ``sha256`` (its first 16 hex
    digits); ``{}`` for a PNG without one."""
    from PIL import Image

    with Image.open(path) as im:
        raw = im.info.get("balanceroute") or (getattr(im, "text", {}) or {}).get("balanceroute")
    return json.loads(raw) if raw else {}


def draw_figure(name: str, csv_path: str | Path, out_path: str | Path) -> Path | None:
    """Draw figure ``name`` of :data:`FIGURES` from the CSV at ``csv_path`` into ``out_path``,
    stamped with that CSV's name and hash (so a test can tell a figure from an older CSV)."""
    from .sweep import read_csv

    csv_path = Path(csv_path)
    _, draw = FIGURES[name]
    token = _SOURCE.set({"source": csv_path.name, "sha256": _file_sha256(csv_path)})
    try:
        return draw(read_csv(csv_path), out_path)
    finally:
        _SOURCE.reset(token)


def _legend_below(fig, ax, ncol: int = 4) -> None:
    """One legend for the figure, under the panels (so it never hides data)."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=ncol, frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.06 + 0.045 * math.ceil(len(labels) / ncol), 1, 1))


def _order(names: Sequence[str]) -> list[str]:
    rank = {p: i for i, p in enumerate(LABEL)}
    return sorted(set(names), key=lambda p: (rank.get(p, 99), p))


def _log2_axis(ax, values: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(values))
    ax.set_xticklabels([str(v) for v in values])
    ax.minorticks_off()


# ------------------------------------------------------------------------------ Table 1


def fig_table1_imbalance(rows: Sequence[dict], path: str | Path) -> Path | None:
    """Mean imbalance per policy and workload at G = 8 (log scale), the paper's two datasets
    as hollow markers next to their stand-ins."""
    if not rows:
        return None
    plt = _plt()
    summary = tables.policy_summary(rows, by=("workload",))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    policies = _order(r["policy"] for r in summary)
    fig, ax = plt.subplots(figsize=(8.0, 4.2))
    width = 0.8 / len(policies)
    for j, p in enumerate(policies):
        xs, ys = [], []
        for i, w in enumerate(workloads):
            rec = next((r for r in summary if r["workload"] == w and r["policy"] == p), None)
            if rec is not None:
                xs.append(i + (j - (len(policies) - 1) / 2) * width)
                ys.append(rec["mean_imbalance"])
        ax.bar(xs, ys, width=width, color=COLOR.get(p), label=LABEL.get(p, p))
        for i, w in enumerate(workloads):
            ds = next((d for d, wl in paper.DATASET_WORKLOAD.items() if wl == w), None)
            prow = paper.paper_row(paper.TABLE1, dataset=ds, policy=p) if ds else None
            if prow is not None:
                ax.plot(i + (j - (len(policies) - 1) / 2) * width, prow["mean_imbalance"], "o",
                        mfc="none", mec="black", ms=4)
    ax.set_yscale("log")
    _table1_axes(ax, rows, workloads, "mean imbalance I (tokens, log scale)",
                 "Barrier imbalance at G = {g}, B = {b}, a = {a:g} µs/token: ours (bars), paper (markers)")
    return _save(fig, path)


def _table1_axes(ax: Any, rows: Sequence[dict], workloads: list[str], ylabel: str, title: str) -> None:
    """The shared frame of the Table-1 bar charts: the paper-marker legend entry, one tick per
    workload, labels and the legend; ``title`` is formatted with the rows' G, B and a (µs)."""
    ax.plot([], [], "o", mfc="none", mec="black", ms=4, label="paper (same row)")
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels([_workload_label(w) for w in workloads])
    ax.set_ylabel(ylabel)
    ax.set_title(title.format(g=rows[0]["replicas"], b=rows[0]["slots"], a=1e6 * float(rows[0]["step_a"])),
                 fontsize=9)
    ax.legend(ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.12))


def _workload_label(w: str) -> str:
    ds = next((d for d, wl in paper.DATASET_WORKLOAD.items() if wl == w), None)
    return f"{w}\n(paper: {ds})" if ds else w


def fig_table1_gain(rows: Sequence[dict], path: str | Path) -> Path | None:
    """Throughput gain over JSQ per policy and workload at G = 8, paper's gains as markers."""
    if not rows:
        return None
    plt = _plt()
    summary = tables.policy_summary(rows, by=("workload",))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    policies = [p for p in _order(r["policy"] for r in summary) if p != "jsq"]
    fig, ax = plt.subplots(figsize=(8.0, 4.2))
    width = 0.8 / len(policies)
    for j, p in enumerate(policies):
        for i, w in enumerate(workloads):
            rec = next((r for r in summary if r["workload"] == w and r["policy"] == p), None)
            x = i + (j - (len(policies) - 1) / 2) * width
            if rec is not None:
                ax.bar(x, rec["gain_vs_jsq_pct"], width=width, color=COLOR.get(p),
                       yerr=rec["gain_vs_jsq_pct_sd"] if rec["seeds"] > 1 else None,
                       error_kw={"lw": 0.6, "capsize": 1.5},
                       label=LABEL.get(p, p) if i == 0 else None)
            ds = next((d for d, wl in paper.DATASET_WORKLOAD.items() if wl == w), None)
            prow = paper.paper_row(paper.TABLE1, dataset=ds, policy=p) if ds else None
            jsq = paper.paper_row(paper.TABLE1, dataset=ds, policy="jsq") if ds else None
            if prow is not None and jsq is not None:
                ax.plot(x, 100 * (prow["throughput_tok_s"] / jsq["throughput_tok_s"] - 1), "o",
                        mfc="none", mec="black", ms=4)
    ax.axhline(0, color="black", lw=0.8)
    _table1_axes(ax, rows, workloads, "throughput gain over JSQ (%)",
                 "Throughput gain over JSQ at G = {g}, B = {b}, a = {a:g} µs/token (bars: ours, markers: paper)")
    return _save(fig, path)


# ------------------------------------------------------------------------------ scaling


def _scaling_panel(ax, summary: list[dict], workload: str, key: str, policies: Sequence[str],
                   paper_key: str | None) -> None:
    gs = sorted({r["replicas"] for r in summary if r["workload"] == workload})
    for p in policies:
        pts = sorted((r["replicas"], r[key], r[f"{key}_sd"] if r["seeds"] > 1 else 0.0)
                     for r in summary if r["workload"] == workload and r["policy"] == p)
        if pts:
            g, y, sd = zip(*pts, strict=True)
            ax.errorbar(g, y, yerr=sd if any(sd) else None, marker=MARKER.get(p, "o"),
                        color=COLOR.get(p), label=LABEL.get(p, p), ms=4, lw=1.2, capsize=2)
        if paper_key and workload == paper.DATASET_WORKLOAD["proprietary"]:
            pp = [(r["replicas"], r[paper_key]) for r in paper.TABLE2 if r["policy"] == p]
            if pp:
                ax.plot(*zip(*pp, strict=False), ls="none", marker=MARKER.get(p, "o"), mfc="none",
                        mec=COLOR.get(p), mew=1.6, ms=9)
    _log2_axis(ax, gs)
    ax.set_xlabel("decode replicas G (log scale)")
    ax.set_title(workload)


def _scaling_figure(rows: Sequence[dict], path: str | Path, metric: str, ylabel: str, title: str,
                    *, skip: str | None = None, log: bool = False) -> Path | None:
    """One panel per workload of ``metric`` versus G per policy (less ``skip``), ours as lines
    and the paper's as hollow markers; ``log``: a log y axis, else a zero line."""
    if not rows:
        return None
    plt = _plt()
    summary = tables.policy_summary(rows, by=("workload", "replicas"))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    policies = [p for p in _order(r["policy"] for r in summary) if p != skip]
    fig, axes = plt.subplots(1, len(workloads), figsize=(max(6.4, 5.0 * len(workloads)), 4.4), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=False):
        _scaling_panel(ax, summary, w, metric, policies, metric)
        if log:
            ax.set_yscale("log")
        else:
            ax.axhline(0, color="black", lw=0.8)
        ax.set_ylabel(ylabel)
    axes[0][0].plot([], [], "o", mfc="none", mec="black", mew=1.6, ms=9,
                    label="paper, same policy (proprietary data)")
    fig.suptitle(title, fontsize=10)
    _legend_below(fig, axes[0][0])
    return _save(fig, path, layout=False)


def fig_scaling_imbalance(rows: Sequence[dict], path: str | Path) -> Path | None:
    """Mean imbalance versus G (log–log) per policy, the paper's G = 4/8/16 points hollow."""
    return _scaling_figure(
        rows, path, "mean_imbalance", "mean imbalance I (tokens, log scale)",
        "Imbalance versus cluster size (mean over the loaded phase, ± sd over seeds)", log=True)


def fig_scaling_gain(rows: Sequence[dict], path: str | Path) -> Path | None:
    """Throughput gain over JSQ versus G, ours (lines) and the paper's (hollow markers)."""
    return _scaling_figure(
        rows, path, "gain_vs_jsq_pct", "throughput gain over JSQ (%)",
        "Throughput gain over JSQ versus cluster size (loaded phase, ± sd over seeds)", skip="jsq")


# ------------------------------------------------------------------------------ theory


def fig_extreme_value(rows: Sequence[dict], path: str | Path) -> Path | None:
    """Per-replica gap I/G = max_g L_g − L̄ versus G for the baselines and BR-0, with the
    independent-loads prediction σ̂·e_G (σ̂ from Random at G ≤ 8) and its √(2 ln G) form."""
    if not rows:
        return None
    plt = _plt()
    summary = tables.policy_summary(rows, by=("workload", "replicas"))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    policies = [p for p in _order(r["policy"] for r in summary) if not p.startswith("brh")]
    fig, axes = plt.subplots(1, len(workloads), figsize=(max(6.4, 5.0 * len(workloads)), 4.4), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=False):
        gs = sorted({r["replicas"] for r in summary if r["workload"] == w})
        for p in policies:
            pts = sorted((r["replicas"], r["mean_imbalance"] / r["replicas"]) for r in summary
                         if r["workload"] == w and r["policy"] == p)
            ax.plot(*zip(*pts, strict=False), marker=MARKER.get(p, "o"), color=COLOR.get(p), ms=4, lw=1.0,
                    label=LABEL.get(p, p))
        sigma = tables.sigma_estimate(rows, workload=w)
        if math.isfinite(sigma):
            grid = np.unique(np.geomspace(min(gs), max(gs), 60).astype(int))
            ax.plot(grid, [sigma * theory.expected_max_normal(int(g)) for g in grid], "k-", lw=1.6,
                    label=r"$\hat\sigma_L\,e_G$ (independent loads)")
            ax.plot(grid, sigma * np.sqrt(2 * np.log(grid)), "k:", lw=1.2,
                    label=r"$\hat\sigma_L\sqrt{2\ln G}$")
        _log2_axis(ax, gs)
        ax.set_xlabel("decode replicas G (log scale)")
        ax.set_ylabel("per-replica gap I/G = max L − mean L (tokens)")
        ax.set_title(f"{w}  ($\\hat\\sigma_L$ = {sigma:,.0f} tokens)")
    fig.suptitle("Extreme-value scaling of the per-replica gap", fontsize=10)
    _legend_below(fig, axes[0][0])
    return _save(fig, path, layout=False)


def fig_balls_into_bins(rows: Sequence[dict], path: str | Path) -> Path | None:
    """Monte Carlo maximum load of n balls in n bins, one vs two choices, with the leading
    terms ln n / ln ln n and ln ln n / ln 2 shifted by a fitted constant."""
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for d, color, formula, label in (
        (1, "#d95f02", theory.one_choice_max_load, r"$\ln n/\ln\ln n$ + c"),
        (2, "#1b9e77", theory.two_choice_max_load, r"$\ln\ln n/\ln 2$ + c"),
    ):
        by_n: dict[int, list[float]] = {}
        for r in rows:
            if int(r["choices"]) == d:
                by_n.setdefault(int(r["bins"]), []).append(float(r["max_load"]))
        ns = np.array(sorted(by_n))
        mean = np.array([np.mean(by_n[n]) for n in ns])
        sd = np.array([np.std(by_n[n]) for n in ns])
        ax.errorbar(ns, mean, yerr=sd, fmt="o", color=color, ms=4, capsize=2,
                    label=f"{d} choice{'s' if d > 1 else ''} (simulated, mean ± sd)")
        ok = ns >= 3
        lead = np.asarray(formula(ns[ok]), dtype=float)
        c = float(np.mean(mean[ok] - lead))
        grid = np.geomspace(max(3, ns.min()), ns.max(), 100)
        ax.plot(grid, np.asarray(formula(grid)) + c, "-", color=color, lw=1.2,
                label=f"{label} (c = {c:+.2f})")
    _log2_axis(ax, [int(n) for n in sorted({int(r['bins']) for r in rows})][::2])
    ax.set_xlabel("bins n = balls m (log scale)")
    ax.set_ylabel("maximum bin load (balls)")
    ax.set_title("Balls into bins: two choices flatten the maximum load")
    ax.legend(loc="upper left")
    return _save(fig, path)


# ------------------------------------------------------------------------------ ticks


def fig_tick_latency(rows: Sequence[dict], path: str | Path) -> Path | None:
    """Whole-tick latency P50 and P99 versus G at the default pool 2G (BR-0, re-timed states;
    BR-H live, if present), with the paper's G = 8 values and the 60 ms decode step."""
    sel = [r for r in rows if r["regime"] == "all"
           and int(r["pool_size"]) == 2 * int(r["replicas"]) and (
               (r["policy"] == "br0" and r["measure"] == "whole")
               or (r["policy"] != "br0" and r["measure"] == "live"))]
    if not sel:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    combos = sorted({(r["policy"], int(r["pool_size"]) // int(r["replicas"])) for r in sel},
                    key=lambda c: (c[0] != "br0", c[0], c[1]))
    shades = {1: 0.45, 2: 1.0, 4: 0.7}
    for p, f in combos:
        pts = sorted((r["replicas"], r["p50_us"] / 1e3, r["p99_us"] / 1e3) for r in sel
                     if r["policy"] == p and int(r["pool_size"]) // int(r["replicas"]) == f)
        g, p50, p99 = zip(*pts, strict=False)
        how = "re-timed" if p == "br0" else "live"
        kw = {"color": COLOR.get(p), "alpha": shades.get(f, 1.0), "ms": 4}
        ax.plot(g, p50, "-", marker="o", label=f"{LABEL.get(p, p)} ({how}), pool {f}G: P50", **kw)
        ax.plot(g, p99, "--", marker="^", label=f"{LABEL.get(p, p)} ({how}), pool {f}G: P99", **kw)
    t = paper.TICK_OVERHEAD
    ax.plot([t["replicas"]], [t["tick_p50_ms"]], "o", mfc="none", mec="black", ms=9,
            label=f"paper P50 {t['tick_p50_ms']} ms (G = 8)")
    ax.plot([t["replicas"]], [t["tick_p99_ms"]], "^", mfc="none", mec="black", ms=9,
            label=f"paper P99 {t['tick_p99_ms']} ms (G = 8)")
    ax.axhline(t["decode_step_ms"], color="red", lw=1.0, ls=":", label="60 ms decode step")
    _log2_axis(ax, sorted({r["replicas"] for r in sel}))
    ax.set_yscale("log")
    ax.set_xlabel("decode replicas G (log scale)")
    ax.set_ylabel("scheduling tick latency (ms, log scale)")
    ax.set_title("Scheduling tick latency on states from saturated runs (pool 2G, one thread)",
                 fontsize=9)
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    return _save(fig, path)


def fig_tick_stages(rows: Sequence[dict], path: str | Path) -> Path | None:
    """Stage 1 (greedy pick, per placed request) against Stage 2 (subset search, per tick and
    per placed request) on the same recorded states, BR-0, pool 2G, versus G."""
    sel = [r for r in rows if r["policy"] == "br0" and r["regime"] == "all"
           and int(r["pool_size"]) == 2 * int(r["replicas"])
           and r["measure"] in ("stage1_only", "stage2_only", "whole")]
    if not sel:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 5.0))
    spec = (("stage1_only", "per_request_p50_us", "Stage 1 only: per placed request", "#1b9e77", "-"),
            ("stage2_only", "per_request_p50_us", "Stage 2 only: per placed request", "#d95f02", "-"),
            ("stage2_only", "p50_us", "Stage 2 only: per tick", "#d95f02", "--"),
            ("whole", "p50_us", "whole tick (S_greedy = 8): per tick", "black", ":"))
    for measure, key, label, color, ls in spec:
        pts = sorted((r["replicas"], r[key]) for r in sel if r["measure"] == measure)
        if pts:
            ax.plot(*zip(*pts, strict=False), ls, marker="o", color=color, ms=4, label=f"{label} (P50)")
    t = paper.TICK_OVERHEAD
    ax.plot([t["replicas"]], [t["stage1_p50_us_max"]], "v", mfc="none", mec="#1b9e77", ms=8,
            label="paper Stage 1 < 1.2 µs")
    ax.plot([t["replicas"]], [t["stage2_p50_us"]], "s", mfc="none", mec="#d95f02", ms=8,
            label="paper Stage 2 ≈ 924 µs")
    _log2_axis(ax, sorted({r["replicas"] for r in sel}))
    ax.set_yscale("log")
    ax.set_xlabel("decode replicas G (log scale)")
    ax.set_ylabel("latency P50 (µs, log scale)")
    ax.set_title("Where a tick's time goes: Stage 1 vs Stage 2 (BR-0, pool 2G)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    return _save(fig, path)


# ------------------------------------------------------------------------------ step model


def fig_step_model(rows: Sequence[dict], path: str | Path) -> Path | None:
    """Throughput gain over the best baseline versus the load-dependent share of the step,
    measured (markers) and predicted from the default model's envelopes (lines)."""
    if not rows:
        return None
    plt = _plt()
    summary = tables.step_model_summary(rows)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for p in [p for p in _order(r["policy"] for r in summary) if p not in tables.BASELINES]:
        pts = sorted((r["load_share"], r["gain_vs_best_baseline_pct"], r["predicted_gain_pct"])
                     for r in summary if r["policy"] == p)
        x, y, pred = zip(*pts, strict=False)
        ax.plot(x, y, "o", color=COLOR.get(p), ms=5, label=f"{LABEL.get(p, p)} (simulated)")
        ax.plot(x, pred, "-", color=COLOR.get(p), lw=1.0, label=f"{LABEL.get(p, p)} (predicted)")
    default = [r for r in summary if r["a_over_b_rel"] == 1.0 and r["policy"] == "br0"]
    if default:
        ax.axvline(default[0]["load_share"], color="grey", lw=0.8, ls="--",
                   label="default step model (b = 30 ms, a = 0.2 µs/token)")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel(r"load-dependent share of the step $a\bar M/(b + a\bar M)$ (best baseline)")
    ax.set_ylabel("throughput gain over the best baseline (%)")
    ax.set_title(r"The gain is set by the step model: $\tau = b + a\,M$")
    ax.legend(fontsize=8, loc="upper left")
    return _save(fig, path)


def fig_slots(rows: Sequence[dict], path: str | Path) -> Path | None:
    """Imbalance cut versus JSQ (left) and throughput gain over the best baseline (right)
    versus the slots per replica B, for BR-0 and BR-H (oracle)."""
    if not rows:
        return None
    plt = _plt()
    summary = tables.policy_summary(rows, by=("slots",))
    bs = sorted({r["slots"] for r in summary})
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 3.8))
    for p in [p for p in _order(r["policy"] for r in summary) if p not in tables.BASELINES]:
        pts = sorted((r["slots"], r["imbalance_vs_jsq"], r["gain_vs_best_baseline_pct"])
                     for r in summary if r["policy"] == p)
        b, cut, gain = zip(*pts, strict=True)
        left.plot(b, cut, "-", marker=MARKER.get(p, "o"), color=COLOR.get(p), label=LABEL.get(p, p))
        right.plot(b, gain, "-", marker=MARKER.get(p, "o"), color=COLOR.get(p), label=LABEL.get(p, p))
    for ax in (left, right):
        _log2_axis(ax, bs)
        ax.set_xlabel("slots per replica B (log scale)")
    left.set_ylabel("mean imbalance of JSQ / of the policy (×)")
    right.set_ylabel("throughput gain over the best baseline (%)")
    right.axhline(0, color="black", lw=0.8)
    left.set_title("Imbalance cut vs JSQ", fontsize=9)
    right.set_title("Throughput gain (default step model)", fontsize=9)
    left.legend(loc="best")
    fig.suptitle("Sensitivity to the slots per replica (G = 8)", fontsize=10)
    return _save(fig, path)


# ------------------------------------------------------------------------------ optimality


def fig_tick_gap(rows: Sequence[dict], path: str | Path) -> Path | None:
    """Empirical CDF of the per-tick gap to the exact optimum as a share of the barrier
    capacity G·M, per policy, one panel per tick source × objective."""
    if not rows:
        return None
    plt = _plt()
    panels = sorted({(r["source"], r["workload"] or "", r["objective"]) for r in rows})
    ncol = 2 if len(panels) > 1 else 1
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.4 * nrow), squeeze=False,
                             sharey=True)
    floor = 1e-7
    for ax, (src, wl, obj) in zip(axes.ravel(), panels, strict=False):
        sel = [r for r in rows if r["source"] == src and (r["workload"] or "") == wl
               and r["objective"] == obj]
        for p in _order(r["policy"] for r in sel):
            gaps = np.sort([float(r["capacity_gap"]) for r in sel if r["policy"] == p
                            and r["capacity_gap"] is not None
                            and math.isfinite(float(r["capacity_gap"]))])
            if gaps.size:
                x = np.concatenate([[floor], np.maximum(gaps, floor)])
                y = np.concatenate([[0.0], np.arange(1, gaps.size + 1) / gaps.size])
                ax.step(x, y, where="post", color=COLOR.get(p), label=LABEL.get(p, p), lw=1.4)
        ax.set_xscale("log")
        ax.set_xlim(floor / 2, None)
        ax.set_xlabel(f"gap / (G·M) at the tick (log; 0 drawn at {floor:g})")
        ax.set_title(f"{src} ticks{' (' + wl + ')' if wl else ''}, objective: {obj}, "
                     f"G = {'/'.join(str(g) for g in sorted({r['replicas'] for r in sel}))}",
                     fontsize=8.5)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("share of ticks with gap ≤ x")
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.suptitle("Per-tick gap to the exact optimum (CP-SAT), as a share of barrier capacity",
                 fontsize=10)
    return _save(fig, path)


def fig_clairvoyant_gap(rows: Sequence[dict], path: str | Path) -> Path | None:
    """Relative gap of each policy's Σ_k I(k) to the clairvoyant schedule, per episode."""
    if not rows:
        return None
    plt = _plt()
    policies = _order(r["policy"] for r in rows)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    data = [[100.0 * float(r["rel_gap"]) for r in rows if r["policy"] == p] for p in policies]
    ax.boxplot(data, showfliers=False)
    for i, vals in enumerate(data, start=1):
        ax.plot(np.full(len(vals), i) + np.linspace(-0.12, 0.12, len(vals)), vals, "o",
                color=COLOR.get(policies[i - 1]), ms=3, alpha=0.7)
    ax.set_xticks(range(1, len(policies) + 1))
    ax.set_xticklabels([LABEL.get(p, p) for p in policies])
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel("Σ_k I(k) above the clairvoyant schedule (%)")
    ax.set_title("Multi-step (clairvoyant) gap, one point per episode")
    return _save(fig, path)


def fig_competitive_ratio(rows: Sequence[dict], path: str | Path) -> Path | None:
    """Worst and mean online/clairvoyant ratio of Σ_k M(k) per G, against 2 − 1/G."""
    if not rows:
        return None
    plt = _plt()
    summary = tables.ratio_summary(rows)
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    gs = sorted({r["replicas"] for r in summary})
    for p in _order(r["policy"] for r in summary):
        pts = sorted((r["replicas"], r["worst_ratio"], r["mean_ratio"]) for r in summary
                     if r["policy"] == p)
        g, worst, mean = zip(*pts, strict=False)
        ax.plot(g, worst, "-", marker=MARKER.get(p, "o"), color=COLOR.get(p), ms=5,
                label=f"{LABEL.get(p, p)}: worst")
        ax.plot(g, mean, ":", marker=MARKER.get(p, "o"), color=COLOR.get(p), ms=3, alpha=0.6)
    ax.plot(gs, theory.online_temporary_tasks_bound(np.array(gs)), "k-", marker="s", lw=1.6,
            label="2 − 1/G (peak-load bound, Azar–Epstein)")
    ax.plot([], [], "k:", label="dotted: mean ratio")
    ax.set_ylim(0.98, float(theory.online_temporary_tasks_bound(max(gs))) + 0.05)
    ax.set_xticks(gs)
    ax.set_xlabel("replicas G")
    ax.set_ylabel("online / clairvoyant  Σ_k M(k)")
    ax.set_title("Worst ratios found on small exact instances vs 2 − 1/G")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3)
    return _save(fig, path)


# ------------------------------------------------------------------------------ quality and TTFT


def _knob(value: Any) -> float:
    """``ttft_slo_s`` as a number for ordering: off (no soft deadline) after every value."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.inf


def _knob_label(value: Any) -> str:
    x = _knob(value)
    return "off" if math.isinf(x) else f"{x:g} s"


def _place_labels(fig, ax, labels: list[tuple[float, float, str, str]]) -> None:
    """Write each (x, y, text, colour) next to its point, moving a label right until it is clear
    of those already placed (display coordinates, one 8-pt line high)."""
    fig.canvas.draw()
    placed: list[tuple[float, float, float]] = []
    height = MIN_FONT_PT * fig.dpi / 72
    for x, y, text, colour in sorted(labels, key=lambda lab: (-lab[1], lab[0])):
        px, py = ax.transData.transform((x, y))
        width = 0.6 * height * len(text)
        dx = 5.0
        while any(abs(py - qy) < height and px + dx < qx + qw and qx < px + dx + width
                  for qx, qy, qw in placed):
            dx += 0.75 * height
        placed.append((px + dx, py, width))
        ax.annotate(text, (x, y), textcoords="offset pixels", xytext=(dx, -0.35 * height),
                    fontsize=MIN_FONT_PT, color=colour,
                    arrowprops={"arrowstyle": "-", "color": colour, "lw": 0.5, "alpha": 0.6,
                                "shrinkA": 0, "shrinkB": 3} if dx > 10 else None)


def fig_ttft_pareto(rows: Sequence[dict], path: str | Path) -> Path | None:
    """TTFT P99 against mean imbalance, one panel per workload: each BR policy a line through
    its ``ttft_slo_s`` settings, every point labelled with its setting; the baselines one
    labelled point each."""
    if not rows:
        return None
    plt = _plt()
    workloads = sorted({r["workload"] for r in rows})
    ncol = min(len(workloads), 3)
    nrow = math.ceil(len(workloads) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(min(MAX_WIDTH_IN, 3.5 * ncol), 3.6 * nrow + 0.5),
                             squeeze=False)
    for ax, w in zip(axes.ravel(), workloads, strict=False):
        mine = [r for r in rows if r["workload"] == w]
        lines = {p: sorted(((_knob(r.get("ttft_slo_s")), float(r["ttft_s_p99"]),
                             float(r["mean_imbalance"]) / 1e3, r.get("ttft_slo_s"))
                            for r in mine if r["policy"] == p), key=lambda t: t[0])
                 for p in _order(r["policy"] for r in mine)}
        knobbed = [y for pts in lines.values() if len(pts) > 1 for *_, y, _ in pts]
        top = 1.35 * max(knobbed) if knobbed else math.inf
        shown = [t[2] for pts in lines.values() for t in pts if t[2] <= top]
        if shown:
            ax.set_ylim(0.85 * min(shown), top if knobbed else 1.15 * max(shown))
        off_scale, labels = [], []
        for p, pts in lines.items():
            xs, ys = [t[1] for t in pts], [t[2] for t in pts]
            if len(pts) > 1:  # a BR row: a line through its knob settings, each labelled
                ax.plot(xs, ys, "-", marker=MARKER.get(p, "o"), color=COLOR.get(p), ms=5, lw=1.2,
                        label=LABEL.get(p, p))
                labels += [(t[1], t[2], _knob_label(t[3]), COLOR.get(p, "black")) for t in pts]
            elif ys[0] > top:  # a baseline far above the BR rows: named in the corner
                off_scale.append(f"{LABEL.get(p, p)}: {ys[0]:,.0f}k at {xs[0]:.1f} s")
            else:
                ax.plot(xs, ys, marker=MARKER.get(p, "o"), ls="", color=COLOR.get(p), ms=6,
                        label=LABEL.get(p, p))
                labels.append((xs[0], ys[0], LABEL.get(p, p), COLOR.get(p, "black")))
        _place_labels(fig, ax, labels)
        if off_scale:
            ax.text(0.98, 0.97, "above the scale:\n" + "\n".join(off_scale), transform=ax.transAxes,
                    ha="right", va="top", fontsize=MIN_FONT_PT,
                    bbox={"boxstyle": "round", "fc": "white", "ec": "0.7", "alpha": 0.9})
        ax.set_title(w)
        ax.set_xlabel("TTFT P99 (s)")
        ax.set_ylabel("mean imbalance (thousand tokens)")
    for ax in axes.ravel()[len(workloads):]:
        ax.set_visible(False)
    fig.suptitle("TTFT P99 against imbalance as ttft_slo_s moves (labels: its value; G = 8, saturated)")
    _legend_below(fig, axes[0][0], ncol=4)
    return _save(fig, path, layout=False)


def fig_quality_seeds(rows: Sequence[dict], path: str | Path, *, level: float = 0.95) -> Path | None:
    """The decision-quality rules over held-out seeds as a forest plot: one panel per rule (and
    best BR ÷ bfio-h0-lease), one line per group — the geometric mean of the ratio to the
    rule's bound and its interval on a log axis, coloured by verdict; the bound at 1."""
    import textwrap

    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    from .quality import LEASE, POWERED, RULES, _group_label, powered_ratios, verdict

    ratios = powered_ratios(rows, level=level)
    if not ratios:
        return None
    plt = _plt()
    keys = sorted(ratios, key=str)
    panels = [r for r in (*POWERED, LEASE) if any(r in ratios[k] for k in keys)]
    titles = {**RULES, LEASE: "min(br0, brh-survival) ≤ bfio-h0-lease"}
    color = {"holds": "#1b9e77", "undecided": "#7f7f7f", "breaks": "#d62728"}
    height = min(15.0, max(4.0, 0.2 * len(keys) + 2.0))  # at most 15 in: rows close up, text stays 8 pt
    fig, axes = plt.subplots(1, len(panels), figsize=(MAX_WIDTH_IN, height), sharey=True,
                             squeeze=False)
    for ax, rule in zip(axes[0], panels, strict=False):
        for y, key in enumerate(keys):
            if rule not in ratios[key]:
                continue
            gm, lo, hi = ratios[key][rule]
            ax.errorbar(gm, y, xerr=[[gm - lo], [hi - gm]], fmt="o", ms=3.5, lw=1.2,
                        color=color[verdict(lo, hi)])
        ax.axvline(1.0, color="black", lw=0.9)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator([0.25, 0.5, 0.7, 1.0, 1.4, 2.0]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title("\n".join(textwrap.wrap(titles[rule], 18)), fontsize=9)
        ax.set_xlabel("ratio to the bound")
        ax.grid(alpha=0.3, axis="x")
        ax.grid(False, axis="y")
    axes[0][0].set_yticks(range(len(keys)), [_group_label(k) for k in keys])
    axes[0][0].set_ylim(len(keys) - 0.5, -0.5)
    for verdict_name, c in color.items():
        axes[0][0].plot([], [], "o", color=c, label=verdict_name)
    fig.suptitle(f"Rules over held-out seeds: geometric mean and {100 * level:g} % interval per "
                 "group (n: requests drawn)", y=1 - 0.12 / height)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False, bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.45 / height, 1, 1 - 0.35 / height))
    return _save(fig, path, layout=False)


def redraw(out_dir: str | Path) -> dict[str, Path]:
    """Redraw every figure of :data:`FIGURES` whose CSV is under ``<out_dir>/data`` into
    ``<out_dir>/figures`` (nothing is simulated)."""
    out = Path(out_dir)
    drawn: dict[str, Path] = {}
    for name, (experiment, _) in FIGURES.items():
        csv_path = out / "data" / f"{experiment}.csv"
        if csv_path.exists():
            path = draw_figure(name, csv_path, out / "figures" / f"{name}.png")
            if path is not None:
                drawn[name] = path
    return drawn


FIGURES: dict[str, tuple[str, Any]] = {
    "table1_imbalance": ("table1", fig_table1_imbalance),
    "table1_gain": ("table1", fig_table1_gain),
    "table1_calibrated_imbalance": ("table1_calibrated", fig_table1_imbalance),
    "table1_calibrated_gain": ("table1_calibrated", fig_table1_gain),
    "scaling_imbalance": ("scaling", fig_scaling_imbalance),
    "scaling_gain": ("scaling", fig_scaling_gain),
    "theory_extreme_value": ("scaling", fig_extreme_value),
    "theory_balls_into_bins": ("balls_into_bins", fig_balls_into_bins),
    "tick_latency": ("tick_timing", fig_tick_latency),
    "tick_stages": ("tick_timing", fig_tick_stages),
    "step_model": ("step_model", fig_step_model),
    "slots": ("slots", fig_slots),
    "optimality_tick_gap": ("tick_gap", fig_tick_gap),
    "optimality_clairvoyant_gap": ("clairvoyant_gap", fig_clairvoyant_gap),
    "optimality_competitive_ratio": ("competitive_ratio", fig_competitive_ratio),
    "ttft_pareto": ("ttft_pareto", fig_ttft_pareto),
    "quality_seeds": ("quality_seeds", fig_quality_seeds),
}
"""Figure name → (the experiment CSV it reads, the function drawing it)."""


if __name__ == "__main__":
    import sys

    for _name, _path in redraw(sys.argv[1] if len(sys.argv) > 1 else "papers/reproduction").items():
        print(_name, _path)
