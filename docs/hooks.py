"""Build hooks of the documentation site (mkdocs.yml ``hooks:``); not a page.

- The model, algorithm and research pages live in ``papers/`` (next to their CSVs and figures);
  :func:`on_files` adds ``papers/`` to the site as it is, under ``papers/``, instead of copying it
  (but for files git ignores: ``make reproduce``'s local report must not fail the strict build).
- ``reference/cli.md`` is generated from the argparse parsers (:mod:`balanceroute.clidoc`).
- The installed package maps ``core/``, ``solvers/``, ``serving/`` and ``analysis/`` into
  ``balanceroute.*`` (pyproject's ``package-dir``); :func:`api_tree` lays that out as symlinks
  under ``build/api-src/`` so mkdocstrings finds ``balanceroute.core`` and the rest by path.
- A ``docs/*.md`` page missing from the nav is added under "More pages" rather than left out.
- Links are written as paths in the repository (``docs/results.md`` links ``../papers/fill.md``,
  which works when reading the files on a forge); :func:`on_page_markdown` maps them to the
  site's layout, where ``docs/`` is the root and ``papers/`` sits under it.
"""

from __future__ import annotations

import posixpath
import re
import subprocess
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
API_SRC = ROOT / "build" / "api-src"
_SUBPACKAGES = ("core", "solvers", "serving", "analysis")


def api_tree() -> Path:
    """``build/api-src/balanceroute``: the package as installed, made of symlinks to the sources."""
    pkg = API_SRC / "balanceroute"
    pkg.mkdir(parents=True, exist_ok=True)
    wanted = {p.name: p for p in (ROOT / "balanceroute").iterdir() if p.name != "__pycache__"}
    wanted.update({name: ROOT / name for name in _SUBPACKAGES})
    for name, target in wanted.items():
        link = pkg / name
        if link.is_symlink() and link.resolve() == target.resolve():
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    return API_SRC


api_tree()  # before mkdocstrings looks for the package (hooks load with the config)


def _nav_pages(nav) -> set[str]:
    out: set[str] = set()
    for item in nav or []:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            out |= _nav_pages(value)
        elif isinstance(value, str):
            out.add(value)
    return out


def on_config(config):
    """Add every ``docs/*.md`` page the nav does not list, under "More pages"."""
    listed = _nav_pages(config["nav"])
    docs = Path(config["docs_dir"])
    extra = [p.relative_to(docs).as_posix() for p in sorted(docs.rglob("*.md"))]
    extra = [p for p in extra if p not in listed]
    if extra:
        config["nav"].append({"More pages": extra})
    return config
_PAPER_SUFFIXES = {".md", ".png", ".svg"}


def _git_ignored(under: str) -> set[str]:
    """Files under ``under`` that git ignores (``papers/reproduction/quick/``: what ``make
    reproduce`` writes on a user's machine): not part of the site. Empty without git."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--others", "--ignored", "--exclude-standard",
                              "-z", "--", under], capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {p for p in out.decode().split("\0") if p}


def on_files(files: Files, config) -> Files:
    """Add ``papers/**`` (Markdown and figures; not what git ignores, such as a local
    ``reproduce --quick`` report) and the generated CLI page."""
    ignored = _git_ignored("papers")
    for path in sorted((ROOT / "papers").rglob("*")):
        rel = path.relative_to(ROOT)
        if (path.is_file() and path.suffix in _PAPER_SUFFIXES and "cache" not in rel.parts
                and rel.as_posix() not in ignored):
            files.append(File(rel.as_posix(), src_dir=str(ROOT), dest_dir=config["site_dir"],
                              use_directory_urls=config["use_directory_urls"]))
    from balanceroute.clidoc import cli_reference

    files.append(File.generated(config, "reference/cli.md", content=cli_reference()))
    return files


_LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")


def _site_path(repo_path: str) -> str | None:
    """Where a repository file lives on the site (``None``: it is not on the site)."""
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/"):]
    if repo_path.startswith("papers/"):
        return repo_path
    return None


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Rewrite repository-relative links of ``docs/`` pages to the site's layout."""
    src = page.file.src_uri
    repo_page = src if src.startswith("papers/") else f"docs/{src}"
    here = posixpath.dirname(src)

    def fix(m: re.Match) -> str:
        target = m[2]
        if "://" in target or target.startswith(("mailto:", "/")):
            return m[0]
        repo_target = posixpath.normpath(posixpath.join(posixpath.dirname(repo_page), target))
        site = _site_path(repo_target)
        if site is None:
            return m[0]
        return m[1] + posixpath.relpath(site, here or ".") + m[3]

    return _LINK.sub(fix, markdown)
