"""The proxy's bookkeeping: which request is where, and the loads that follow from it.

A request accepted by the proxy is a :class:`Ticket` that moves through
``admitted`` (prefilling) → ``pooled`` (waiting for a decode slot) → ``active`` (bound to a
replica for life) → ``done``; ``requeue`` sends an active ticket whose decode failed before its
first token back to the pool. The ledger keeps per replica g the KV load
``L_g = Σ_{i on g} (s_i + a_i)`` (a_i from decode's ``usage.completion_tokens``), the running
count n_g and a (G, B) slot table, builds the policy's :class:`ClusterState` and
:class:`PoolView` from them each tick and applies the returned :class:`Assignment`.

Invariant: ``finish`` counts each ticket once, and when no ticket is active every load, running
count and slot is back to zero. No I/O and no asyncio here: :mod:`.dispatch` drives it. Two hooks
tell the event-driven parts that work arrived, so nothing needs to poll an idle ledger:
``on_admit`` (a request was accepted: the loop-lag sampler of :mod:`.health` resumes) and
``on_pool`` (a ticket entered the pool, by :meth:`Ledger.enqueue` or :meth:`Ledger.requeue`: the
dispatcher, whose tick loop sleeps without a timer while the pool is empty, ticks).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from balanceroute.core.state import Assignment, ClusterState, PoolView

__all__ = ["Ledger", "NoReplica", "PoolFull", "Ticket"]

_SETTLE_LOOP = 32  # up to this many requests settle one by one, more in numpy (Ledger.settle)


class PoolFull(Exception):
    """The pool (prefilling + pooled requests) is at capacity."""


class NoReplica(Exception):
    """No decode replica is in service."""


@dataclass(slots=True, eq=False)
class Ticket:
    """One accepted request as the proxy tracks it (``rid`` is the id the policy sees)."""

    rid: int
    request_id: str
    state: str = "admitted"
    prompt_len: int = 0
    joined: float = 0.0
    lease_deadline: float = float("inf")
    replica: int = -1
    slot: int = -1
    age: int = 0
    decode_attempts: int = 0
    outcome: str = ""
    future: Any = None
    endpoint: str = ""
    created: float = 0.0
    first_token: bool = False
    first_token_at: float = 0.0  # monotonic time of the first decoded token (TPOT's start)
    first_token_tokens: int = 0  # completion tokens counted by then
    prompt_checked: bool = False
    failed_on: list[int] = field(default_factory=list)
    client_id: str = ""  # the client's X-Request-Id (sanitised), for the access log
    stream: bool = False
    pool_wait_s: float | None = None  # pooled until the replica that served it was picked
    output_cap: int | None = None  # the most output tokens it may get (None: unknown)


class Ledger:
    """Loads, slots and pool of G decode replicas with ``slots[g]`` = B_g each."""

    def __init__(self, slots: Sequence[int], *, pool_capacity: int) -> None:
        if not slots or min(slots) < 1:
            raise ValueError("every replica needs at least one slot")
        g_count = len(slots)
        self.capacity = np.asarray(slots, dtype=np.int64)
        self.pool_capacity = pool_capacity
        width = int(self.capacity.max())
        self.slot_rid = np.full((g_count, width), -1, dtype=np.int64)
        self._open = [list(range(int(b))) for b in slots]  # free slot indices per replica (heaps)
        self.slot_prompt = np.zeros((g_count, width), dtype=np.int64)
        # a_i and L_g as last brought up to date: the relay's per-token progress only notes the
        # ticket (_grown); settle() applies what grew since, the loads and slot_age views show it
        self._slot_age = np.zeros((g_count, width), dtype=np.int64)
        self._loads = np.zeros(g_count, dtype=np.int64)
        self._grown: set[Ticket] = set()
        self.num_active = np.zeros(g_count, dtype=np.int64)
        self.available = np.ones(g_count, dtype=bool)  # (changed by set_available only)
        self._slots_in_service = [int(b) for b in slots]  # B_g, or 0 out of service (free_list)
        self._in_service = g_count  # replicas available: admit's check without a numpy call
        self.pool: list[Ticket] = []
        self.prefilling = 0
        self.accepted = 0
        self.finished: Counter[str] = Counter()
        self.tickets: dict[int, Ticket] = {}
        self._caps: Counter[int | None] = Counter()  # the live tickets' output caps, counted
        self.step = 0
        self.relayed = 0  # completion tokens relayed: Σ of every a_i's growth (the metrics' counter)
        self._next_rid = 0
        # fills the tick's state with foreign load, budgets and speeds (Signals.reconcile), and
        # says whether it would now add anything (Signals.adds_state; see own_state)
        self.reconcile: Callable[[ClusterState], None] | None = None
        self.reconciles: Callable[[], bool] | None = None
        # called after a request is accepted (admit) / after a ticket enters the pool (enqueue,
        # requeue); see the module doc
        self.on_admit: Callable[[], None] | None = None
        self.on_pool: Callable[[], None] | None = None

    # ------------------------------------------------------------------ views
    @property
    def num_replicas(self) -> int:
        """G."""
        return int(self.capacity.shape[0])

    @property
    def loads(self) -> np.ndarray:
        """L_g = Σ_{i on g} (s_i + a_i) (G,), up to the last token relayed. Reading changes
        nothing (a copy while relayed growth is not settled yet: see :meth:`settle`)."""
        if not self._grown:
            return self._loads
        loads = self._loads.copy()
        for g, slot, age in self._unsettled():
            loads[g] += age - self._slot_age[g, slot]
        return loads

    @property
    def slot_age(self) -> np.ndarray:
        """a_i of the request in each slot (G, B), 0 for a free slot (as :attr:`loads`: a copy
        while growth is unsettled)."""
        if not self._grown:
            return self._slot_age
        ages = self._slot_age.copy()
        for g, slot, age in self._unsettled():
            ages[g, slot] = age
        return ages

    def _unsettled(self) -> list[tuple[int, int, int]]:
        """(replica, slot, a_i) of the requests whose growth is noted but not settled."""
        return [(t.replica, t.slot, t.age) for t in tuple(self._grown)  # (one C call: a snapshot)
                if t.state == "active" and t.replica >= 0]

    def settle(self) -> None:
        """Apply the growth :meth:`progress` noted since the last settle to ``slot_age`` and
        ``loads`` — once per request and tick instead of once per relayed token. Called where the
        ledger is changed (the event loop): the tick, before its inputs are built."""
        if not self._grown:
            return
        grown, self._grown = self._grown, set()
        age, loads = self._slot_age, self._loads
        if len(grown) <= _SETTLE_LOOP:  # every noted ticket is active: _release drops it from the set
            for t in grown:
                g, slot = t.replica, t.slot
                loads[g] += t.age - age[g, slot]
                age[g, slot] = t.age
            return
        n = len(grown)  # (many at once: a large cluster between two ticks, in numpy)
        rows = np.fromiter((t.replica for t in grown), dtype=np.int64, count=n)
        cols = np.fromiter((t.slot for t in grown), dtype=np.int64, count=n)
        ages = np.fromiter((t.age for t in grown), dtype=np.int64, count=n)
        np.add.at(loads, rows, ages - age[rows, cols])  # (rows repeat: add.at, not +=)
        age[rows, cols] = ages  # (each slot once)

    @property
    def in_flight(self) -> int:
        """Accepted requests that have not ended."""
        return len(self.tickets)

    def free_slots(self) -> np.ndarray:
        """B_g − n_g for replicas in service, 0 for those out of service (:meth:`free_list`)."""
        return np.array(self.free_list(), dtype=np.int64)

    def free_list(self, running: list[int] | None = None) -> list[int]:
        """B_g − n_g for replicas in service, 0 for those out of service, as Python ints, from
        ``running`` = ``num_active.tolist()`` (the tick's path: each numpy call there costs
        microseconds, from caches the relay's work has cleared)."""
        running = self.num_active.tolist() if running is None else running
        return [b - n if b else 0 for b, n in zip(self._slots_in_service, running, strict=True)]

    def imbalance(self) -> int:
        """I = G·M − Σ_g L_g on the current loads."""
        self.settle()
        loads = self._loads.tolist()  # (Python ints: per tick, cheaper than two numpy reductions)
        return len(loads) * max(loads) - sum(loads)

    # ------------------------------------------------------------ transitions
    def admit(self, request_id: str, *, endpoint: str = "", now: float = 0.0,
              output_cap: int | None = None) -> Ticket:
        """Accept a new request (state ``admitted``), which will generate at most ``output_cap``
        tokens (``None``: unknown); raises :class:`PoolFull` or :class:`NoReplica`."""
        if not self._in_service:
            raise NoReplica("no decode replica is in service")
        if self.prefilling + len(self.pool) >= self.pool_capacity:
            raise PoolFull(f"{self.prefilling + len(self.pool)} requests are already waiting")
        ticket = Ticket(rid=self._next_rid, request_id=request_id, endpoint=endpoint, created=now,
                        output_cap=output_cap)
        self._next_rid += 1
        self._caps[output_cap] += 1
        self.tickets[ticket.rid] = ticket
        self.prefilling += 1
        self.accepted += 1
        if self.on_admit is not None:
            self.on_admit()
        return ticket

    def enqueue(self, ticket: Ticket, prompt_len: int, now: float, lease_s: float) -> None:
        """Prefill answered: ``ticket`` joins the pool with s_i = ``prompt_len`` and a KV lease
        ending ``lease_s`` from ``now``."""
        if ticket.state != "admitted":
            raise ValueError(f"ticket {ticket.rid} is {ticket.state}, not admitted")
        self.prefilling -= 1
        ticket.state = "pooled"
        ticket.prompt_len = max(1, int(prompt_len))
        ticket.joined = now
        ticket.lease_deadline = now + lease_s
        self.pool.append(ticket)
        if self.on_pool is not None:
            self.on_pool()

    def requeue(self, ticket: Ticket, *, renew: tuple[float, float] | None = None) -> None:
        """Decode failed before the first token: free the slot and put the ticket back in the
        pool at its original place (it keeps its wait time and lease). ``renew = (now,
        wait_s)``: no KV is held for it (no prefill stage), so its bound is a pool wait again,
        ending ``wait_s`` from ``now`` — the failed attempt's time was not spent in the pool."""
        if ticket.state != "active":
            raise ValueError(f"ticket {ticket.rid} is {ticket.state}, not active")
        self._release(ticket)
        ticket.state = "pooled"
        if renew is not None:
            ticket.lease_deadline = renew[0] + renew[1]
        at = next((j for j, t in enumerate(self.pool) if t.joined > ticket.joined), len(self.pool))
        self.pool.insert(at, ticket)
        if self.on_pool is not None:
            self.on_pool()

    def rebind(self, ticket: Ticket, replica: int) -> None:
        """Move an active ticket that has no token yet to a free slot of ``replica``."""
        if ticket.state != "active" or ticket.age:
            raise ValueError(f"ticket {ticket.rid} cannot move: {ticket.state}, age {ticket.age}")
        self._release(ticket)
        self._bind(ticket, replica)

    def progress(self, ticket: Ticket, completion_tokens: int) -> None:
        """Decode reported a_i = ``completion_tokens``: L_g grows by the new tokens."""
        if ticket.state != "active" or completion_tokens <= ticket.age:
            return
        completion_tokens = int(completion_tokens)
        self.relayed += completion_tokens - ticket.age
        ticket.age = completion_tokens
        self._grown.add(ticket)  # into loads and slot_age at the next settle (the tick)

    def set_prompt(self, ticket: Ticket, prompt_len: int) -> None:
        """Replace an estimated s_i by the value decode reported."""
        prompt_len = max(1, int(prompt_len))
        if prompt_len == ticket.prompt_len:
            return
        if ticket.state == "active":
            self._loads[ticket.replica] += prompt_len - ticket.prompt_len
            self.slot_prompt[ticket.replica, ticket.slot] = prompt_len
        ticket.prompt_len = prompt_len

    def finish(self, ticket: Ticket, outcome: str) -> bool:
        """End ``ticket`` with ``outcome``, releasing whatever it holds. Returns ``False`` (and
        changes nothing) if it had already ended: every ticket ends exactly once."""
        if ticket.state == "done":
            return False
        if ticket.state == "active":
            self._release(ticket)
        elif ticket.state == "pooled":
            self.pool.remove(ticket)
        elif ticket.state == "admitted":
            self.prefilling -= 1
        ticket.state = "done"
        ticket.outcome = outcome
        del self.tickets[ticket.rid]
        caps = self._caps
        caps[ticket.output_cap] -= 1
        if not caps[ticket.output_cap]:
            del caps[ticket.output_cap]
        self.finished[outcome] += 1
        return True

    def output_cap(self) -> int | None:
        """The largest output cap of the live tickets (the c of ``ClusterState.output_cap``: no
        output exceeds it); ``None`` while one of them has none or there are none."""
        caps = self._caps
        if not caps or None in caps:
            return None
        return max(caps)  # type: ignore[type-var]

    def expire(self, now: float) -> list[Ticket]:
        """Take the pooled tickets whose KV lease has ended out of the pool (state
        ``expired``; the caller fails and then finishes them)."""
        late = [t for t in self.pool if t.lease_deadline <= now]
        if late:
            self.pool = [t for t in self.pool if t.lease_deadline > now]
            for t in late:
                t.state = "expired"
        return late

    def reprefill(self, ticket: Ticket) -> None:
        """``ticket`` missed its KV lease (taken out of the pool by :meth:`expire`, or placed
        but not yet forwarded): it goes back to ``admitted`` to be prefilled again, releasing
        any slot it holds."""
        if ticket.state == "active":
            if ticket.age:
                raise ValueError(f"ticket {ticket.rid} already has {ticket.age} tokens")
            self._release(ticket)
        elif ticket.state == "pooled":
            self.pool.remove(ticket)
        elif ticket.state != "expired":
            raise ValueError(f"ticket {ticket.rid} is {ticket.state}: nothing to prefill again")
        ticket.state = "admitted"
        ticket.lease_deadline = float("inf")
        self.prefilling += 1

    def set_available(self, replica: int, available: bool) -> None:
        """Take replica ``replica`` out of service (0 free slots to the policy) or back."""
        self.available[replica] = available
        self._slots_in_service[replica] = int(self.capacity[replica]) if available else 0
        self._in_service = sum(1 for b in self._slots_in_service if b)

    # ------------------------------------------------------------------- tick
    def own_state(self) -> bool:
        """Whether a tick's state is the ledger's alone: no ``reconcile`` hook, or one whose
        ``reconciles`` says it would add nothing now (no engine-reported load, KV budget or
        replica speed). Then a compiled tick may read the ledger's arrays directly
        (:mod:`.compiled_tick`)."""
        if self.reconcile is None:
            return True
        return self.reconciles is not None and not self.reconciles()

    def build_tick(self, now: float) -> tuple[ClusterState, PoolView] | None:
        """The policy's inputs, or ``None`` when the pool is empty or no slot is free."""
        if not self.pool:  # (first: a finished request wakes the tick with the pool empty)
            return None
        self.settle()
        free = self.free_slots()
        if not np.count_nonzero(free):
            return None
        rows, cols = np.nonzero(self.slot_rid >= 0)
        state = ClusterState(
            loads=self._loads.copy(), free_slots=free, num_active=self.num_active.copy(),
            step=self.step, now=now, active_replica=rows.astype(np.int64, copy=False),
            active_prompt=self.slot_prompt[rows, cols], active_age=self._slot_age[rows, cols],
            active_ids=self.slot_rid[rows, cols],
        )
        if self.reconcile is not None:  # engine-reported state (serving/signals.py): the one hook
            self.reconcile(state)
            if not state.free_slots.any():
                return None
        n = len(self.pool)
        view = PoolView(
            prompt_len=np.fromiter((t.prompt_len for t in self.pool), dtype=np.int64, count=n),
            wait=now - np.fromiter((t.joined for t in self.pool), dtype=np.float64, count=n),
            request_ids=np.fromiter((t.rid for t in self.pool), dtype=np.int64, count=n),
        )
        return state, view

    def apply(self, state: ClusterState, view: PoolView, decision: Assignment) -> list[Ticket]:
        """Bind the assigned pooled tickets to their replicas; returns them (``replica`` set).
        ``decision`` must be valid for ``state`` and ``view``
        (:func:`~balanceroute.core.state.validate_assignment`): the dispatcher checks it once,
        where the policy's decision enters, and decides a bad one by ``least_load`` instead."""
        return self.place(decision.pool_index.tolist(), decision.replica.tolist())

    def place(self, index: list[int], replica: list[int]) -> list[Ticket]:
        """Bind pooled ticket ``index[k]`` to replica ``replica[k]`` (a valid decision, checked
        by the caller) and count the tick; returns the placed tickets."""
        self.step += 1
        if not index:
            return []
        pool = self.pool
        placed = [pool[j] for j in index]
        for ticket, g in zip(placed, replica, strict=True):
            self._bind(ticket, g)
        taken = set(index)
        self.pool = [t for j, t in enumerate(pool) if j not in taken]
        return placed

    def _bind(self, ticket: Ticket, g: int) -> None:
        slot = heapq.heappop(self._open[g])  # the lowest free slot
        ticket.state = "active"
        ticket.replica = g
        ticket.slot = slot
        ticket.age = 0
        self.slot_rid[g, slot] = ticket.rid
        self.slot_prompt[g, slot] = ticket.prompt_len
        self._slot_age[g, slot] = 0
        self._loads[g] += ticket.prompt_len
        self.num_active[g] += 1

    def _release(self, ticket: Ticket) -> None:
        g, slot = ticket.replica, ticket.slot
        self._grown.discard(ticket)
        self._loads[g] -= ticket.prompt_len + self._slot_age[g, slot]  # what the loads hold of it
        self.num_active[g] -= 1
        self.slot_rid[g, slot] = -1
        heapq.heappush(self._open[g], slot)
        self.slot_prompt[g, slot] = 0
        self._slot_age[g, slot] = 0
        ticket.replica = ticket.slot = -1
        ticket.age = 0
