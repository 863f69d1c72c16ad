"""Checks the command line makes before any work: output paths that can be written, and
validation errors that name the flag (``--replicas=0 must be >= 1``), not the Python field
(``self.num_replicas=0``)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["flag_error", "output_dir", "output_file"]

_FIELD = re.compile(r"(?<![\w.-])(?:self\.)?(\w+)=")


def flag_error(exc: Exception, flags: Mapping[str, str]) -> ValueError:
    """``exc`` with every ``self.<field>=`` / ``<field>=`` of a field in ``flags`` renamed to
    its flag (``{"num_replicas": "--replicas"}``) and any other ``self.`` dropped."""

    def rename(m: re.Match[str]) -> str:
        return f"{flags.get(m.group(1), m.group(1))}="

    return ValueError(_FIELD.sub(rename, str(exc)).replace("self.", ""))


def _writable_dir(path: Path) -> bool:
    return os.access(path, os.W_OK | os.X_OK)


def output_file(path: str | os.PathLike | None, flag: str) -> None:
    """Raise a one-line ``ValueError`` naming ``flag`` unless ``path`` can be written as a file:
    not a directory, in an existing writable directory, not a read-only file. ``None`` and
    ``-`` (stdout) pass."""
    if path is None or os.fspath(path) == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {path}: is a directory; give a file name")
    parent = p.parent
    if not parent.exists():
        raise ValueError(f"{flag} {path}: the directory {parent} does not exist")
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: {parent} is not a directory")
    if p.exists() and not os.access(p, os.W_OK) or not p.exists() and not _writable_dir(parent):
        raise ValueError(f"{flag} {path}: not writable")


def output_dir(path: str | os.PathLike | None, flag: str) -> None:
    """Raise a one-line ``ValueError`` naming ``flag`` unless ``path`` is a writable directory
    or can be created as one (its nearest existing ancestor is a writable directory)."""
    if path is None:
        return
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            raise ValueError(f"{flag} {path}: exists and is not a directory")
        if not _writable_dir(p):
            raise ValueError(f"{flag} {path}: not writable")
        return
    ancestor = p.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{flag} {path}: {ancestor} is not a directory")
    if not _writable_dir(ancestor):
        raise ValueError(f"{flag} {path}: cannot create it ({ancestor} is not writable)")
