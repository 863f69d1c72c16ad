"""Start-up of the ``balanceroute`` command: ``--version``, ``--help`` and argument errors import
no numba (a fresh interpreter each), and the lazily filled subcommands parse exactly as the
modules register them."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from balanceroute.cli import COMMAND_MODULES, COMMANDS, build_parser

#: Runs ``main`` on argv in a fresh interpreter; prints the heavy modules it imported.
_CHILD = """
import sys
from balanceroute.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("numba", "llvmlite", "numpy") if m in sys.modules)
print("IMPORTED", ",".join(heavy), "EXIT", code, file=sys.stderr)
"""


def _run(*argv: str) -> tuple[str, set[str], int]:
    out = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True,
                         timeout=120, check=False)
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("IMPORTED"), out.stderr
    _, heavy, _, code = last.split(" ")
    return out.stdout, set(filter(None, heavy.split(","))), int(code)


@pytest.mark.parametrize("argv, code", [
    (["--version"], 0),
    (["--help"], 0),
    ([], 2),
    (["no-such-command"], 2),
])
def test_top_level_imports_neither_numba_nor_numpy(argv, code) -> None:
    stdout, heavy, exit_code = _run(*argv)
    assert exit_code == code
    assert heavy == set(), f"{argv} imported {heavy}"
    if argv == ["--version"]:
        from balanceroute import __version__

        assert stdout.strip() == f"balanceroute {__version__}"
    if argv == ["--help"]:
        assert all(name in stdout for name in COMMANDS)


@pytest.mark.parametrize("argv", [["simulate", "--bogus"], ["bench", "--help"],
                                  ["gap", "--help"], ["serve", "--bogus"], ["reproduce", "--help"]])
def test_subcommand_help_and_argument_errors_import_no_numba(argv) -> None:
    _, heavy, exit_code = _run(*argv)
    assert exit_code == (0 if "--help" in argv else 2)
    assert "numba" not in heavy and "llvmlite" not in heavy


def _registered() -> argparse.ArgumentParser:
    """The parser as the modules register it, every command filled at once."""
    parser = argparse.ArgumentParser(prog="balanceroute")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_the_command_table_matches_the_modules() -> None:
    sub = _subparsers(_registered())
    assert list(sub.choices) == list(COMMANDS)
    helps = {action.dest: action.help for action in sub._choices_actions}
    for name, (_, help_text) in COMMANDS.items():
        assert helps[name] == help_text, name
        assert sub.choices[name]._defaults["handler"].__module__.startswith("balanceroute.")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_lazily_filled_command_is_the_registered_one(name) -> None:
    full = _subparsers(_registered()).choices[name]
    lazy = _subparsers(build_parser()).choices[name]
    assert lazy.format_help() == full.format_help()
    assert lazy._defaults == full._defaults
    assert [a.option_strings for a in lazy._actions] == [a.option_strings for a in full._actions]
