"""The front door: README's and the docs' generated numbers equal what the code writes from the
committed CSVs, README stays short and its links resolve, and no committed page cites an issue
number or a file the repository does not have."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from balanceroute.analysis import frontdoor

ROOT = Path(__file__).resolve().parents[2]

#: References a reader cannot follow: an issue tracker's number, a design file that is not here.
DEAD_REFERENCES = re.compile(r"\b[Ii]ssues? \d+|\bDESIGN(?:\.md| §\d)|acceptance of issue")


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return pages + sorted(p for p in (ROOT / "papers").rglob("*.md") if "cache" not in p.parts)


def test_every_generated_block_equals_what_its_csv_gives_today() -> None:
    stale = frontdoor.check(ROOT)
    assert not stale, ("stale generated blocks (run `balanceroute report --readme`): "
                       + "; ".join(f"{p.relative_to(ROOT)}: {', '.join(n)}" for p, n in stale.items()))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "<!-- generated: headline-table from papers/reproduction/data/table1.csv;" in readme


def test_a_number_edited_by_hand_in_a_block_is_caught() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("<!-- generated: headline-table")
    m = re.compile(r"\| \*\*BR-0\*\* \| (\d[\d,]*) \|").search(readme, start)
    assert m is not None
    forged = readme[:m.start(1)] + "1" + readme[m.start(1):]  # one digit more in BR-0's imbalance
    rewritten, changed = frontdoor.render(forged, ROOT)
    assert changed == ["headline-table"] and rewritten == readme


def test_a_block_naming_another_csv_or_an_unknown_writer_is_refused() -> None:
    with pytest.raises(ValueError, match="written from"):
        frontdoor.render("<!-- generated: headline-table from papers/quality/quality_full.csv; x -->\n"
                         "<!-- end generated: headline-table -->", ROOT)
    with pytest.raises(ValueError, match="not one of"):
        frontdoor.render("<!-- generated: nope from a.csv; x -->\n<!-- end generated: nope -->", ROOT)


def test_the_papers_published_gain_is_quoted_as_published() -> None:
    # the paper's Table 1 says +11.8 % for BR-0 on its proprietary data (943 / 843 would round to 11.9)
    assert frontdoor._paper_gain("proprietary", "br0") == pytest.approx(11.8)
    assert "| 51,927 | 4.1× | +11.8 % |" in (ROOT / "README.md").read_text(encoding="utf-8")
    report = (ROOT / "papers" / "reproduction" / "REPORT.md").read_text(encoding="utf-8")
    assert "paper +11.8%" in report and "paper +11.9%" not in report  # (ours may be +11.9 %)


def test_readme_is_short_and_its_first_screen_has_the_commands() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250
    first = "\n".join(lines[:30])
    for needed in ("make reproduce", "make test", "balanceroute compare", "balanceroute serve",
                   "pip install ."):
        assert needed in first, needed


#: Pages the site's build hook writes (docs/hooks.py), not files in the repository.
GENERATED_PAGES = {ROOT / "docs" / "reference" / "cli.md"}


def test_readme_and_docs_links_point_to_files_that_exist() -> None:
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    missing = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in link.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (page.parent / target).resolve()
            if not path.exists() and path not in GENERATED_PAGES:
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, missing


def test_no_page_cites_an_issue_number_or_a_missing_design_file() -> None:
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in _pages()
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if DEAD_REFERENCES.search(line)]
    assert not hits, hits


def test_the_generated_report_text_cites_no_issue_number() -> None:
    from balanceroute.analysis.quality import quality_section
    from balanceroute.analysis.report import load_experiments

    data = load_experiments(ROOT / "papers" / "reproduction" / "data")
    text = quality_section({k: data[k] for k in ("quality", "ttft_pareto") if k in data}, {})
    assert text and not DEAD_REFERENCES.search(text)


def test_the_dead_reference_pattern_can_fail() -> None:
    for bad in ("the acceptance of issue 10", "see DESIGN §1", "Issue 11 allows 1.5", "DESIGN.md"):
        assert DEAD_REFERENCES.search(bad), bad
    assert not DEAD_REFERENCES.search("the design of the tick; 11 issues were open")


def test_the_ttft_table_orders_the_knob_by_value() -> None:
    from balanceroute.analysis.quality import quality_section
    from balanceroute.analysis.report import load_experiments

    rows = load_experiments(ROOT / "papers" / "reproduction" / "data")["ttft_pareto"]
    lines = [line for line in quality_section({"ttft_pareto": rows}, {}).splitlines()
             if line.startswith("| azure-2024-long | br0 |")]
    knobs = [line.split("|")[3].strip() for line in lines]
    assert knobs == sorted(knobs, key=lambda k: float("inf") if k in ("off", "—") else float(k)), knobs


def test_the_api_pages_docstrings_cite_no_issue_number_or_missing_file() -> None:
    """What mkdocstrings renders on the Python API page: each module's docstring and those of
    its public classes, functions and methods."""
    import importlib
    import inspect

    api = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    hits = []
    for name in re.findall(r"^::: ([\w.]+)", api, re.M):
        module = importlib.import_module(name)
        items = [(name, module)] + [(f"{name}.{k}", v) for k, v in vars(module).items()
                                    if not k.startswith("_") and (inspect.isclass(v) or inspect.isfunction(v))
                                    and getattr(v, "__module__", "").startswith(name)]
        items += [(f"{q}.{k}", m) for q, v in list(items) if inspect.isclass(v)
                  for k, m in vars(v).items() if not k.startswith("_") and inspect.isfunction(m)]
        hits += [q for q, v in items if DEAD_REFERENCES.search(inspect.getdoc(v) or "")]
    assert not hits, hits


def _decimals(text: str) -> list[str]:
    """Numbers written with two or more decimals (ratios, shares): the ones a reader compares."""
    return re.findall(r"(?<![\d.,])\d+\.\d{2,}(?![\d])", text)


def test_hand_written_ratios_next_to_generated_blocks_are_the_blocks_numbers() -> None:
    """On a page with generated blocks, every ratio written by hand outside them (two or more
    decimals) must be a number of the page's blocks, at its rounding."""
    blocks = re.compile(r"<!-- generated:.*?<!-- end generated: [a-z0-9-]+ -->", re.S)
    unbacked = {}
    for page in (ROOT / "README.md", ROOT / "docs" / "results.md"):
        text = page.read_text(encoding="utf-8")
        backed = [float(x) for m in blocks.finditer(text) for x in _decimals(m.group(0))]
        prose = re.sub(r"arXiv \d+\.\d+|Python ≥ \d+\.\d+|python\d+\.\d+", "", blocks.sub("", text))  # not results
        bad = [x for x in _decimals(prose)
               if not any(abs(round(b, len(x.split(".")[1])) - float(x)) < 1e-9 for b in backed)]
        # a ratio with its interval, "0.359 (0.349–0.370)", must be one of the blocks' triples
        triple = re.compile(r"(\d+\.\d{2,}) \((\d+\.\d{2,})[–-](\d+\.\d{2,})\)")
        triples = {tuple(map(float, m)) for m in triple.findall("".join(blocks.findall(text)))}
        bad += [" ".join(m) for m in triple.findall(prose)
                if not any(all(abs(round(b, len(x.split(".")[1])) - float(x)) < 1e-9
                               for b, x in zip(t, m, strict=True)) for t in triples)]
        if bad:
            unbacked[page.name] = bad
    assert not unbacked, unbacked


def test_the_tick_sentence_compares_with_the_step_by_its_numbers() -> None:
    from balanceroute.analysis.report import _step_words

    assert "0.3 % of the ≈ 60 ms decode step" in _step_words([9.9, 181.7], 60.0)
    slow = _step_words([9.9, 373_000.0], 60.0)  # a 373 ms P99 is not "far below" a 60 ms step
    assert "far below" not in slow and "exceeds" in slow
    assert "time the step does not hide" in _step_words([30_000.0], 60.0)
