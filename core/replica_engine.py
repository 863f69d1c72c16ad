"""What each decode replica's engine does with the requests routed to it.

The router places a request on replica g; the engine there decides when it runs. With no KV
budget and equal replicas this is §1's model exactly (every routed request runs at once, the step
lasts b + max_g(a·L_g + c·n_g)); :func:`~balanceroute.core.simulator.simulate` then does not use
this module at all. With a per-replica KV token budget B^KV_g or per-replica step coefficients the
simulator's generic loop hands its steps to a :class:`ReplicaEngine`, which behaves like vLLM v1's
scheduler (``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``) under the FCFS policy:

* **Waiting queue.** A routed request joins the tail of its replica's waiting queue. Each step the
  engine first checks the running set: while the running requests' KV exceeds the budget it
  *preempts the newest running request* (vLLM: ``self.running.pop()`` when ``allocate_slots``
  fails), frees its KV and puts it back at the *head* of the waiting queue. Only in a step without
  a preemption does it admit waiting requests, in order, while the next one's KV fits (vLLM:
  ``if not preempted_reqs`` … ``break`` at the first request that cannot be allocated). A replica
  with nothing running always admits its head request (so a request larger than the budget still
  runs, alone).
* **Recompute.** A preempted request loses its KV (vLLM's recompute preemption: its
  ``num_computed_tokens`` returns to 0) and, when admitted again, recomputes its s_i + a_i tokens
  locally — on a decode replica a local prefill. Cost model: that step of replica g takes
  ``recompute_s_per_token`` seconds per recomputed token on top of its decode work (the whole
  recompute in one step: chunked prefill would spread the same work over several steps); the
  barrier makes every replica wait for it.
* **Step time.** τ_g = b_g + a_g·L_g + c_g·n_g (+ recompute), over the *running* requests; the
  barrier step is τ = max_g τ_g, and a replica with nothing running still pays b_g (DP ranks run
  a dummy batch to stay in the collective).

The policy sees the router's view: a request counts on its replica (a slot and its s_i + a_i
tokens) from the tick that routed it until it finishes, waiting or not — what the proxy's ledger
knows. The barrier metrics (I(k), M(k)) are taken on the running requests' KV.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._jit import HAVE_NUMBA, njit
from .dynamics import StepModel

__all__ = ["RECOMPUTE_S_PER_TOKEN", "CompiledReplicaEngine", "EngineStep", "ReplicaEngine",
           "engine_class"]

RECOMPUTE_S_PER_TOKEN = 5.0e-5
"""Seconds a replica spends per token it recomputes after a preemption (a local prefill at
20,000 tokens/s: a 12k-token request costs its replica — and the barrier — 0.6 s)."""


@dataclass(slots=True)
class EngineStep:
    """One step's record: barrier numbers on the running KV, the step time and who finished."""

    envelope: int
    total: int
    imbalance: int
    tau: float
    time_idle: float  # Σ_g (τ − τ_g): replica-seconds spent waiting at the barrier
    active: int
    started: NDArray[np.int64]  # requests that produced their first token this step
    finished: NDArray[np.int64]


