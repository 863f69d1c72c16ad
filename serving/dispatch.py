"""The scheduling loop: runs the policy's tick on pool arrivals, slot releases and, while a
request is pooled, a timer.

The period (``tick_interval_s``) runs only while the pool is non-empty: a pooled request may
reach the end of its lease, or be held by the policy, with nothing else happening. With an empty
pool a periodic tick has nothing to decide, so the loop waits for a wake-up without arming a
timer (an idle proxy spends no CPU on it); every way into the pool wakes it — the ledger's
``on_pool`` hook (:meth:`Ledger.enqueue`, :meth:`Ledger.requeue`) — as do slot releases and
changes of the replicas in service. While a request is pooled the ticks and their timing are
what they would be with the timer always armed.

The tick is synchronous numpy (build state → ``policy.assign`` → apply) and runs inline on the
event loop; its duration is recorded so ``/status`` and ``/metrics`` show that it stays far
below a decode step. A policy that declares a compiled tick (BR-0) is run as the simulator's
fused loop runs it: its kernel on the ledger's arrays (:mod:`.compiled_tick`), the same
decision without the generic path's per-tick objects, while the ledger's state is the whole
state. Requests wait for their replica on an ``asyncio.Future`` the tick resolves.

Fail small: lease expiry runs first, whatever the policy does; a policy that raises (or returns
an invalid assignment) is logged and counted, and that tick is decided by ``least_load``
instead. A retried request that the tick sends back to a replica it already failed on goes to
the least-loaded free replica it has not failed on, when there is one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import numpy as np

from balanceroute.core.policies.base import Policy
from balanceroute.core.policies.least_load import LeastLoadPolicy
from balanceroute.core.state import validate_assignment

from .compiled_tick import CompiledTickRunner
from .ledger import Ledger, Ticket

log = logging.getLogger("balanceroute.serving.dispatch")

__all__ = ["Dispatcher", "LeaseExpired"]


class LeaseExpired(Exception):
    """A pooled request reached its forward-by time (its prefill server's KV lease minus the
    transfer margin, :class:`~balanceroute.core.lease.LeaseRule`) before it was forwarded to
    decode: it must not be forwarded (prefill may free the KV before decode pulls it)."""


class Dispatcher:
    """Owns the :class:`Ledger` updates that need waking the tick, and the tick loop.

    ``on_tick(seconds, placed)`` is called after every tick that invoked the policy.
    ``compiled``: run the policy's declared compiled tick where it applies (default; ``False``:
    always ``policy.assign``, as for a policy that declares none).
    """

    def __init__(
        self,
        ledger: Ledger,
        policy: Policy,
        *,
        tick_interval_s: float,
        on_tick: Callable[[float, int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        compiled: bool = True,
    ) -> None:
        self.ledger = ledger
        self.policy = policy
        self.tick_interval_s = tick_interval_s
        self.on_tick = on_tick
        self.clock = clock
        self.tick_seconds = [0.0] * 4096  # the last 4096 ticks' durations (a ring; a list: no numpy per tick)
        self.ticks = 0
        self.imbalance_sum = 0.0
        self.policy_errors = 0
        self.compiled_ticks = 0  # ticks decided by the policy's compiled tick (CompiledTickRunner)
        self._runner = (CompiledTickRunner(policy, ledger.num_replicas)
                        if compiled and CompiledTickRunner.available() else None)
        self.fallback = LeastLoadPolicy()
        self._last_error_log = -float("inf")
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        ledger.on_pool = self.wake  # a request entering the pool (enqueue, requeue) is ticked

    def start(self) -> None:
        """Start the tick loop on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="balanceroute-tick")

    @property
    def stopped(self) -> bool:
        """Whether the tick loop was started and has ended (liveness and readiness check it)."""
        return self._task is not None and self._task.done()

    async def stop(self) -> None:
        """Stop the tick loop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def wake(self) -> None:
        """Ask for a tick at the next turn of the event loop (arrivals in the same turn are
        handled by one tick)."""
        self._wake.set()

    async def wait_for_slot(self, ticket: Ticket, prompt_len: int | None, lease_s: float) -> int:
        """Pool ``ticket`` (newly prefilled with s_i = ``prompt_len``, or ``None`` for a ticket
        that :meth:`Ledger.requeue` already put back) and wait for the replica a tick gives it.
        ``lease_s``: how long after now it may still be forwarded (``LeaseRule.forward_by_s``).

        Raises :class:`LeaseExpired` when that time comes first.
        """
        ticket.future = asyncio.get_running_loop().create_future()
        if prompt_len is not None:  # the ledger's on_pool hook wakes the tick (requeue's did)
            self.ledger.enqueue(ticket, prompt_len, self.clock(), lease_s)
        return await ticket.future

    def missed_lease(self, ticket: Ticket) -> bool:
        """Whether ``ticket`` is past its forward-by time now (checked again right before it is
        forwarded: the tick that placed it ran a moment earlier)."""
        return self.clock() >= ticket.lease_deadline

    def reprefill(self, ticket: Ticket) -> None:
        """``ticket`` missed its lease: back to prefilling (see :meth:`Ledger.reprefill`); a slot
        it held is free for the next tick."""
        self.ledger.reprefill(ticket)
        self.wake()

    def finish(self, ticket: Ticket, outcome: str) -> bool:
        """End ``ticket`` (exactly once; see :meth:`Ledger.finish`) and wake the tick."""
        if not self.ledger.finish(ticket, outcome):
            return False
        if ticket.future is not None and not ticket.future.done():
            ticket.future.cancel()
        self.wake()
        return True

    def tick(self) -> int:
        """Expire leases, then run one policy tick (``least_load`` if the policy fails) and
        resolve the placed tickets' futures."""
        now = self.clock()
        for ticket in self.ledger.expire(now):
            if ticket.future is not None and not ticket.future.done():
                ticket.future.set_exception(LeaseExpired(
                    f"request {ticket.request_id} waited {now - ticket.joined:.1f} s for a decode "
                    "slot: too long to forward within its prefill server's KV lease"))
        if not self.ledger.pool:  # (a finished request wakes the tick with the pool empty)
            return 0
        t0 = time.perf_counter()
        placed = self._compiled_tick(now)
        if placed is None:  # the generic path: the policy's assign on the state the ledger builds
            inputs = self.ledger.build_tick(now)
            if inputs is None:
                return 0
            state, view = inputs
            try:
                decision = self.policy.assign(state, view)
                validate_assignment(state, view, decision)
            except Exception as exc:  # a plug-in that throws degrades one tick, not the service
                self._policy_failed(now, exc, "least_load")
                decision = self.fallback.assign(state, view)
                validate_assignment(state, view, decision)  # the ledger applies only valid decisions
            placed = self.ledger.apply(state, view, decision)
        for ticket in placed:
            if ticket.replica in ticket.failed_on:
                self._steer_away(ticket)
        seconds = time.perf_counter() - t0
        self.tick_seconds[self.ticks % len(self.tick_seconds)] = seconds
        self.ticks += 1
        self.imbalance_sum += self.ledger.imbalance()
        for ticket in placed:
            if ticket.future is not None and not ticket.future.done():
                ticket.future.set_result(ticket.replica)
        if self.on_tick is not None:
            self.on_tick(seconds, len(placed))
        return len(placed)

    def _compiled_tick(self, now: float) -> list[Ticket] | None:
        """This tick by the policy's compiled tick (the placed tickets), or ``None`` for the
        generic path: no runner, a state beyond the ledger's own, no declared tick, no free
        slot — or a failure, counted and logged like a policy's (the generic path then decides
        the tick, and the runner stays off)."""
        runner = self._runner
        if runner is None or not self.ledger.own_state():
            return None
        try:
            decision = runner.decide(self.ledger, now)
        except Exception as exc:
            self._runner = None
            self._policy_failed(now, exc, "the policy's assign from now on")
            return None
        if decision is None:
            return None
        self.compiled_ticks += 1
        return self.ledger.place(*decision)

    def _policy_failed(self, now: float, exc: Exception, instead: str) -> None:
        self.policy_errors += 1
        if now - self._last_error_log >= 10.0:
            self._last_error_log = now
            log.error("policy %s failed (%d so far); this tick uses %s: %r",
                      getattr(self.policy, "name", "?"), self.policy_errors, instead, exc)

    def _steer_away(self, ticket: Ticket) -> None:
        free = self.ledger.free_slots()
        options = [g for g in np.flatnonzero(free > 0).tolist() if g not in ticket.failed_on]
        if options:
            self.ledger.rebind(ticket, min(options, key=lambda g: (self.ledger.loads[g], g)))

    def tick_stats(self) -> dict[str, float]:
        """Tick count and P50/P99/max duration in microseconds over the last 4096 ticks."""
        n = min(self.ticks, len(self.tick_seconds))
        if n == 0:
            return {"count": 0, "p50_us": 0.0, "p99_us": 0.0, "max_us": 0.0}
        window = np.array(self.tick_seconds[:n]) * 1e6
        p50, p99 = np.percentile(window, [50, 99])
        return {"count": self.ticks, "p50_us": float(p50), "p99_us": float(p99),
                "max_us": float(window.max())}

    async def _run(self) -> None:
        # No asyncio.wait_for here: on Python < 3.12 it can swallow a cancellation that races
        # with the event being set, and the loop would never stop.
        loop = asyncio.get_running_loop()
        while True:
            # the period only while a request is pooled; an empty pool waits for a wake-up
            timer = loop.call_later(self.tick_interval_s, self._wake.set) if self.ledger.pool else None
            try:
                await self._wake.wait()
            finally:
                if timer is not None:
                    timer.cancel()
            self._wake.clear()
            try:
                self.tick()
            except Exception:  # never let the loop die: the next wake-up ticks again
                self.policy_errors += 1
                log.exception("scheduling tick failed")
