"""An idle proxy arms no timer: the dispatcher ticks only while a request is pooled, and the
loop-lag sampler runs only while a request is in flight or probes are on.

Every test runs on :class:`VirtualLoop`, an asyncio loop whose clock is virtual: when nothing is
ready it jumps straight to the next timer instead of sleeping, so an hour of idle time takes a
few milliseconds, and the answers (tick counts, timers armed, when a lease ran out) are exact —
nothing here depends on how fast the machine is. A loop with nothing ready, no timer and no I/O
raises instead of hanging.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from balanceroute.core.policies.least_load import LeastLoadPolicy
from balanceroute.serving.dispatch import Dispatcher, LeaseExpired
from balanceroute.serving.ledger import Ledger, Ticket

from .conftest import assert_drained, mock_proxy, pd_config, prefill_reply, sse_stream

HOUR = 3600.0
LEASE = 10 * HOUR  # a requeued ticket keeps its lease: long enough to outlast the idle hours


class _JumpSelector(selectors.BaseSelector):
    """A real selector that never waits: with nothing ready it moves the virtual clock on by
    the timeout instead."""

    def __init__(self, loop_clock: list[float]) -> None:
        self._real = selectors.DefaultSelector()
        self._clock = loop_clock

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # nothing ready, no timer: only a thread could still wake the loop
            ready = self._real.select(30.0)
            if not ready:
                raise RuntimeError("virtual loop: nothing ready, no timer and no I/O (deadlock)")
            return ready
        self._clock[0] += timeout
        return []

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on a virtual clock that records every timer armed on it (``armed``)."""

    def __init__(self) -> None:
        self._now = [1000.0]
        super().__init__(selector=_JumpSelector(self._now))
        self.armed: list[tuple[asyncio.TimerHandle, str]] = []  # (timer, what it calls)

    def time(self) -> float:
        return self._now[0]

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any,
                context: Any = None) -> asyncio.TimerHandle:  # call_later comes through here too
        handle = super().call_at(when, callback, *args, context=context)
        self.armed.append((handle, getattr(callback, "__qualname__", repr(callback))))
        return handle


def run_virtual(main: Callable[[VirtualLoop], Awaitable[Any]]) -> Any:
    """Run ``main(loop)`` to completion on a fresh :class:`VirtualLoop`."""
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def idle_for(loop: VirtualLoop, seconds: float) -> list[str]:
    """Let ``seconds`` of virtual time pass; returns what the timers others armed meanwhile
    call."""
    start = len(loop.armed)
    done = loop.create_future()
    own = loop.call_later(seconds, done.set_result, None)
    await done
    return [what for h, what in loop.armed[start:] if h is not own]


async def next_turns(n: int = 3) -> None:
    """Let the loop run what is ready now, without any virtual time passing."""
    for _ in range(n):
        await asyncio.sleep(0)


def counting(dispatcher: Dispatcher) -> list[float]:
    """The virtual time of every tick the dispatcher's loop runs, as it runs
    (``Dispatcher.ticks`` counts only the ticks that called the policy)."""
    calls: list[float] = []
    real = dispatcher.tick

    def tick() -> int:
        calls.append(dispatcher.clock())
        return real()

    dispatcher.tick = tick  # type: ignore[method-assign]
    return calls


def dispatcher(loop: VirtualLoop, slots: list[int], tick_interval_s: float = 0.05) -> Dispatcher:
    return Dispatcher(Ledger(slots, pool_capacity=16), LeastLoadPolicy(), tick_interval_s=tick_interval_s,
                      clock=loop.time)


# ---------------------------------------------------------------- (a) the dispatcher idles
def test_an_idle_dispatcher_does_not_tick() -> None:
    async def main(loop: VirtualLoop) -> tuple[int, list]:
        disp = dispatcher(loop, [2, 2])
        ticks = counting(disp)
        disp.start()
        try:
            others = await idle_for(loop, HOUR)
        finally:
            await disp.stop()
        return len(ticks), others

    ticks, armed = run_virtual(main)
    # the periodic tick used to run on an empty pool: 72,000 ticks in this hour
    assert ticks == 0, f"{ticks} ticks in an idle hour"
    assert armed == [], f"{len(armed)} timers armed in an idle hour"


# ------------------------------------------------- (b) every way into the pool wakes the tick
def test_a_request_enqueued_or_requeued_while_idle_is_ticked_and_placed() -> None:
    async def main(loop: VirtualLoop) -> None:
        disp = dispatcher(loop, [1, 1])
        led = disp.ledger
        ticks = counting(disp)
        disp.start()
        try:
            await idle_for(loop, HOUR)
            # a request in the pool (only the ledger touched: its on_pool hook must wake the tick)
            a = led.admit("a", now=loop.time())
            led.enqueue(a, 100, loop.time(), LEASE)
            t0 = loop.time()
            await next_turns()
            assert loop.time() == t0  # no period needed: ticked at the next turn
            assert (a.state, a.replica, led.pool, len(ticks)) == ("active", 0, [], 1), (a.state, len(led.pool))
            # the path a request takes (Dispatcher.wait_for_slot): placed on the free replica
            b = led.admit("b", now=loop.time())
            assert await disp.wait_for_slot(b, 50, LEASE) == 1
            assert loop.time() == t0 and len(ticks) == 2

            await idle_for(loop, HOUR)  # both active, the pool empty: idle again
            assert len(ticks) == 2
            # a decode that failed before its first token: back to the pool, its slot freed
            led.requeue(a)
            await next_turns()
            assert loop.time() == t0 + HOUR
            assert (a.state, a.replica, led.pool, len(ticks)) == ("active", 0, [], 3), (a.state, len(led.pool))
            # a retry as the decode stage does it: requeue, then wait for the slot
            b.failed_on.append(1)
            led.requeue(b)
            assert await disp.wait_for_slot(b, None, LEASE) == 1  # the only free slot
            assert loop.time() == t0 + HOUR and not led.pool
            for t in (a, b):
                disp.finish(t, "ok")
            await next_turns()
            assert led.in_flight == 0 and not led.loads.any()
            ticked = len(ticks)
            await idle_for(loop, HOUR)
            assert len(ticks) == ticked
        finally:
            await disp.stop()

    run_virtual(main)