class ReplicaEngine:
    """Per-replica waiting queues, running sets, KV budgets, preemption and step times.

    ``budget``: (G,) KV tokens per replica or ``None`` (unbounded); ``steps``: one
    :class:`StepModel` per replica; ``recompute_s_per_token``: the recompute cost above.
    """

    def __init__(self, prompt: NDArray[np.int64], output: NDArray[np.int64], num_replicas: int,
                 budget: NDArray[np.int64] | None, steps: tuple[StepModel, ...],
                 recompute_s_per_token: float = RECOMPUTE_S_PER_TOKEN) -> None:
        n = prompt.shape[0]
        self.prompt, self.output = prompt, output
        self.g_count = num_replicas
        self.budget = budget
        self.step_b = np.array([s.b for s in steps], dtype=np.float64)
        self.step_a = np.array([s.a for s in steps], dtype=np.float64)
        self.step_c = np.array([s.c for s in steps], dtype=np.float64)
        self.recompute_cost = float(recompute_s_per_token)
        self.age = np.zeros(n, dtype=np.int64)
        self.replica = np.full(n, -1, dtype=np.int64)
        self.is_running = np.zeros(n, dtype=bool)
        self.has_run = np.zeros(n, dtype=bool)
        self.needs_recompute = np.zeros(n, dtype=bool)
        self.running: list[list[int]] = [[] for _ in range(num_replicas)]  # admission order
        self.waiting: list[deque[int]] = [deque() for _ in range(num_replicas)]
        self.run_load = np.zeros(num_replicas, dtype=np.int64)  # KV of the running requests
        self.n_run = np.zeros(num_replicas, dtype=np.int64)
        self.loads = np.zeros(num_replicas, dtype=np.int64)  # router view: every routed request
        self.assigned = np.zeros(num_replicas, dtype=np.int64)
        self.preemptions = 0
        self.preemptions_oversize = 0  # on a replica running a request that cannot fit alone
        self.recomputed_tokens = 0
        self.waiting_steps = 0  # Σ over steps of requests waiting at a replica

    # ------------------------------------------------------------------------- router side
    def route(self, rids: NDArray[np.int64], replicas: NDArray[np.int64]) -> None:
        """The tick routed ``rids`` to ``replicas``: each joins its replica's waiting queue."""
        for rid, g in zip(rids.tolist(), replicas.tolist()):
            self.waiting[g].append(rid)
            self.replica[rid] = g
        np.add.at(self.loads, replicas, self.prompt[rids])
        self.assigned += np.bincount(replicas, minlength=self.g_count)

    def routed_ids(self) -> NDArray[np.int64]:
        """Every request routed and not finished (running or waiting), by replica."""
        return np.flatnonzero(self.replica >= 0)

    # ------------------------------------------------------------------------- engine side
    def _kv(self, rid: int) -> int:
        return int(self.prompt[rid] + self.age[rid])

    def _schedule(self, g: int) -> int:
        """Replica g's scheduling for this step: preempt while over budget, else admit.
        Returns the tokens it must recompute this step."""
        running, waiting = self.running[g], self.waiting[g]
        cap = None if self.budget is None else int(self.budget[g])
        preempted = False
        while cap is not None and self.run_load[g] > cap and len(running) > 1:
            rid = running.pop()  # the newest running request
            self.run_load[g] -= self._kv(rid)
            self.n_run[g] -= 1
            self.is_running[rid] = False
            self.needs_recompute[rid] = True
            waiting.appendleft(rid)
            self.preemptions += 1
            if any(self.prompt[r] + self.output[r] - 1 > cap for r in (*running, rid)):
                self.preemptions_oversize += 1
            preempted = True
        recompute = 0
        if preempted:
            return 0
        while waiting:
            rid = waiting[0]
            need = self._kv(rid)
            if cap is not None and running and self.run_load[g] + need > cap:
                break
            waiting.popleft()
            running.append(rid)
            self.run_load[g] += need
            self.n_run[g] += 1
            self.is_running[rid] = True
            if self.needs_recompute[rid]:
                self.needs_recompute[rid] = False
                recompute += need
        return recompute

    def step(self) -> EngineStep:
        """Schedule every replica, run one barrier step, let every running request generate one
        token; return the step's record (the finished requests have left)."""
        recompute = np.zeros(self.g_count, dtype=np.float64)
        for g in range(self.g_count):
            if self.waiting[g] or (self.budget is not None and self.run_load[g] > self.budget[g]):
                recompute[g] = self._schedule(g)
        self.recomputed_tokens += int(recompute.sum())
        self.waiting_steps += int(sum(len(w) for w in self.waiting))
        loads = self.run_load
        envelope = int(loads.max())
        total = int(loads.sum())
        tau_g = self.step_b + (self.step_a * loads + self.step_c * self.n_run)
        if recompute.any():
            tau_g = tau_g + self.recompute_cost * recompute
        tau = float(tau_g.max())
        running = np.flatnonzero(self.is_running)
        started = running[~self.has_run[running]]
        self.has_run[started] = True
        self.age[running] += 1
        self.run_load += self.n_run
        self.loads += self.n_run
        done = running[self.age[running] >= self.output[running]]
        if done.shape[0]:
            gs = self.replica[done]
            kv = self.prompt[done] + self.output[done]
            np.subtract.at(self.run_load, gs, kv)
            np.subtract.at(self.loads, gs, kv)
            counts = np.bincount(gs, minlength=self.g_count)
            self.n_run -= counts
            self.assigned -= counts
            self.is_running[done] = False
            for rid, g in zip(done.tolist(), gs.tolist()):
                self.running[g].remove(rid)
            self.replica[done] = -1
        return EngineStep(envelope=envelope, total=total,
                          imbalance=self.g_count * envelope - total, tau=tau,
                          time_idle=float(self.g_count * tau - tau_g.sum()),
                          active=int(running.shape[0]), started=started, finished=done)


