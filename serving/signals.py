"""Where the proxy's view of the world is reconciled: its own ledger, the engines' reports, the
replicas' fitted speed and KV budgets, merged in one place into the policy's
:class:`~balanceroute.core.state.ClusterState`.

The proxy is not the only writer: clients that bypass it, a second proxy, a restart that lost
the ledger. The engines report what they run (:mod:`.engine_readers`: vLLM ``/metrics``,
SGLang ``/v1/loads``); each report carries its age. Per replica g, with the last report taken
at t and ``own(t)`` the ledger at that moment:

    foreign_g  = max(0, reported_g(t) − own_g(t))        (KV tokens; running + waiting alike)
    reconciled = own_g(now) + foreign_g   while now − t <= max_age_s, else own_g(now)

Comparing the report with the ledger *as it was when the report came* keeps this proxy's own
requests that ended since out of the foreign part (no phantom load after a burst finishes);
a request the engine has not admitted yet counts as own, never as negative foreign load. The
policy sees plain arrays (reconciled ``loads``, ``num_active``, ``free_slots`` shrunk by foreign
running requests; ``kv_budget`` from the engines; ``step_*`` from the speed fit) and never
knows where a number came from. A reader that fails is counted; its replicas fall back to the
ledger once their last report is older than ``max_age_s``; the tick never waits for a reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import numpy as np

from balanceroute.core.state import ClusterState

from .engine_readers import EngineReader, EngineSample, group_targets
from .ledger import Ledger

__all__ = ["STALE_AFTER_POLLS", "EngineSample", "Signals", "build_readers"]

log = logging.getLogger("balanceroute.serving.signals")

STALE_AFTER_POLLS = 3.0
"""A report is trusted for this many poll intervals (``max_age_s``): one missed poll is
tolerated, two are not."""

_HAS_BUDGET = "kv_budget" in getattr(ClusterState, "__dataclass_fields__", {})
_HAS_STEP = "step_a" in getattr(ClusterState, "__dataclass_fields__", {})
_NO_BUDGET = np.iinfo(np.int64).max // 4  # a replica whose engine reports no budget


def build_readers(source: str, decode: Sequence[Any], client: httpx.AsyncClient, *,
                  timeout_s: float) -> list[EngineReader]:
    """One reader per decode server for ``source`` (``"vllm"``, ``"sglang"``; ``"off"``: none).
    ``decode`` are the config's :class:`~.config.DecodeReplica` entries."""
    if source == "off":
        return []
    from .engine_readers.sglang import SglangLoadsReader
    from .engine_readers.vllm import VllmMetricsReader

    kinds = {"vllm": VllmMetricsReader, "sglang": SglangLoadsReader}
    if source not in kinds:
        raise ValueError(f"{source=} must be 'off', 'vllm' or 'sglang'")
    groups = group_targets([(d.url, d.dp_rank) for d in decode])
    readers: list[EngineReader] = []
    for server, (url, targets) in enumerate(groups.items()):
        key = decode[targets[0].replica].api_key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        readers.append(kinds[source](client, url, targets, server=server, headers=headers, timeout_s=timeout_s))
    return readers


