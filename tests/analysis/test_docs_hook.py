"""The documentation build hook (docs/hooks.py) on a repository where ``make reproduce`` has run:
README's two commands in order (``make reproduce``, then ``make test``) must not put the local
quick report on the site, where the strict build would stop on a page missing from the nav."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

mkdocs = pytest.importorskip("mkdocs")
from mkdocs.config.defaults import MkDocsConfig  # noqa: E402
from mkdocs.structure.files import Files  # noqa: E402


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed here")
def test_the_local_quick_report_is_not_a_site_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    (repo / "papers" / "reproduction" / "quick").mkdir(parents=True)
    shutil.copy(ROOT / "papers" / "reproduction" / ".gitignore", repo / "papers" / "reproduction" / ".gitignore")
    (repo / "papers" / "reproduction" / "REPORT.md").write_text("# committed report\n")
    (repo / "papers" / "reproduction" / "quick" / "REPORT.md").write_text("# what make reproduce wrote\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    config = MkDocsConfig()  # the hook loaded as mkdocs loads it (mkdocs.yml ``hooks:``)
    config.load_dict({"site_name": "t", "site_dir": str(tmp_path / "site"), "docs_dir": str(ROOT / "docs"),
                      "plugins": [], "hooks": [str(ROOT / "docs" / "hooks.py")]})
    errors, _ = config.validate()
    assert not errors, errors
    hooks = config.plugins[str(ROOT / "docs" / "hooks.py")]
    monkeypatch.setattr(hooks, "ROOT", repo)
    pages = {f.src_uri for f in config.plugins.on_files(Files([]), config=config)}
    assert "papers/reproduction/REPORT.md" in pages
    assert "papers/reproduction/quick/REPORT.md" not in pages