# ----------------------------------------------------------------------------- compiled path


@njit
def _engine_step(prompt, output, age, replica, is_running, has_run, needs_rec, run_ids, run_len,
                 wait_buf, wait_head, wait_len, run_load, n_run, loads, assigned, budget,
                 has_budget, step_b, step_a, step_c, recompute_cost, counters, tau_g, started,
                 finished, out):  # pragma: no cover - compiled; equal to ReplicaEngine.step (tested)
    g_count = run_load.shape[0]
    width = wait_buf.shape[1]
    recompute = np.zeros(g_count)
    any_recompute = False
    for g in range(g_count):
        if not (wait_len[g] > 0 or (has_budget and run_load[g] > budget[g])):
            continue
        preempted = False
        if has_budget:
            cap = budget[g]
            while run_load[g] > cap and run_len[g] > 1:  # preempt the newest running request
                run_len[g] -= 1
                rid = run_ids[g, run_len[g]]
                run_load[g] -= prompt[rid] + age[rid]
                n_run[g] -= 1
                is_running[rid] = False
                needs_rec[rid] = True
                wait_head[g] = (wait_head[g] - 1) % width
                wait_buf[g, wait_head[g]] = rid
                wait_len[g] += 1
                counters[0] += 1
                over = prompt[rid] + output[rid] - 1 > cap
                for j in range(run_len[g]):
                    r = run_ids[g, j]
                    if prompt[r] + output[r] - 1 > cap:
                        over = True
                if over:
                    counters[1] += 1
                preempted = True
        if preempted:
            continue
        rc = 0
        while wait_len[g] > 0:  # admit in order while the next one fits
            rid = wait_buf[g, wait_head[g]]
            need = prompt[rid] + age[rid]
            if has_budget and run_len[g] > 0 and run_load[g] + need > budget[g]:
                break
            wait_head[g] = (wait_head[g] + 1) % width
            wait_len[g] -= 1
            run_ids[g, run_len[g]] = rid
            run_len[g] += 1
            run_load[g] += need
            n_run[g] += 1
            is_running[rid] = True
            if needs_rec[rid]:
                needs_rec[rid] = False
                rc += need
        recompute[g] = rc
        if rc != 0:
            any_recompute = True
    for g in range(g_count):
        counters[2] += np.int64(recompute[g])
        counters[3] += wait_len[g]
    envelope = run_load[0]
    total = 0
    for g in range(g_count):
        envelope = max(envelope, run_load[g])
        total += run_load[g]
        tau_g[g] = step_b[g] + (step_a[g] * run_load[g] + step_c[g] * n_run[g])
    if any_recompute:
        for g in range(g_count):
            tau_g[g] = tau_g[g] + recompute_cost * recompute[g]
    n_started = 0
    active = 0
    for rid in range(prompt.shape[0]):
        if is_running[rid]:
            active += 1
            if not has_run[rid]:
                started[n_started] = rid
                n_started += 1
                has_run[rid] = True
            age[rid] += 1
    for g in range(g_count):
        run_load[g] += n_run[g]
        loads[g] += n_run[g]
    n_done = 0
    for rid in range(prompt.shape[0]):
        if is_running[rid] and age[rid] >= output[rid]:
            finished[n_done] = rid
            n_done += 1
    for k in range(n_done):
        rid = finished[k]
        g = replica[rid]
        kv = prompt[rid] + output[rid]
        run_load[g] -= kv
        loads[g] -= kv
        n_run[g] -= 1
        assigned[g] -= 1
        is_running[rid] = False
        j = 0
        for i in range(run_len[g]):  # remove it, keeping the admission order
            if run_ids[g, i] != rid:
                run_ids[g, j] = run_ids[g, i]
                j += 1
        run_len[g] = j
        replica[rid] = -1
    out[0], out[1], out[2], out[3], out[4] = n_started, n_done, active, envelope, total


