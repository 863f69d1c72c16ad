"""The generated blocks of README.md and the documentation pages: numbers written by code.

A Markdown file marks a generated block with two HTML comments::

    <!-- generated: headline-table from papers/reproduction/data/table1.csv; `balanceroute report --readme` rewrites it -->
    ...
    <!-- end generated: headline-table -->

The block's body is whatever :data:`BLOCKS` ``[name]`` returns for the repository root, read
only from the committed CSV it names (and the paper's published numbers, :mod:`.paper`).
``balanceroute report --readme`` rewrites every block of README.md and ``docs/*.md`` in place;
``--check`` rewrites nothing and exits 1 naming the stale blocks (the test suite runs the same
check, so a number in a block that differs from its CSV fails the tests).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BLOCKS", "Block", "add_report_args", "check", "render", "run_report", "update"]

_BLOCK_RE = re.compile(
    r"(?P<head><!-- generated: (?P<name>[a-z0-9-]+) from (?P<source>\S+);[^\n]*-->\n)"
    r"(?P<body>.*?)"
    r"(?P<tail><!-- end generated: (?P=name) -->)", re.S)

TABLE1 = "papers/reproduction/data/table1.csv"
QUALITY = "papers/reproduction/data/quality.csv"
QUALITY_SEEDS = "papers/reproduction/data/quality_seeds.csv"
TTFT_PARETO = "papers/reproduction/data/ttft_pareto.csv"

_LABEL = {"jsq": "JSQ", "least_load": "least-load", "power_of_two": "power-of-two",
          "random": "random", "round_robin": "round-robin", "br0": "**BR-0**",
          "brh-survival": "BR-H (survival)", "brh-oracle": "BR-H (oracle)"}
_HEADLINE_POLICIES = ("jsq", "least_load", "br0", "brh-survival", "brh-oracle")
_HEADLINE_WORKLOADS = ("azure-2024-long", "servegen-r1")


@dataclass(frozen=True, slots=True)
class Block:
    """One generated block: the CSV it reads (relative to the repository root) and the
    function that writes its Markdown from the rows of that CSV."""

    source: str
    write: Callable[[list[dict]], str]


def _rows(root: Path, source: str) -> list[dict]:
    from .sweep import read_csv

    return read_csv(root / source)


def _ok(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _summary(rows: list[dict]) -> dict[tuple[str, str], dict]:
    """Table 1 at G = 8: (workload, policy) → mean over seeds (:func:`.tables.policy_summary`)."""
    from . import tables

    sel = [r for r in rows if int(r["replicas"]) == 8]
    return {(r["workload"], r["policy"]): r for r in tables.policy_summary(sel, by=("workload",))}


def _paper_gain(dataset: str, policy: str) -> float:
    """The paper's published throughput gain over JSQ (Table 1's gain column where it is over
    JSQ, else recomputed from its throughput column)."""
    from . import paper

    row = paper.paper_row(paper.TABLE1, dataset=dataset, policy=policy)
    jsq = paper.paper_row(paper.TABLE1, dataset=dataset, policy="jsq")
    if row is None or jsq is None:
        return math.nan
    if policy == "jsq":
        return 0.0
    if row.get("gain_ref") == "jsq" and row.get("gain_pct") is not None:
        return float(row["gain_pct"])
    return 100.0 * (row["throughput_tok_s"] / jsq["throughput_tok_s"] - 1.0)


def headline_table(rows: list[dict]) -> str:
    """README's one table: mean imbalance, its cut against JSQ and the throughput gain over JSQ
    at G = 8 for the paper's two datasets' stand-ins, ours next to the paper's. The cut is the
    mean over seeds of each seed's JSQ ÷ policy, the same figure the report's summary quotes."""
    from . import paper

    s = _summary(rows)
    seeds = max(int(r["seeds"]) for r in s.values())
    out = ["| workload (paper's data) | policy | imbalance (tokens) | JSQ ÷ policy | "
           "throughput vs JSQ | paper: imbalance | paper: JSQ ÷ policy | paper: throughput vs JSQ |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    for w in _HEADLINE_WORKLOADS:
        ds = next(d for d, wl in paper.DATASET_WORKLOAD.items() if wl == w)
        pj = paper.paper_row(paper.TABLE1, dataset=ds, policy="jsq")
        where = f"{w} ({ds})"
        for p in _HEADLINE_POLICIES:
            r, jsq = s.get((w, p)), s.get((w, "jsq"))
            if r is None or jsq is None:
                continue
            pr = paper.paper_row(paper.TABLE1, dataset=ds, policy=p)
            theirs = (["—", "—", "—"] if pr is None else
                      [f"{pr['mean_imbalance']:,.0f}", f"{pj['mean_imbalance'] / pr['mean_imbalance']:.1f}×",
                       f"{_paper_gain(ds, p):+.1f} %"])
            out.append(f"| {where} | {_LABEL.get(p, p)} | {r['mean_imbalance']:,.0f} | "
                       f"{r['imbalance_vs_jsq']:.1f}× | "
                       f"{r['gain_vs_jsq_pct']:+.1f} % | " + " | ".join(theirs) + " |")
            where = ""
    sample = next(iter(rows))
    out += ["", f"G = 8 decode replicas, B = {int(sample['slots'])} slots, saturated, "
            f"{int(sample['test_requests']):,} simulated requests per run, mean over {seeds} seeds; "
            "throughput is the loaded-phase rate of the simulated cluster (default step model "
            f"τ = {1e3 * float(sample['step_b']):g} ms + {1e6 * float(sample['step_a']):g} µs × "
            "the largest replica's KV tokens). The paper measured 96 Ascend 910C NPUs on its own "
            "request sets; servegen-r1 and azure-2024-long are the bundled stand-ins, so compare "
            "ratios, not tokens."]
    return "\n".join(out)


def headline_sentence(rows: list[dict]) -> str:
    """One sentence on the barrier: the share of its capacity idle under JSQ and BR-0."""
    s = _summary(rows)
    parts = []
    for w in _HEADLINE_WORKLOADS:
        jsq, br0 = s.get((w, "jsq")), s.get((w, "br0"))
        if jsq is None or br0 is None:
            continue
        parts.append(f"on {w} the barrier idles {100 * jsq['barrier_idle_fraction']:.1f} % of the "
                     f"cluster's token capacity under JSQ and {100 * br0['barrier_idle_fraction']:.1f} % "
                     f"under BR-0 (throughput {br0['gain_vs_jsq_pct']:+.1f} %)")
    return ("In simulation at G = 8 (Table 1 of the reproduction), " + "; ".join(parts) + ".")


def results_table1(rows: list[dict]) -> str:
    """The reproduction's Table-1 section (every workload, every policy), as the report writes it."""
    from .report import LABEL, ReportContext, _section_table1

    present = list(dict.fromkeys(r["policy"] for r in rows))
    ordered = [p for p in LABEL if p in present] + [p for p in present if p not in LABEL]
    ctx = ReportContext(mode="full", command="balanceroute reproduce", profile=None,
                        requested_policies=ordered, available_policies=ordered,
                        solver_message="", solvers_available=True)
    text, summary = _section_table1(rows, ctx, {})
    body = text.split("\n", 1)[1].strip()  # drop the section heading: the page has its own
    body = body.replace("\n### ", "\n#### ")
    return body + "\n\n" + "\n".join(f"- {line}" for line in summary)


