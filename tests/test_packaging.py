"""Every package folder (bundled data folders included) is listed in pyproject.toml, so
``pip install`` ships it and setuptools has nothing to warn about."""

from __future__ import annotations

from pathlib import Path

import tomllib

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
