"""The progress line's time left, on a fake clock: extrapolated from work (not units), from
``start_work`` on (a predictor's fit is not extrapolated), cached units leave the work to do,
and a heartbeat line comes while nothing finishes."""

from __future__ import annotations

import io
import time

from balanceroute.progress import progress


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _bar(total: int, work_total: float | None = None, interval_s: float = 0.0):
    clock, stream = FakeClock(), io.StringIO()
    bar = progress(total, "simulating", "req", stream=stream, interval_s=interval_s, tty=False,
                   work_total=work_total, clock=clock, heartbeat=False)
    return bar, clock, stream


def _last(stream: io.StringIO) -> str:
    return stream.getvalue().splitlines()[-1]


def test_a_fit_before_the_work_is_not_extrapolated() -> None:
    bar, clock, stream = _bar(10, work_total=100)
    clock.now += 300  # e.g. brh-learned fits its predictor: five minutes, no work done
    bar.start_work()
    clock.now += 10
    bar.update(1, work=10)
    assert _last(stream) == "simulating: 1/10 req (10 %), 5m10s elapsed, ~1m30s left"
    # counted from the start (the old rule) it would read ~46m30s left


def test_the_time_left_weighs_units_by_their_work() -> None:
    bar, clock, stream = _bar(2, work_total=100)
    clock.now += 1
    bar.update(1, work=1)  # one short request done; the long one carries 99 % of the work
    assert _last(stream) == "simulating: 1/2 req (1 %), 1s elapsed, ~1m39s left"


def test_units_done_without_work_leave_the_work_to_do() -> None:
    bar, clock, stream = _bar(100, work_total=100)
    bar.skip(50, work=50)  # read from a cache, in no time
    clock.now += 10
    bar.update(10, work=10)
    assert _last(stream) == "simulating: 60/100 req (20 %), 10s elapsed, ~40s left"


def test_no_guess_under_one_percent_of_the_work_and_none_at_the_end() -> None:
    bar, clock, stream = _bar(1000, work_total=1000)
    clock.now += 5
    bar.update(9)
    assert "left" not in _last(stream)
    clock.now += 5
    bar.update(991)
    bar.close()
    assert _last(stream) == "simulating: 1,000/1,000 req (100 %), 10s elapsed"


def test_a_heartbeat_line_while_nothing_finishes() -> None:
    bar, clock, stream = _bar(4, interval_s=10.0)
    assert stream.getvalue() == "simulating: 0/4 req (0 %), 0s elapsed\n"  # at once
    clock.now += 9
    bar.beat()
    assert stream.getvalue().count("\n") == 1  # not due yet
    clock.now += 1
    bar.beat()
    assert _last(stream) == "simulating: 0/4 req (0 %), 10s elapsed"


def test_the_heartbeat_thread_prints_and_stops() -> None:
    stream = io.StringIO()
    bar = progress(4, "reproduce", "cells", stream=stream, interval_s=0.01, tty=False)
    deadline = time.monotonic() + 30  # generous: only that a line comes, not how fast
    while stream.getvalue().count("\n") < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    bar.close()
    assert stream.getvalue().count("\n") >= 3
    assert bar._beats is None