def results_paper(rows: list[dict]) -> str:
    """The quality matrix's 20,000-request cells next to the paper's Table 1 (ratios to BR-0)."""
    from .quality import paper_lines

    return "\n".join(paper_lines(rows))


def results_seeds(rows: list[dict]) -> str:
    """The decision-quality rules judged per group over held-out draws."""
    from .quality import powered_lines

    return "\n".join(powered_lines(rows))


def readme_lookahead(rows: list[dict]) -> str:
    """Where the deployable lookahead pays and where it does not, over held-out draws."""
    from .quality import lookahead_lines

    return "\n".join(lookahead_lines(rows))


def readme_ttft(rows: list[dict]) -> str:
    """The first-token bound over held-out draws, in words."""
    from .quality import ttft_lines

    return "\n".join(ttft_lines(rows))


BLOCKS: dict[str, Block] = {
    "headline-sentence": Block(TABLE1, headline_sentence),
    "headline-table": Block(TABLE1, headline_table),
    "results-table1": Block(TABLE1, results_table1),
    "results-paper": Block(QUALITY, results_paper),
    "results-seeds": Block(QUALITY_SEEDS, results_seeds),
    "readme-lookahead": Block(QUALITY_SEEDS, readme_lookahead),
    "readme-ttft": Block(QUALITY_SEEDS, readme_ttft),
}
"""Block name → its source CSV and writer."""


def render(text: str, root: Path) -> tuple[str, list[str]]:
    """``text`` with every generated block rewritten from its CSV, and the names of the blocks
    whose body changed. An unknown block name, or a block naming another CSV than its writer
    reads, raises :class:`ValueError`."""
    changed: list[str] = []
    cache: dict[str, list[dict]] = {}

    def sub(m: re.Match) -> str:
        name, source = m["name"], m["source"]
        if name not in BLOCKS:
            raise ValueError(f"generated block {name!r} is not one of {sorted(BLOCKS)}")
        block = BLOCKS[name]
        if source != block.source:
            raise ValueError(f"generated block {name!r} says it is from {source}, "
                             f"but it is written from {block.source}")
        if source not in cache:
            cache[source] = _rows(root, source)
        body = block.write(cache[source]).strip() + "\n"
        if body != m["body"]:
            changed.append(name)
        return m["head"] + body + m["tail"]

    return _BLOCK_RE.sub(sub, text), changed


def _targets(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("**/*.md"))]


def update(root: Path, *, write: bool = True) -> dict[Path, list[str]]:
    """Rewrite (``write``) or only compare every generated block of README.md and docs/*.md;
    file → the names of its stale blocks."""
    stale: dict[Path, list[str]] = {}
    for path in _targets(root):
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        new, changed = render(text, root)
        if changed:
            stale[path] = changed
            if write:
                path.write_text(new, encoding="utf-8")
    return stale


def check(root: Path) -> dict[Path, list[str]]:
    """The stale blocks (nothing is written)."""
    return update(root, write=False)


def add_report_args(p: argparse.ArgumentParser) -> None:
    """Arguments of ``balanceroute report``."""
    p.add_argument("--readme", action="store_true",
                   help="rewrite the generated blocks of README.md and docs/*.md from the committed CSVs")
    p.add_argument("--check", action="store_true",
                   help="rewrite nothing; exit 1 naming every block that differs from its CSV")
    p.add_argument("--root", default=".", help="the repository root (default: the current folder)")


def run_report(args: argparse.Namespace) -> int:
    """``balanceroute report``: regenerate (or check) the front door's generated blocks."""
    root = Path(args.root)
    if not (root / "README.md").exists():
        raise ValueError(f"--root {args.root!r} must be the repository root (no README.md there)")
    if not (args.readme or args.check):
        raise ValueError("say --readme (rewrite the generated blocks) or --check (compare only)")
    stale = update(root, write=not args.check)
    for path, names in stale.items():
        verb = "stale" if args.check else "rewritten"
        print(f"{path.relative_to(root)}: {verb}: {', '.join(names)}",
              file=sys.stderr if args.check else sys.stdout)
    return 1 if (args.check and stale) else 0
