"""Progress of long commands, the same way everywhere.

On a terminal: a tqdm bar on stderr. Elsewhere (``make``, CI, ``2> log``): one plain line on
stderr at once, then one every ``interval_s`` seconds — also while nothing finishes (a
heartbeat) — and at the end, e.g.
``reproduce: 40/176 cells (23 %), 1m12s elapsed, ~3m55s left [servegen-r1 G=8]`` — never
bar frames with carriage returns. ``quiet=True`` (every command's ``--quiet``) prints neither.

The time left is extrapolated from *work*, not from the count of units: a unit can carry its
own amount (``update(n, work=...)``: a simulated request its output tokens, a grid cell its
estimated cost), so long and short units weigh what they cost. The rate is measured from
``start_work()`` on (by default, from the start): what comes before it — imports, a
predictor's fit — is not extrapolated over the work. Units done without work (a cached cell,
``skip``) leave the work to do.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
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
    """A counter towards ``total`` units (and ``work_total`` work) with an optional postfix
    label; see :func:`progress`."""

    def __init__(self, total: int, desc: str, unit: str, *, quiet: bool, stream: TextIO,
                 interval_s: float, tty: bool | None, work_total: float | None = None,
                 clock: Callable[[], float] = time.monotonic, heartbeat: bool = True) -> None:
        self.total, self.desc, self.unit = int(total), desc, unit
        self.stream, self.interval_s = stream, interval_s
        self.n = 0
        self.work = 0.0
        self.work_total = float(self.total if work_total is None else work_total)
        self.postfix = ""
        self._bar: Any = None
        self._quiet = quiet
        self._clock = clock
        self._lock = threading.RLock()  # the heartbeat thread prints too
        self._start = self._last = clock()
        self._mark = (self._start, 0.0)  # (time, work) the rate is measured from
        self._stop = threading.Event()
        self._beats: threading.Thread | None = None
        is_tty = stream.isatty() if tty is None else tty
        if not quiet and is_tty:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=desc, unit=unit, file=stream, dynamic_ncols=True)
        elif not quiet and self.total:
            self._line()  # a log says at once what started and how much there is to do
            if heartbeat and interval_s > 0:
                self._beats = threading.Thread(target=self._beat_loop, name=f"progress {desc}",
                                               daemon=True)
                self._beats.start()

    def update(self, n: int = 1, *, work: float | None = None) -> None:
        """Count ``n`` more units done, carrying ``work`` (default ``n``) of the work."""
        with self._lock:
            self.n += n
            self.work += n if work is None else work
        if self._bar is not None:
            self._bar.update(n)
        elif not self._quiet and self._clock() - self._last >= self.interval_s:
            self._line()

    def skip(self, n: int = 1, *, work: float | None = None) -> None:
        """Count ``n`` units done without doing their ``work`` (e.g. read from a cache): they
        leave the work to do instead of speeding up the rate."""
        with self._lock:
            self.n += n
            self.work_total = max(self.work_total - (n if work is None else work), self.work)
        if self._bar is not None:
            self._bar.update(n)

    def start_work(self) -> None:
        """The time left is extrapolated from now on (call it when set-up is over)."""
        with self._lock:
            self._mark = (self._clock(), self.work)

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

    def beat(self) -> None:
        """The heartbeat: a line if none was printed for ``interval_s`` (log mode)."""
        if self._bar is None and not self._quiet and self.total and \
                self._clock() - self._last >= self.interval_s:
            self._line()

    def close(self) -> None:
        """End the bar, or print the final log line."""
        self._stop.set()
        if self._beats is not None:
            self._beats.join()
            self._beats = None
        if self._bar is not None:
            self._bar.close()
        elif not self._quiet and self.n:
            self._line()

    def time_left(self) -> float | None:
        """Seconds to go at the rate of the work done since :meth:`start_work`; ``None``
        before that work reaches 1 % of the work to do (no honest guess yet) or when done."""
        with self._lock:
            now, (since, base) = self._clock(), self._mark
            done, todo = self.work - base, self.work_total - self.work
            share = done / (self.work_total - base) if self.work_total > base else 0.0
        if todo <= 0 or done <= 0 or now <= since or share < 0.01:
            return None
        return todo * (now - since) / done

    def _beat_loop(self) -> None:
        while not self._stop.wait(max(self.interval_s / 4, 0.05)):
            self.beat()

    def _line(self) -> None:
        with self._lock:
            self._last = now = self._clock()
            text = f"{self.desc}: {self.n:,}/{self.total:,} {self.unit}"
            if self.work_total > 0:  # of the work to do; all skipped: of the units
                text += f" ({100 * min(self.work / self.work_total, 1.0):.0f} %)"
            elif self.total:
                text += f" ({100 * self.n / self.total:.0f} %)"
            text += f", {_clock(now - self._start)} elapsed"
            left = self.time_left() if self.n < self.total else None
            if left is not None:
                text += f", ~{_clock(left)} left"
            if self.postfix:
                text += f" [{self.postfix}]"
            print(text, file=self.stream, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(total: int, desc: str, unit: str = "it", *, quiet: bool = False,
             stream: TextIO | None = None, interval_s: float = 10.0,
             tty: bool | None = None, work_total: float | None = None,
             clock: Callable[[], float] = time.monotonic, heartbeat: bool = True) -> Progress:
    """Progress towards ``total`` ``unit``s: a bar on a terminal, log lines elsewhere (at once,
    then every ``interval_s``, from a heartbeat thread while nothing finishes), nothing when
    ``quiet``. ``work_total``: the work the units carry (default: one per unit), which the time
    left is extrapolated from. ``tty`` overrides the terminal check; ``clock`` and
    ``heartbeat=False`` are for tests."""
    return Progress(total, desc, unit, quiet=quiet, stream=stream or sys.stderr,
                    interval_s=interval_s, tty=tty, work_total=work_total, clock=clock,
                    heartbeat=heartbeat)


def add_quiet_arg(parser: Any) -> None:
    """``--quiet``/``-q`` with the one meaning every command gives it."""
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress (bar or log lines) and no notes; results, warnings and "
                             "errors still print")
