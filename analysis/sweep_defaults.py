"""The multi-workload sweep behind the shipped BR-0 / BR-H defaults, on training data only.

``python -m balanceroute.analysis.sweep_defaults PART [--out CSV]`` runs one part (br0, brh, fill,
brhfill, safeguard, lpt, backlog, clairvoyant, settle, ttft; nice it: it is a few minutes of one
core per part). The data never overlap what the quality matrix or Table 1 *simulate*: the generated
workloads are drawn at seeds 11 and 12 (the matrix uses 0–4), and the replays are slices outside
every simulated (test) half: mooncake-conv rows 3,000–6,000 and azure-conv-2023 rows 3,000–9,000
(the matrix simulates rows 1,500–3,000 and the second half of the whole trace); the
``safeguard`` part adds generated seeds 13 and 14, the ``backlog`` part seed 13 and both
generated workloads at 20,000 requests, seed 11; the ``clairvoyant`` part seeds 11-15 and both
generated workloads at 20,000 requests, seeds 11-14 (the ``settle`` part the generated workloads
of those); the ``ttft`` part draws many seeds instead, 100–115 (:data:`TTFT_SEEDS`), so that
a setting is judged by an interval over 16 draws rather than by one. Each slice is split in
two: the first half fits the predictors, the second is simulated. Every row records the ratio to BF-IO-H0 and to BR-0 with the shipped defaults; the
choice (README, "Defaults") takes the best worst case over the slices, then the best mean (the
``safeguard`` part's exception, a judge that never lets the lookahead act, is in
``papers/quality.md``).
``ttft_slo_s`` was swept separately (``papers/ttft.md``).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import sys
from collections.abc import Iterator

import numpy as np

__all__ = ["training_slices"]

G = 8


def training_slices(seeds: tuple[int, ...] = (11, 12), *, long: bool = False,
                    replays: bool = True) -> Iterator[tuple[str, object, object]]:
    """(label, train, test) of every training slice (module docstring); ``seeds``: those of the
    generated workloads (``safeguard`` adds 13 and 14, still none of the matrix's 0–4); ``long``
    adds both generated workloads drawn at 20,000 requests at the first seed; ``replays=False``
    leaves the two replay slices out."""
    from balanceroute.core.workloads import load_workload

    def halves(w):
        cut = len(w) // 2
        return w.take(np.arange(cut)), w.take(np.arange(cut, len(w)))

    for seed in seeds:
        for name in ("azure-2024-long", "servegen-r1"):
            yield (f"{name}@{seed}", *halves(load_workload(name, requests=3_000, seed=seed)))
    if replays:
        yield ("mooncake-conv[3000:6000]",
               *halves(load_workload("mooncake-conv", requests=6_000).take(np.arange(3_000, 6_000))))
        yield ("azure-conv-2023[3000:9000]",
               *halves(load_workload("azure-conv-2023", requests=9_000).take(np.arange(3_000, 9_000))))
    if long:
        for name in ("azure-2024-long", "servegen-r1"):
            yield (f"{name}@{seeds[0]} n=20000",
                   *halves(load_workload(name, requests=20_000, seed=seeds[0])))


def _grid(part: str) -> list[tuple[str, dict]]:
    if part == "br0":  # Stage 1's growth window T (and the paper's Stage 1), on the previous tick
        return [("br0", dict(growth_steps=t, r_max=4, beta_per_replica=1.0))
                for t in (0.0, 16.0, 64.0, 256.0, 1024.0)] + [
            ("br0", dict(stage1="paper", r_max=4, beta_per_replica=1.0))]
    if part == "backlog":  # BR-H's backlog window: off, or on at a decode share (0.2 shipped)
        return [(name, dict(backlog_horizon=None)) for name in ("brh-survival", "brh-oracle")] + [
            (name, dict(backlog_share=x)) for name in ("brh-survival", "brh-oracle")
            for x in (0.1, 0.2, 0.3)]
    if part == "clairvoyant":  # the backlog window's safeguard: on, or standing aside
        return [(name, dict(backlog_safeguard=b)) for name in ("brh-survival", "brh-oracle")
                for b in (True, False)]
    if part == "settle":  # how long a backlog lasts before a sharp forecast acts unguarded
        return [("brh-survival", dict(backlog_settle_s=t))
                for t in (None, 15.0, 30.0, 45.0, 60.0, 90.0, 120.0)]
    if part == "ttft":  # the soft first-token deadline, judged over many draws
        return [(name, dict(ttft_slo_s=t)) for name in ("br0", "brh-survival")
                for t in (4.0, 6.0, 8.0, None)]
    if part == "lpt":  # small batches placed whole: checked against LPT (shipped) or not
        return [(name, dict(lpt_batches=b)) for name in ("br0", "brh-survival", "brh-oracle")
                for b in (False, True)]
    if part == "fill":  # Stage 2: the fill (r_max = 0) against the paper's (r_max = 4), β, ttft_slo_s
        rows = [("br0", dict(r_max=r, beta_per_replica=b, ttft_slo_s=t))
                for r in (4, 0) for b in (1.0, 2.0, 3.0, 4.0) for t in (4.0, 6.0)]
        rows += [("br0", dict(r_max=0, beta_per_replica=3.0, growth_steps=t))
                 for t in (0.0, 64.0, 1024.0)]
        rows += [("br0", dict(r_max=0, beta_per_replica=3.0, stage1="paper"))]
        return rows + [(name, dict(r_max=r)) for name in ("brh-survival", "brh-oracle")
                       for r in (4, 0)]
    return [(name, dict(horizon=h, gamma=g, beta=b * G, r_max=4))  # the previous tick's Stage 2
            for name in ("brh-survival", "brh-oracle")
            for h, g, b in itertools.product((0, 20, 40, 80, 160), (0.86, 1.0), (2.0, 16.0))
            if h or (g == 1.0 and b == 2.0)]


def _brh_fill_grid() -> list[tuple[str, dict]]:
    """BR-H's fill tick: replicas by fill level (shipped) or by current margin m(0) (before), then
    β, γ and H around the shipped 2·G, 0.86, 80 with the fill level."""
    rows = []
    for name in ("brh-survival", "brh-oracle"):
        rows += [(name, dict(fill_order=order)) for order in ("level", "margin")]
        rows += [(name, dict(beta=b * G, gamma=g, horizon=h))
                 for b, g, h in itertools.product((1.0, 2.0, 3.0, 4.0), (0.86, 0.95), (40, 80))
                 if (b, g, h) != (2.0, 0.86, 80)]
    return rows


TTFT_SEEDS = tuple(range(100, 116))
"""``ttft`` part: 16 training draws per generated workload and size (none of the matrix's 0–4, nor
the held-out 1,000+ of ``quality --experiment quality_seeds``)."""

SAFEGUARDS = (0.0, 0.01, 0.02, 0.05, 0.1)
"""``safeguard`` part: BR-H's plan against BR-0's — off, then ε for a judge that weighs the envelope
1·G (the imbalance) or 3·G (BR-0's β) — both predictors, G = 8 and 16."""


def main(argv: list[str] | None = None) -> int:
    """Run one part of the sweep and write one CSV row per (slice, load, policy, params)."""
    from balanceroute.catalogue import build_policy
    from balanceroute.core.simulator import SimConfig, simulate

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("br0", "brh", "fill", "brhfill", "safeguard", "lpt",
                                     "backlog", "clairvoyant", "settle", "ttft"))
    ap.add_argument("--out", default="-")
    args = ap.parse_args(argv)
    out = sys.stdout if args.out == "-" else open(args.out, "w", newline="")  # noqa: SIM115
    writer = csv.writer(out)
    writer.writerow(["slice", "load", "policy", "params", "mean_imbalance", "bfio_h0_imbalance",
                     "ratio_to_bfio_h0", "br0_default_imbalance", "ttft_s_p99",
                     "least_load_imbalance", "jsq_ttft_s_p99", "throughput_loaded_tok_s"])
    # BR-0's ticks are judged below saturation too (open loop at 0.5 and 1.0 of JSQ's
    # saturated request rate); BR-H saturated only
    loads = (("saturated",) if args.part in ("brh", "brhfill", "safeguard", "clairvoyant", "settle",
                                              "ttft")
             else ("saturated", 0.5, 1.0))
    if args.part == "lpt":
        loads = ("saturated", 0.5, 0.8, 1.0, 1.2)
    if args.part == "safeguard":
        grid = [(name, p) for name in ("brh-survival", "brh-oracle")
                for p in [dict(safeguard=None)] + [dict(safeguard=e, safeguard_weight=w)
                                                    for w in (1.0, 3.0) for e in SAFEGUARDS]]
        slices = [(f"{label} G={g}", g, train, test)
                  for label, train, test in training_slices((11, 12, 13, 14)) for g in (G, 2 * G)]
    elif args.part == "lpt":
        grid = _grid(args.part)
        slices = [(f"{label} G={g}", g, train, test)
                  for label, train, test in training_slices() for g in (G, 2 * G)]
    elif args.part in ("clairvoyant", "settle"):  # seeds 11-15 at 3,000 requests, 11-14 at 20,000
        grid = _grid(args.part)
        labelled = list(training_slices((11, 12, 13, 14, 15)))
        labelled += [item for seed in (11, 12, 13, 14)
                     for item in training_slices((seed,), long=True) if "n=20000" in item[0]]
        if args.part == "settle":  # the replays never reach a decode-heavy backlog
            labelled = [item for item in labelled if "@" in item[0]]
        slices = [(f"{label} G={g}", g, train, test) for label, train, test in labelled
                  for g in (G, 2 * G)]
    elif args.part == "ttft":  # generated workloads at 16 seeds, both sizes, with the replay slices
        labelled = [item for seed in TTFT_SEEDS
                    for item in training_slices((seed,), long=True, replays=False)]
        labelled += [item for item in training_slices((TTFT_SEEDS[0],)) if "@" not in item[0]]
        grid = _grid(args.part)
        slices = [(f"{label} G={g}", g, train, test) for label, train, test in labelled
                  for g in (G, 2 * G)]
    elif args.part == "backlog":  # the short slices at seeds 11-13 and two 20,000-request draws
        grid = _grid(args.part)
        slices = [(f"{label} G={g}", g, train, test)
                  for label, train, test in training_slices((11, 12, 13), long=True)
                  for g in (G, 2 * G)]
    else:
        grid = _brh_fill_grid() if args.part == "brhfill" else _grid(args.part)
        slices = [(label, G, train, test) for label, train, test in training_slices()]
    for label, replicas, train, test in slices:
        def build(name, train=train, test=test, **kw):
            return build_policy(name, kw, train=train, test=test)

        sat = SimConfig(num_replicas=replicas, slots=64, check_assignments=False)
        cap = simulate(test, build("jsq"), sat).metrics["throughput_loaded_tok_s"] / test.output_len.mean()
        native = (len(test) - 1) / float(test.arrival_s.max() - test.arrival_s.min())
        for load in loads:
            cfg = sat if load == "saturated" else SimConfig(
                num_replicas=replicas, slots=64, mode="open_loop", rate_scale=load * cap / native,
                check_assignments=False)
            ref = simulate(test, build("bfio-h0"), cfg).metrics
            base = simulate(test, build("br0"), cfg).metrics
            fifo = simulate(test, build("least_load"), cfg).metrics
            jsq = simulate(test, build("jsq"), cfg).metrics
            for name, params in grid:
                if name != "br0" and load != "saturated" and args.part not in ("lpt", "backlog"):
                    continue  # BR-H rows: saturated only (except the lpt and backlog parts)
                m = simulate(test, build(name, **params), cfg).metrics
                writer.writerow([label, load, name, repr(params), round(m["mean_imbalance"]),
                                 round(ref["mean_imbalance"]),
                                 round(m["mean_imbalance"] / ref["mean_imbalance"], 4),
                                 round(base["mean_imbalance"]), round(m["ttft_s_p99"], 2),
                                 round(fifo["mean_imbalance"]), round(jsq["ttft_s_p99"], 2),
                                 round(m["throughput_loaded_tok_s"])])
                out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
