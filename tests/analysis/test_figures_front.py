"""Committed figures read at 100 %: drawn in the one style with no text under the minimum size,
no wider than a page can show, a sane aspect, and from the CSV that is committed today (each PNG
carries the name and hash of the CSV it was drawn from; a figure left from an older CSV fails)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the plot extra draws the figures")
pytest.importorskip("PIL", reason="matplotlib's pillow reads the figures")

from PIL import Image  # noqa: E402

from balanceroute.analysis import figures  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
REPRO = ROOT / "papers" / "reproduction"
#: Figures outside the reproduction folder: PNG → the CSV it is drawn from.
EXTRA = {ROOT / "papers" / "quality" / "ttft_pareto.png": ROOT / "papers" / "quality" / "ttft_pareto_full.csv"}


def _committed() -> list[tuple[Path, Path]]:
    pairs = [(REPRO / "figures" / f"{name}.png", REPRO / "data" / f"{csv}.csv")
             for name, (csv, _) in figures.FIGURES.items() if (REPRO / "data" / f"{csv}.csv").exists()]
    return pairs + list(EXTRA.items())


def _check(png: Path, csv: Path) -> list[str]:
    """What is wrong with one committed figure (empty: nothing)."""
    if not png.exists():
        return [f"{png.name}: missing (its CSV {csv.name} exists)"]
    problems = []
    stamp = figures.figure_stamp(png)
    if stamp.get("style") != figures.STYLE_VERSION:
        problems.append(f"{png.name}: drawn in style {stamp.get('style')!r}, not {figures.STYLE_VERSION!r}")
    if float(stamp.get("min_font_pt", 0)) < figures.MIN_FONT_PT:
        problems.append(f"{png.name}: text below {figures.MIN_FONT_PT} pt")
    if stamp.get("source") != csv.name or stamp.get("sha256") != hashlib.sha256(csv.read_bytes()).hexdigest()[:16]:
        problems.append(f"{png.name}: not drawn from today's {csv.name} (stamp {stamp})")
    with Image.open(png) as im:
        w, h = im.size
        dpi = im.info.get("dpi", (figures.STYLE["savefig.dpi"],) * 2)[0]
    if w / dpi > figures.MAX_WIDTH_IN + 0.05:
        problems.append(f"{png.name}: {w / dpi:.1f} in wide > {figures.MAX_WIDTH_IN}")
    if not (600 <= w <= 1600 and 400 <= h <= 2400 and 0.25 <= h / w <= 1.5):
        problems.append(f"{png.name}: {w} × {h} px")
    return problems


def test_every_committed_figure_is_readable_and_drawn_from_todays_csv() -> None:
    pairs = _committed()
    assert len(pairs) >= 15
    problems = [p for png, csv in pairs for p in _check(png, csv)]
    assert not problems, "redraw with `python -m balanceroute.analysis.figures papers/reproduction`: " + "; ".join(problems)


def test_the_check_fails_on_a_stale_or_squashed_figure(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    csv = tmp_path / "t.csv"
    csv.write_text("a\n1\n")
    fig, ax = plt.subplots(figsize=(12.1, 1.7))  # the old quality_seeds shape: 1815 × 250 px
    ax.plot([0, 1])
    png = tmp_path / "squashed.png"
    fig.savefig(png, dpi=150)
    plt.close(fig)
    problems = _check(png, csv)
    assert any("style" in p for p in problems) and any("px" in p for p in problems)
    assert any("today's" in p for p in problems)


def test_draw_figure_stamps_its_source_and_refuses_a_too_wide_figure(tmp_path: Path) -> None:
    csv = REPRO / "data" / "slots.csv"
    png = figures.draw_figure("slots", csv, tmp_path / "slots.png")
    assert png is not None and not _check(png, csv)
    plt = figures._plt()
    fig, ax = plt.subplots(figsize=(figures.MAX_WIDTH_IN + 2, 3))
    ax.set_title("tiny", fontsize=4)
    with pytest.raises(ValueError, match="MAX_WIDTH_IN"):
        figures._save(fig, tmp_path / "wide.png")
