"""The ``balanceroute`` command line.

Each area contributes its subcommands from its own ``cli`` module (``register(subparsers)``),
so this file only assembles them; handlers import their heavy dependencies lazily.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: Modules that add subcommands, in the order they appear in ``--help``.
COMMAND_MODULES = (
    "balanceroute.analysis.cli",
    "balanceroute.solvers.cli",
    "balanceroute.serving.cli",
)


class CliError(Exception):
    """A user error: printed as ``balanceroute: error: ...`` with exit status 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="balanceroute",
        description="Barrier-aware routing for data-parallel LLM decoding (BalanceRoute).",
    )
    parser.add_argument("--version", action="version", version="%(prog)s " + _version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith(name):
                continue
            raise
        module.register(sub)
    return parser


def _version() -> str:
    from balanceroute import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except (CliError, ValueError, FileNotFoundError) as exc:
        print(f"balanceroute: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(
            f"balanceroute: error: {exc}. Install the extra that provides it, "
            "e.g. pip install 'balanceroute[all]'",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
