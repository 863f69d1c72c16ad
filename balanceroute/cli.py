"""The ``balanceroute`` command line.

Each area contributes its subcommands from its own ``cli`` module (``register(subparsers)``),
so this file only assembles them. Start-up stays light: ``--version``, ``--help`` and an unknown
command read only :data:`COMMANDS`; a command's module (with numpy, numba, ...) is imported
when that command is parsed, and its handler imports the rest.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

#: Every subcommand, in ``--help`` order: name -> (the module whose ``register`` adds it, the
#: one-line help ``--help`` lists). A test holds this table against the modules.
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("balanceroute.analysis.cli", "simulate one policy on a workload"),
    "compare": ("balanceroute.analysis.cli", "compare policies on the same workload and seed"),
    "workloads": ("balanceroute.analysis.cli", "list the bundled workloads"),
    "bench": ("balanceroute.analysis.cli",
              "time the routing tick and the simulator on this machine"),
    "predictors": ("balanceroute.analysis.cli",
                   "calibration of the termination predictors (held out)"),
    "tune": ("balanceroute.analysis.cli",
             "search BR-H's H, gamma, beta, S_greedy on the training split"),
    "quality": ("balanceroute.analysis.cli",
                "the decision-quality matrix and its acceptance rules"),
    "foreign": ("balanceroute.analysis.cli",
                "load the router did not send: foreign traffic, two routers, a restart (simulated)"),
    "reproduce": ("balanceroute.analysis.cli",
                  "regenerate every table and figure next to the paper's"),
    "report": ("balanceroute.analysis.cli",
               "rewrite the generated numbers of README.md and docs/ from the committed CSVs"),
    "gap": ("balanceroute.solvers.cli", "optimality gap of the heuristics against exact solvers"),
    "serve": ("balanceroute.serving.cli",
              "run the BalanceRoute proxy in front of vLLM / vllm-ascend PD replicas"),
    "emulate": ("balanceroute.serving.cli",
                "run an emulated PD cluster (prefill + G lock-step DP decode replicas)"),
    "loadgen": ("balanceroute.serving.cli",
                "replay a workload against an OpenAI endpoint and report TTFT/TPOT/throughput"),
}

#: Modules that add subcommands, in the order they appear in ``--help``.
COMMAND_MODULES = tuple(dict.fromkeys(module for module, _ in COMMANDS.values()))


class _LazyParser(argparse.ArgumentParser):
    """A subcommand's parser that gets its arguments from its module on first use (parsing,
    usage or help), so building the top-level parser imports none of the commands."""

    def __init__(self, *args: Any, fill: Callable[[argparse.ArgumentParser], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fill = fill

    def _filled(self) -> None:
        if self._fill is not None:
            fill, self._fill = self._fill, None
            fill(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._filled()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._filled()
        return super().format_usage()

    def format_help(self) -> str:
        self._filled()
        return super().format_help()


class _OneCommand:
    """What a module's ``register`` is handed when one of its commands is filled in:
    ``add_parser`` returns that command's (lazy) parser, and a scratch parser, dropped, for the
    module's other commands."""

    #: ``add_parser`` keywords that are plain parser attributes (``help`` is the table's).
    SETTABLE = frozenset({"description", "epilog", "usage", "formatter_class",
                          "argument_default", "allow_abbrev", "conflict_handler"})

    def __init__(self, name: str, parser: argparse.ArgumentParser) -> None:
        self.name, self.parser = name, parser

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """The parser to add ``name``'s arguments to."""
        if name != self.name:
            return argparse.ArgumentParser(prog=name, add_help=False)
        kwargs.pop("help", None)
        unknown = set(kwargs) - self.SETTABLE
        if unknown:
            raise TypeError(f"add_parser({name!r}) got {sorted(unknown)}, which a lazily filled "
                            "parser cannot take")
        for key, value in kwargs.items():
            setattr(self.parser, key, value)
        return self.parser


def _fill_command(name: str, module: str) -> Callable[[argparse.ArgumentParser], None]:
    def fill(parser: argparse.ArgumentParser) -> None:
        importlib.import_module(module).register(_OneCommand(name, parser))

    return fill


class CliError(Exception):
    """A user error: printed as ``balanceroute: error: ...`` with exit status 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="balanceroute",
        description="Barrier-aware routing for data-parallel LLM decoding (BalanceRoute).",
    )
    parser.add_argument("--version", action="version", version="%(prog)s " + _version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_LazyParser)
    for name, (module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, fill=_fill_command(name, module))
    return parser


def _version() -> str:
    from balanceroute import __version__

    return __version__


def _flagged(exc: Exception, parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """``exc``'s message, a leading field named like one of the command's options (``url=``
    for ``--url``) spelled as that option, and no ``self.``."""
    import re

    text = str(exc)
    match = re.match(r"(?:self\.)?(\w+)=", text)
    for action in parser._actions if match else ():
        if isinstance(action, argparse._SubParsersAction) and args.command in action.choices:
            flags = {a.dest: max(a.option_strings, key=len) for a in action.choices[args.command]._actions
                     if a.option_strings}
            if match.group(1) in flags:  # type: ignore[union-attr]
                text = f"{flags[match.group(1)]}={text[match.end():]}"  # type: ignore[union-attr]
    return text.replace("self.", "")


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush into a closed pipe is silent."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        status = int(args.handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return status
    except BrokenPipeError:  # `balanceroute simulate ... | head`: stop quietly, as cat does
        _quiet_stdout()
        return 141
    except (CliError, ValueError) as exc:
        print(f"balanceroute: error: {_flagged(exc, parser, args)}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file that cannot be read or written: one line, no traceback
        where = f": {exc.filename}" if exc.filename else ""
        print(f"balanceroute: error: {exc.strerror or exc}{where}", file=sys.stderr)
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