class CompiledReplicaEngine(ReplicaEngine):
    """:class:`ReplicaEngine` with its step compiled (numba): the same queues, preemptions and
    step times, decision for decision (tested against the Python engine), in arrays — per replica
    a ring buffer for the waiting queue and the running requests in admission order, at most
    ``slots`` each (a replica never holds more routed requests than slots)."""

    def __init__(self, prompt: NDArray[np.int64], output: NDArray[np.int64], num_replicas: int,
                 budget: NDArray[np.int64] | None, steps: tuple[StepModel, ...],
                 recompute_s_per_token: float = RECOMPUTE_S_PER_TOKEN,
                 slots: int | None = None) -> None:
        super().__init__(prompt, output, num_replicas, budget, steps, recompute_s_per_token)
        n = prompt.shape[0]
        width = max(1, min(n, n if slots is None else int(slots)))
        self._prompt = np.ascontiguousarray(prompt, dtype=np.int64)
        self._output = np.ascontiguousarray(output, dtype=np.int64)
        self._run_ids = np.zeros((num_replicas, width), dtype=np.int64)
        self._run_len = np.zeros(num_replicas, dtype=np.int64)
        self._wait_buf = np.zeros((num_replicas, width), dtype=np.int64)
        self._wait_head = np.zeros(num_replicas, dtype=np.int64)
        self._wait_len = np.zeros(num_replicas, dtype=np.int64)
        self._budget = (np.zeros(num_replicas, dtype=np.int64) if budget is None
                        else np.ascontiguousarray(budget, dtype=np.int64))
        self._counters = np.zeros(4, dtype=np.int64)
        self._tau_g = np.zeros(num_replicas, dtype=np.float64)
        self._started = np.zeros(n, dtype=np.int64)
        self._finished = np.zeros(n, dtype=np.int64)
        self._out = np.zeros(5, dtype=np.int64)

    def route(self, rids: NDArray[np.int64], replicas: NDArray[np.int64]) -> None:
        """The tick routed ``rids`` to ``replicas``: each joins its replica's waiting queue."""
        width = self._wait_buf.shape[1]
        for rid, g in zip(rids.tolist(), replicas.tolist()):
            if self._wait_len[g] == width:
                raise ValueError(f"replica {g} holds more than {width} routed requests")
            self._wait_buf[g, (self._wait_head[g] + self._wait_len[g]) % width] = rid
            self._wait_len[g] += 1
            self.replica[rid] = g
        np.add.at(self.loads, replicas, self.prompt[rids])
        self.assigned += np.bincount(replicas, minlength=self.g_count)

    def step(self) -> EngineStep:
        """:meth:`ReplicaEngine.step`, compiled."""
        out = self._out
        _engine_step(self._prompt, self._output, self.age, self.replica, self.is_running,
                     self.has_run, self.needs_recompute, self._run_ids, self._run_len,
                     self._wait_buf, self._wait_head, self._wait_len, self.run_load, self.n_run,
                     self.loads, self.assigned, self._budget, self.budget is not None,
                     self.step_b, self.step_a, self.step_c, self.recompute_cost, self._counters,
                     self._tau_g, self._started, self._finished, out)
        self.preemptions, self.preemptions_oversize, self.recomputed_tokens, self.waiting_steps = (
            int(x) for x in self._counters)
        tau_g = self._tau_g
        tau = float(tau_g.max())
        envelope, total = int(out[3]), int(out[4])
        return EngineStep(envelope=envelope, total=total,
                          imbalance=self.g_count * envelope - total, tau=tau,
                          time_idle=float(self.g_count * tau - tau_g.sum()), active=int(out[2]),
                          started=self._started[:out[0]].copy(),
                          finished=self._finished[:out[1]].copy())


def engine_class() -> type[ReplicaEngine]:
    """The engine the simulator runs: the compiled one where numba is, else the Python one."""
    return CompiledReplicaEngine if HAVE_NUMBA else ReplicaEngine