class Signals:
    """The reconciler: polls ``readers`` every ``poll_interval_s`` and fills the tick's state.

    ``speed_fit``: the replicas' online speed fit (an object with ``coefficients(now) -> (a, b,
    c)``, ``serving/speed_fit.py``); ``None`` leaves ``step_*`` unset. ``on_read(source, server,
    ok)`` is called after every read (the metrics counter).
    """

    def __init__(self, ledger: Ledger, readers: Sequence[EngineReader], *, poll_interval_s: float = 1.0,
                 max_age_s: float | None = None, speed_fit: Any = None,
                 on_read: Callable[[str, int, bool], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not poll_interval_s > 0:
            raise ValueError(f"{poll_interval_s=} must be > 0")
        g = ledger.num_replicas
        self.ledger = ledger
        self.readers = list(readers)
        self.poll_interval_s = poll_interval_s
        self.max_age_s = STALE_AFTER_POLLS * poll_interval_s if max_age_s is None else max_age_s
        self.speed_fit = speed_fit
        self.on_read = on_read
        self.clock = clock
        self.samples: list[EngineSample | None] = [None] * g
        self.own_load_at = np.zeros(g, dtype=np.int64)  # the ledger when each sample came
        self.own_running_at = np.zeros(g, dtype=np.int64)
        self.budget = np.full(g, -1, dtype=np.int64)  # -1: not reported (written by set_budget)
        self.block = np.ones(g, dtype=np.int64)  # its KV block, in tokens
        self._tick_budget = np.full(g, _NO_BUDGET, dtype=np.int64)  # what the tick plans against
        self._budgeted = False  # whether any budget is known: adds_state without a numpy call
        self.reads = 0
        self.failures = 0
        self._last_log = -math.inf
        self._task: asyncio.Task | None = None

    @property
    def enabled(self) -> bool:
        """Whether any engine is read."""
        return bool(self.readers)

    # ------------------------------------------------------------------ polling
    def absorb(self, samples: Sequence[EngineSample]) -> None:
        """Keep ``samples`` (the newest per replica) with the ledger as it is now."""
        led = self.ledger
        for s in samples:
            g = s.replica
            self.samples[g] = s
            self.own_load_at[g] = led.loads[g]
            self.own_running_at[g] = led.num_active[g]
            if s.kv_budget is not None and s.kv_budget > 0:
                self.set_budget(g, s.kv_budget, s.kv_block or 1)

    def set_budget(self, replica: int, tokens: int, block: int = 1) -> None:
        """Replica ``replica``'s KV budget is ``tokens`` (configured, or reported by its
        engine), allocated in blocks of ``block`` tokens per request; ``-1``: unknown again.
        The tick plans in tokens against ``tokens − B_g·(block − 1)`` (at least one token): each
        of the replica's B_g running requests may hold up to ``block − 1`` unused tokens of its
        last block, so a plan within it never needs more blocks than the engine has."""
        if self.budget[replica] == tokens and self.block[replica] == block:
            return  # (each engine poll reports it again)
        self.budget[replica] = tokens
        self.block[replica] = block
        self._budgeted = bool((self.budget >= 0).any())
        reserve = self.ledger.capacity * (self.block - 1)
        self._tick_budget = np.where(self.budget >= 0, np.maximum(self.budget - reserve, 1), _NO_BUDGET)
        self._tick_budget.flags.writeable = False  # every tick's state shares it: read-only

    async def poll_once(self) -> None:
        """Read every source once, concurrently; a failure is counted and logged (at most every
        30 s), never raised."""
        if not self.readers:
            return
        results = await asyncio.gather(*(r.read() for r in self.readers), return_exceptions=True)
        for reader, result in zip(self.readers, results, strict=True):
            ok = not isinstance(result, BaseException)
            if ok:
                self.reads += 1
                self.absorb(result)  # type: ignore[arg-type]
            else:
                self.failures += 1
                now = self.clock()
                if now - self._last_log >= 30.0:
                    self._last_log = now
                    log.warning("engine state: %s server %d unreadable (%d failures so far; its "
                                "replicas use the ledger once their last report is %.1f s old): %r",
                                reader.source, reader.server, self.failures, self.max_age_s, result)
            if self.on_read is not None:
                self.on_read(reader.source, reader.server, ok)

    def start(self) -> None:
        """Start the polling loop (nothing to do without readers)."""
        if self.readers and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="balanceroute-signals")

    async def stop(self) -> None:
        """Stop the polling loop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            try:
                await self.poll_once()
            except Exception:  # never let the loop die
                log.exception("engine state poll failed")

    # ---------------------------------------------------------------- reconcile
    def ages(self, now: float | None = None) -> np.ndarray:
        """Seconds since each replica's last report (``inf``: none yet)."""
        now = self.clock() if now is None else now
        return np.array([now - s.taken_at if s is not None else math.inf for s in self.samples])

    def foreign(self, now: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(foreign KV tokens, foreign running + waiting requests, report age) per replica; the
        foreign parts are 0 where the report is missing or older than ``max_age_s``."""
        age = self.ages(now)
        g = len(self.samples)
        load = np.zeros(g, dtype=np.int64)
        running = np.zeros(g, dtype=np.int64)
        for k, s in enumerate(self.samples):
            if s is None or not age[k] <= self.max_age_s:
                continue
            if s.kv_tokens is not None:
                load[k] = max(0, s.kv_tokens - int(self.own_load_at[k]))
            if s.running is not None:
                running[k] = max(0, s.running + (s.waiting or 0) - int(self.own_running_at[k]))
        return load, running, age

    def adds_state(self) -> bool:
        """Whether :meth:`reconcile` may change a tick's state: engine state is read, a KV budget
        is known (reported or configured) or replica speeds are fitted. ``False``: the ledger's
        state is the whole state (:meth:`~balanceroute.serving.ledger.Ledger.own_state`)."""
        return bool(self.readers) or (self.speed_fit is not None and _HAS_STEP) or (
            _HAS_BUDGET and self._budgeted)  # (per tick: no numpy call, which costs ~30 µs cold)

    def reconcile(self, state: ClusterState) -> None:
        """The ledger's hook: add foreign load and running requests to ``state`` (built from
        the ledger at ``state.now``), shrink its free slots, hand it budgets and speeds."""
        if self.readers:
            load, running, _ = self.foreign(state.now)
            if load.any() or running.any():
                state.loads = state.loads + load
                state.num_active = state.num_active + running
                state.free_slots = np.maximum(state.free_slots - running, 0)
        if _HAS_BUDGET and self._budgeted:  # reported, or configured (kv_budget)
            state.kv_budget = self._tick_budget
            # the requests' own max_tokens bound every output: BR plans each replica's KV until
            # all of its requests have ended (never a preemption), not over a fixed window
            state.output_cap = self.ledger.output_cap()
        if self.speed_fit is not None and _HAS_STEP:
            a, b, c = self.speed_fit.coefficients(state.now)
            state.step_a, state.step_b, state.step_c = a, b, c

    # ------------------------------------------------------------------ surface
    def replica_status(self, g: int, now: float | None = None) -> dict[str, Any]:
        """``/status`` fields of replica ``g``: its KV budget when known; with engine state,
        the last report (and its age), foreign and reconciled load."""
        budget = {"kv_budget": int(self.budget[g]), "kv_block_size": int(self.block[g]),
                  "kv_budget_planned": int(self._tick_budget[g])} if self.budget[g] >= 0 else {}
        if not self.readers:
            return budget
        load, running, age = self.foreign(now)
        s = self.samples[g]
        return {"engine": None if s is None else {
                    "running": s.running, "waiting": s.waiting, "kv_tokens": s.kv_tokens,
                    "kv_budget": s.kv_budget, "age_s": round(float(age[g]), 3),
                    "fresh": bool(age[g] <= self.max_age_s)},
                "foreign_kv_load": int(load[g]), "foreign_running": int(running[g]),
                "reconciled_kv_load": int(self.ledger.loads[g] + load[g]), **budget}

    def gauges(self) -> dict[str, tuple[str, Any]]:
        """Per-replica gauges for ``/metrics`` (name → (doc, one value per replica))."""
        budget = {"balanceroute_replica_kv_budget_tokens": (
            "KV token budget, reported by the engine or configured (-1: unknown).", self.budget.tolist())}
        if not self.readers:
            return budget if self._budgeted else {}
        load, running, age = self.foreign()
        return {**budget,
            "balanceroute_replica_foreign_kv_load_tokens": (
                "KV tokens the engine reports beyond this proxy's own (0 while the report is stale).",
                load.tolist()),
            "balanceroute_replica_foreign_running": (
                "Running + waiting requests the engine reports beyond this proxy's own.", running.tolist()),
            "balanceroute_replica_engine_report_age_seconds": (
                "Age of replica g's last engine report (+Inf: none yet).", age.tolist()),
            "balanceroute_replica_reconciled_kv_load_tokens": (
                "The KV load the policy sees: own + foreign.", (self.ledger.loads + load).tolist()),
        }
