"""Every package folder (bundled data folders included) is listed in pyproject.toml, so
``pip install`` ships it and setuptools has nothing to warn about."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    folders = {name: ROOT / path for name, path in config["package-dir"].items()}
    found = set()
    for name, folder in folders.items():
        for init in folder.rglob("*"):
            if init.is_dir() and "__pycache__" not in init.parts and any(init.iterdir()):
                rel = init.relative_to(folder)
                found.add(".".join([name, *rel.parts]))
        found.add(name)
    # folders with Python files or bundled data must be listed; the package-dir roots map the rest
    assert found <= listed, sorted(found - listed)


def test_the_python_floor_is_stated_once_everywhere() -> None:
    """pyproject's ``requires-python`` floor is the one README and the set-up page state and the
    one the Makefile checks before it creates ``.venv`` (a newcomer with an older Python gets
    the Makefile's one-line answer, not pip's resolver error after the venv is built)."""
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    match = re.fullmatch(r">=(\d+)\.(\d+)", spec)
    assert match is not None, spec
    major, minor = match.groups()
    for page in ("README.md", "docs/setup.md"):
        stated = set(re.findall(r"Python ≥ (\d+\.\d+)", (ROOT / page).read_text()))
        assert stated == {f"{major}.{minor}"}, (page, stated, spec)
    checks = re.findall(r"sys\.version_info >= \((\d+), (\d+)\)", (ROOT / "Makefile").read_text())
    assert checks == [(major, minor)], (checks, spec)
