"""Progress of long commands, the same way everywhere.

On a terminal: a tqdm bar on stderr. Elsewhere (``make``, CI, ``2> log``): one plain line on
stderr at most every ``interval_s`` seconds (and at the end), e.g.
``reproduce: 40/176 cells (23 %), 1m12s elapsed, ~3m55s left [servegen-r1 G=8]`` — never
bar frames with carriage returns. ``quiet=True`` (every command's ``--quiet``) prints neither.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["Progress", "add_quiet_arg", "progress"]


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Progress:
    """A counter towards ``total`` with an optional postfix label; see :func:`progress`."""

    def __init__(self, total: int, desc: str, unit: str, *, quiet: bool, stream: TextIO,
                 interval_s: float, tty: bool | None) -> None:
        self.total, self.desc, self.unit = int(total), desc, unit
        self.stream, self.interval_s = stream, interval_s
        self.n = 0
        self.postfix = ""
        self._bar: Any = None
        self._quiet = quiet
        self._start = self._last = time.monotonic()
        is_tty = stream.isatty() if tty is None else tty
        if not quiet and is_tty:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=desc, unit=unit, file=stream, dynamic_ncols=True)
        elif not quiet and self.total:
            self._line()  # a log says at once what started and how much there is to do

    def update(self, n: int = 1) -> None:
        """Count ``n`` more units done."""
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif not self._quiet and time.monotonic() - self._last >= self.interval_s:
            self._line()

    def set_postfix_str(self, text: str) -> None:
        """Name what is being worked on (shown on the bar, or in brackets on log lines)."""
        self.postfix = text
        if self._bar is not None:
            self._bar.set_postfix_str(text)

    def write(self, text: str) -> None:
        """A message line that does not garble the bar."""
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """End the bar, or print the final log line."""
        if self._bar is not None:
            self._bar.close()
        elif not self._quiet and self.n:
            self._line()

    def _line(self) -> None:
        self._last = now = time.monotonic()
        elapsed = now - self._start
        text = f"{self.desc}: {self.n:,}/{self.total:,} {self.unit}"
        if self.total:
            text += f" ({100 * self.n / self.total:.0f} %)"
        text += f", {_clock(elapsed)} elapsed"
        if 0 < self.n < self.total and 100 * self.n >= self.total:  # under 1 %: no honest guess
            text += f", ~{_clock(elapsed * (self.total - self.n) / self.n)} left"
        if self.postfix:
            text += f" [{self.postfix}]"
        print(text, file=self.stream, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(total: int, desc: str, unit: str = "it", *, quiet: bool = False,
             stream: TextIO | None = None, interval_s: float = 10.0,
             tty: bool | None = None) -> Progress:
    """Progress towards ``total`` ``unit``s: a bar on a terminal, periodic log lines elsewhere,
    nothing when ``quiet``. ``tty`` overrides the terminal check (tests)."""
    return Progress(total, desc, unit, quiet=quiet, stream=stream or sys.stderr,
                    interval_s=interval_s, tty=tty)


def add_quiet_arg(parser: Any) -> None:
    """``--quiet``/``-q`` with the one meaning every command gives it."""
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress (bar or log lines) and no notes; results, warnings and "
                             "errors still print")