def test_a_pooled_request_keeps_the_period_lease_expiry_included() -> None:
    """While a request is pooled the tick runs every tick_interval_s as before: a request
    waiting for a full replica has its lease checked each period and fails at the first tick
    past its forward-by time; then the pool is empty and the ticks stop."""

    async def main(loop: VirtualLoop) -> tuple[list[float], float, BaseException | None]:
        disp = dispatcher(loop, [1], tick_interval_s=0.05)
        led = disp.ledger
        ticks = counting(disp)
        disp.start()
        try:
            busy = led.admit("busy")
            assert await disp.wait_for_slot(busy, 10, 30.0) == 0  # holds the only slot
            waiting = led.admit("waiting")
            t0 = loop.time()
            before = len(ticks)
            task = asyncio.ensure_future(disp.wait_for_slot(waiting, 10, 0.33))
            await idle_for(loop, HOUR)
            assert waiting.state == "expired" and not led.pool
            disp.reprefill(waiting)
            disp.finish(waiting, "lease_expired")
            disp.finish(busy, "ok")
            return [round(t - t0, 6) for t in ticks[before:]], waiting.joined - t0, task.exception()
        finally:
            await disp.stop()

    times, joined, error = run_virtual(main)
    assert joined == 0.0 and isinstance(error, LeaseExpired), error
    pooled = [round(0.05 * k, 6) for k in range(8)]  # the wake-up, then 0.05 ... 0.35: expired at 0.35
    assert times[:8] == pooled, times[:8]
    # and none in the rest of the hour, the pool empty
    assert len(times) == 8, f"{len(times) - 8} ticks after the pool emptied, the last at {times[-1]:.2f} s"


# ------------------------------------------------------------ (c) an idle proxy arms no timer
class Upstream:
    """Prefill and decode answer at once (three tokens)."""

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.host.startswith("p"):
            return prefill_reply(5)
        return httpx.Response(200, content=b"".join(sse_stream(3)), headers={"content-type": "text/event-stream"})


def test_an_idle_proxy_with_probes_off_arms_no_timer() -> None:
    async def main(loop: VirtualLoop) -> dict[str, Any]:
        async with mock_proxy(pd_config(health_interval_s=0), Upstream()) as (client, proxy):
            await idle_for(loop, 1.0)  # start-up settles
            out: dict[str, Any] = {"idle": await idle_for(loop, 60.0),
                                   "parked": getattr(proxy.members.lag, "parked", None),
                                   "lag": proxy.members.lag.last}
            samples = len(proxy.members.lag.samples)
            resp = await client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 3})
            out["status"] = resp.status_code
            out["text"] = resp.json()["choices"][0]["text"]
            out["sampled"] = len(proxy.members.lag.samples) - samples  # the request woke the sampler
            await idle_for(loop, 1.0)  # the sampler parks after its next sample
            out["idle after"] = await idle_for(loop, 60.0)
            out["parked after"] = getattr(proxy.members.lag, "parked", None)
            assert_drained(proxy)
        return out

    out = run_virtual(main)
    # before: the tick's period (10 ms here) and the lag sampler's 50 ms sleep, 7,200 timers
    assert out["idle"] == [], f"{len(out['idle'])} timers armed in an idle minute: {sorted(set(out['idle']))}"
    assert out["parked"] and out["lag"] == 0.0
    assert (out["status"], out["text"]) == (200, " t0 t1 t2")
    assert out["sampled"] >= 1
    assert out["idle after"] == [] and out["parked after"]


def test_probes_on_keep_the_lag_sampler_running() -> None:
    async def main(loop: VirtualLoop) -> tuple[bool, int, float]:
        async with mock_proxy(pd_config(health_interval_s=2.0), Upstream()) as (_, proxy):
            await idle_for(loop, 1.013)  # off the 50 ms grid: the window holds exactly 200 samples
            samples = len(proxy.members.lag.samples)
            await idle_for(loop, 10.0)
            lag = proxy.members.lag
            return getattr(lag, "parked", False), len(lag.samples) - samples, lag.last

    parked, sampled, lag = run_virtual(main)
    assert not parked and lag < 1e-9
    assert sampled == 200, sampled  # every 50 ms: a probe is judged against the lag it saw


def test_the_ledger_hooks_fire_after_the_transition() -> None:
    """``on_admit`` on admission, ``on_pool`` on enqueue and on requeue, each after the ticket
    moved (a hook sees it where it now is)."""
    seen: list[tuple[str, int]] = []
    led = Ledger([1], pool_capacity=4)
    led.on_admit = lambda: seen.append(("admit", led.in_flight))
    led.on_pool = lambda: seen.append(("pool", len(led.pool)))
    t: Ticket = led.admit("a")
    led.enqueue(t, 10, 0.0, 30.0)
    state, view = led.build_tick(0.0)  # type: ignore[misc]
    led.apply(state, view, LeastLoadPolicy().assign(state, view))
    led.requeue(t)
    assert seen == [("admit", 1), ("pool", 1), ("pool", 1)]
