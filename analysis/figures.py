"""The reproduction's figures: one PNG per claim, drawn only from the experiment CSVs' rows.

Each ``fig_*`` function takes rows (as read back by :func:`~.sweep.read_csv`) and a path, draws
with matplotlib's Agg backend and returns the path, or ``None`` when the rows hold nothing to
draw. Paper values (:mod:`.paper`) are drawn as hollow black-edged markers next to ours.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import paper, tables, theory

__all__ = [
    "FIGURES",
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
    "brh-learned": "#17becf", "brh-oracle": "#1f78b4",
}
MARKER = {"random": "x", "round_robin": "+", "power_of_two": "^", "jsq": "s", "least_load": "v",
          "br0": "o", "brh-survival": "D", "brh-exact": "P", "brh-learned": "*", "brh-oracle": "h"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 150, "savefig.dpi": 150, "font.size": 9,
                         "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 8,
                         "legend.framealpha": 0.85})
    return plt


def _save(fig, path: str | Path, *, layout: bool = True) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if layout:
        fig.tight_layout()
    fig.savefig(out)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return out


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
    ax.legend(fontsize=7, loc="upper left", ncol=2)
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
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
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
    ax.legend(fontsize=7, loc="upper left")
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
    axes[0][0].legend(fontsize=7, loc="lower right")
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
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3)
    return _save(fig, path)


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
    "ttft_pareto": ("ttft_pareto", lambda rows, path: __import__(
        "balanceroute.analysis.quality", fromlist=["draw_pareto"]).draw_pareto(rows, path)),
    "quality_seeds": ("quality_seeds", lambda rows, path: __import__(
        "balanceroute.analysis.quality", fromlist=["draw_powered"]).draw_powered(rows, path)),
}
"""Figure name → (the experiment CSV it reads, the function drawing it)."""
