"""The command-line reference page, written from the argparse parsers themselves.

:func:`cli_reference` walks :func:`balanceroute.cli.build_parser` and prints each subcommand's
``--help`` at a fixed width, so the documentation site's "Command line" page is whatever the
installed CLI says (the site's build hook calls it; nothing is copied by hand).
"""

from __future__ import annotations

import argparse
import os

__all__ = ["cli_reference"]

_WIDTH = "100"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help(parser: argparse.ArgumentParser) -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = _WIDTH  # argparse wraps to $COLUMNS: fix it so the page is stable
    try:
        return parser.format_help().rstrip()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def cli_reference() -> str:
    """Markdown: the top-level help, then one section per subcommand (its help text, its
    description and its full ``--help``), in the order ``balanceroute --help`` lists them.
    Subcommands whose extra is not installed are missing from the parser, and so from the page."""
    from balanceroute.cli import build_parser

    parser = build_parser()
    subs = _subcommands(parser)
    helps = {a.dest: a.help for a in parser._actions
             if isinstance(a, argparse._SubParsersAction) for a in a._choices_actions}
    out = ["# Command line\n",
           "Generated from the argparse parsers when the site is built (`balanceroute.clidoc`): "
           "this page is what `balanceroute <command> --help` prints.\n",
           "| command | what it does |", "|---|---|"]
    out += [f"| [`{name}`](#{name}) | {helps.get(name) or ''} |" for name in subs]
    out += ["", "```text", _help(parser), "```", ""]
    for name, sub in subs.items():
        out += [f"## {name}\n", *([f"{helps[name]}.\n"] if helps.get(name) else []),
                "```text", _help(sub), "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(cli_reference())
