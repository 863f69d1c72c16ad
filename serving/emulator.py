"""An emulated prefill–decode cluster that speaks vLLM's HTTP API (``balanceroute emulate``).

Prefill instances answer a ``max_tokens=1`` request after ``b_p + a_p·s`` seconds with
``usage.prompt_tokens`` and ``kv_transfer_params`` (NIXL style: ``remote_engine_id``,
``remote_block_ids``, ``remote_request_id``, ...; Mooncake style: the KV is held under the
proxy's ``transfer_id`` and the DP engine ids are served at ``/query``). The G decode replicas
step in lock-step like DP ranks joined by a collective: each step lasts
``τ = b + max_g(slow_g·(a·L_g + c·n_g))`` (``core.dynamics.StepModel``), scaled to wall time by
``time_scale``, then every running request gets one token. A replica admits waiting requests
up to ``slots`` at the start of a step (vLLM ``max_num_seqs``) while their KV fits the
replica's blocks, and preempts its newest running request while the running KV outgrows them:
the scheduling of ``core.replica_engine`` (vLLM v1's FCFS scheduler; ``docs/replicas.md``), the
preempted request recomputing its s_i + a_i tokens when admitted again at
``recompute_s_per_token`` seconds each, in that step. As in vLLM the KV is allocated in blocks
of ``block_size`` tokens per request — a request of s_i + a_i tokens holds
⌈(s_i + a_i) / block_size⌉ of the replica's ``kv_capacity_tokens // block_size`` blocks (its
``num_gpu_blocks``) — where the simulator counts tokens; with ``block_size = 1`` the two agree.

Tokenisation (documented, tokenizer-free): a prompt has one token per whitespace-separated
word, token-id prompts count exactly, chat messages add 4 tokens each. Output length is
``max_tokens`` (``max_completion_tokens`` first; 16 if absent) when ``ignore_eos`` is set or no
output distribution is configured, else a draw from the configured lengths capped at
``max_tokens``. Token k of every response is ``" " + WORDS[k % len(WORDS)]``.

Measured with the simulator's dynamics and metrics (``core.dynamics``: :class:`StepTotals`,
the same names and definitions), on emulated time Σ τ, independent of wall-clock jitter; the
loaded phase ends at the last step that admitted a request. :meth:`EmulatedCluster.step` runs
one step without waiting (a test drives it against the simulator). The HTTP servers are
``serving/emulator_app.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from balanceroute.core.dynamics import StepModel, StepTotals
from balanceroute.core.replica_engine import RECOMPUTE_S_PER_TOKEN

__all__ = ["WORDS", "EmulatedCluster", "EmulatedRequest", "EmulatorConfig", "emulated_text"]

WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do",
         "eiusmod", "tempor")


def emulated_text(start: int, stop: int | None = None) -> str:
    """The text of tokens ``start..stop-1`` (or ``0..start-1`` with one argument)."""
    if stop is None:
        start, stop = 0, start
    return "".join(" " + WORDS[k % len(WORDS)] for k in range(start, stop))


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulatorConfig:
    """One emulated cluster.

    ``layout="ports"``: every decode replica is its own server; ``"dp"``: one decode server
    whose replicas are DP ranks chosen by the ``X-data-parallel-rank`` header (least-loaded
    rank without it). ``time_scale`` multiplies every emulated duration (0.1 = ten times
    faster than real time). ``output_lengths``: lengths to draw from when the client does not
    set ``ignore_eos``. Fault knobs: ``prefill_fail_rate`` (HTTP 500), ``decode_fail_rate``
    (HTTP 500 before the first token), ``stream_break_rate`` (the stream stops at a random
    token), ``killed`` replicas (503, streams cut), ``slow`` replicas ((g, factor) pairs),
    ``poison_word`` (every decode replica answers 500 to a prompt containing it).
    ``kv_capacity_tokens``: each decode replica's KV budget (rounded down to whole blocks of
    ``block_size``, allocated per request), enforced as vLLM does (queue, then preempt the
    newest; the module docstring); ``recompute_s_per_token``: what a preempted request's
    recompute adds to its replica's step, per token.
    ``replica_steps``: one step model per replica (a_g, b_g, c_g; docs/replicas.md), the step
    then lasting max_g (b_g + slow_g·(a_g·L_g + c_g·n_g)); ``None``: ``step_model`` everywhere.
    ``stamp_chunks`` adds ``emulator_ts`` (``time.monotonic()`` when the token was made) to
    every streamed chunk, for latency measurements.
    """

    num_replicas: int = 8
    slots: int = 64
    num_prefill: int = 1
    prefill_dp: int = 1
    layout: Literal["ports", "dp"] = "ports"
    step_model: StepModel = field(default_factory=StepModel)
    prefill_b: float = 0.02
    prefill_a: float = 2e-5
    time_scale: float = 1.0
    model: str = "balanceroute-emulator"
    output_lengths: NDArray[np.int64] | None = None
    seed: int = 0
    kv_lease_s: float = 30.0
    kv_capacity_tokens: int = 1_000_000
    block_size: int = 16
    recompute_s_per_token: float = RECOMPUTE_S_PER_TOKEN
    stamp_chunks: bool = False
    prefill_fail_rate: float = 0.0
    decode_fail_rate: float = 0.0
    stream_break_rate: float = 0.0
    killed: tuple[int, ...] = ()
    slow: tuple[tuple[int, float], ...] = ()
    replica_steps: tuple[StepModel, ...] | None = None
    poison_word: str | None = None

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"{self.num_replicas=} must be >= 1")
        if self.slots < 1:
            raise ValueError(f"{self.slots=} must be >= 1")
        if self.num_prefill < 0:
            raise ValueError(f"{self.num_prefill=} must be >= 0")
        if self.prefill_dp < 1:
            raise ValueError(f"{self.prefill_dp=} must be >= 1")
        if self.layout not in ("ports", "dp"):
            raise ValueError(f"{self.layout=} must be 'ports' or 'dp'")
        if not self.time_scale > 0:
            raise ValueError(f"{self.time_scale=} must be > 0")
        if self.prefill_a < 0 or self.prefill_b < 0:
            raise ValueError("prefill_a and prefill_b must be >= 0")
        if self.block_size < 1:
            raise ValueError(f"{self.block_size=} must be >= 1")
        if self.kv_capacity_tokens < self.block_size:
            raise ValueError(f"{self.kv_capacity_tokens=} must be at least one block ({self.block_size} tokens)")
        if not self.recompute_s_per_token >= 0:
            raise ValueError(f"{self.recompute_s_per_token=} must be >= 0")
        for name in ("prefill_fail_rate", "decode_fail_rate", "stream_break_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be in [0, 1]")
        if any(not 0 <= g < self.num_replicas for g in self.killed):
            raise ValueError(f"{self.killed=} names a replica that does not exist")
        if any(not 0 <= g < self.num_replicas or not f > 0 for g, f in self.slow):
            raise ValueError(f"{self.slow=} must be (replica, factor > 0) pairs")
        if self.replica_steps is not None and len(self.replica_steps) != self.num_replicas:
            raise ValueError(f"{self.replica_steps=} must name one step model per replica")
        if self.output_lengths is not None and (
                self.output_lengths.ndim != 1 or self.output_lengths.size == 0 or self.output_lengths.min() < 1):
            raise ValueError("output_lengths must be a non-empty 1-D array of lengths >= 1")


@dataclass(slots=True, eq=False)
class EmulatedRequest:
    """One decode request: ``prompt`` s_i and ``output`` o_i tokens on ``replica``; ``event``
    is set whenever it gets a token (or is cut); ``limit`` is the client's ``max_tokens``,
    ``break_at`` the token at which an injected fault cuts its stream (0: never);
    ``recompute``: preempted, its KV lost until it is admitted again."""

    rid: str
    prompt: int
    output: int
    replica: int
    event: asyncio.Event
    limit: int = 0
    age: int = 0
    emitted: int = 0
    done: bool = False
    broken: bool = False
    break_at: int = 0
    stamp: float = 0.0
    recompute: bool = False


@dataclass(slots=True, eq=False)
class _Replica:
    running: list[EmulatedRequest] = field(default_factory=list)
    waiting: deque = field(default_factory=deque)
    load: int = 0
    killed: bool = False
    hung: bool = False  # a SIGSTOP: no step, no answer, streams frozen (fault "hang")
    slow: float = 1.0
    fail_rate: float = 0.0
    break_rate: float = 0.0
    completed: int = 0
    aborted: int = 0
    preempted: int = 0
    recompute: int = 0  # tokens it recomputes in the step being booked
    blocks: int = 0  # KV blocks its running requests hold, ⌈(s_i + a_i) / block_size⌉ each
    prompt_tokens: int = 0
    generated: int = 0
    finished: dict[str, int] = field(default_factory=lambda: {"length": 0, "stop": 0, "abort": 0})


@dataclass(slots=True)
class _Hold:
    prompt: int
    engine_id: str
    expires: float


class EmulatedCluster:
    """The shared state of all emulated servers and the lock-step decode loop."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        self.replicas = [_Replica(fail_rate=config.decode_fail_rate, break_rate=config.stream_break_rate)
                         for _ in range(config.num_replicas)]
        for g in config.killed:
            self.replicas[g].killed = True
        for g, factor in config.slow:
            self.replicas[g].slow = factor
        self.prefill_killed = [False] * config.num_prefill
        self.prefill_hung = [False] * config.num_prefill  # fault "hang": requests wait unanswered
        self.prefill_fail = [config.prefill_fail_rate] * config.num_prefill
        self.holds: dict[str, _Hold] = {}
        self.rooms: dict[int, tuple[int, asyncio.Event]] = {}  # SGLang bootstrap rooms: (prompt, pulled)
        self._work = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.reset_stats()

    def reset_stats(self) -> None:
        """Start a new measurement window."""
        self.totals = StepTotals()
        self.kv = {"hits": 0, "misses": 0, "expired": 0}
        self.counts = {"prefilled": 0, "admitted": 0, "completed": 0, "aborted": 0, "broken": 0,
                       "failed_injected": 0, "rejected": 0, "injected": 0, "preempted": 0,
                       "recomputed_tokens": 0}
        self.wall_start: float | None = None
        self.wall_last = 0.0

    def stats(self) -> dict[str, Any]:
        """The window's metrics (``core.dynamics.step_metrics``) and counters since the last
        reset, plus wall-clock time and throughput (which depend on the host)."""
        totals = self.totals
        wall = (self.wall_last - self.wall_start) if self.wall_start is not None else 0.0
        return {
            "replicas": self.config.num_replicas,
            "slots": self.config.slots,
            "time_scale": self.config.time_scale,
            **totals.metrics(),
            "steps": totals.steps,
            "loaded_steps": totals.loaded[2],
            "generated_tokens": totals.generated,
            "emulated_time_s": totals.sum_tau,
            "wall_time_s": wall,
            "wall_throughput_tok_s": totals.generated / wall if wall else 0.0,
            "requests": dict(self.counts),
            "kv": dict(self.kv),
            "running": sum(len(r.running) for r in self.replicas),
            "waiting": sum(len(r.waiting) for r in self.replicas),
            "per_replica": [
                {"running": len(r.running), "waiting": len(r.waiting), "load": r.load,
                 "completed": r.completed, "aborted": r.aborted, "preempted": r.preempted,
                 "killed": r.killed, "slow": r.slow}
                for r in self.replicas],
        }

    def start(self) -> None:
        """Start the decode loop on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="emulator-steps")

    async def stop(self) -> None:
        """Stop the decode loop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def scaled(self, seconds: float) -> float:
        """Wall-clock seconds for ``seconds`` of emulated time."""
        return seconds * self.config.time_scale

    def prefill_seconds(self, prompt: int) -> float:
        """Emulated prefill time ``b_p + a_p·s``."""
        return self.config.prefill_b + self.config.prefill_a * prompt

    def output_len(self, payload: dict[str, Any]) -> int:
        """o_i for a request (see the module docstring)."""
        limit = payload.get("max_completion_tokens") or payload.get("max_tokens") or 16
        limit = max(1, int(limit))
        lengths = self.config.output_lengths
        if lengths is None or payload.get("ignore_eos"):
            return limit
        return int(min(limit, lengths[self.rng.integers(lengths.shape[0])]))

    def hold(self, key: str, prompt: int, engine_id: str) -> None:
        """Prefill keeps the KV of ``key`` for the lease."""
        now = time.monotonic()
        if len(self.holds) > 4096:
            for k in [k for k, h in self.holds.items() if h.expires < now]:
                del self.holds[k]
                self.kv["expired"] += 1
        self.holds[key] = _Hold(prompt, engine_id, now + self.config.kv_lease_s)

    def take_hold(self, kv: dict[str, Any], request_id: str) -> int | None:
        """Decode pulls the KV named by ``kv`` (``None``: missing, expired or another engine's)."""
        key = kv.get("transfer_id") or kv.get("remote_request_id") or request_id
        hold = self.holds.pop(str(key), None)
        if hold is None or hold.expires < time.monotonic() or hold.engine_id != kv.get("remote_engine_id"):
            self.kv["misses"] += 1
            return None
        self.kv["hits"] += 1
        return hold.prompt

    async def serve_room(self, room: int, prompt: int) -> bool:
        """SGLang prefill: the KV of ``room`` is ready; wait (at most ``kv_lease_s``, SGLang's
        bootstrap timeout) for the decode leg of the room to pull it. ``False``: none came."""
        pulled = asyncio.Event()
        self.rooms[room] = (prompt, pulled)
        try:
            await asyncio.wait_for(pulled.wait(), self.config.kv_lease_s)
            return True
        except TimeoutError:
            self.kv["expired"] += 1
            return False
        finally:
            self.rooms.pop(room, None)

    async def pull_room(self, room: int) -> int | None:
        """SGLang decode: pull the KV of ``room`` once its prefill leg has it (waiting at most
        ``kv_lease_s``); the prompt length, or ``None`` when no prefill leg serves the room."""
        end = time.monotonic() + self.config.kv_lease_s
        while room not in self.rooms:
            if time.monotonic() > end:
                self.kv["misses"] += 1
                return None
            await asyncio.sleep(0.005)
        prompt, pulled = self.rooms.pop(room)
        pulled.set()
        self.kv["hits"] += 1
        return prompt

    def pick_rank(self) -> int:
        """The least-loaded live replica (what a DP server does without a rank header)."""
        live = [g for g, r in enumerate(self.replicas) if not r.killed]
        if not live:
            return 0
        return min(live, key=lambda g: (len(self.replicas[g].running) + len(self.replicas[g].waiting),
                                        self.replicas[g].load))

    def submit(self, req: EmulatedRequest) -> None:
        """Queue ``req`` on its replica; it is admitted at the start of a step."""
        self.replicas[req.replica].waiting.append(req)
        self._work.set()

    @property
    def kv_budget(self) -> int:
        """Each replica's KV token budget as the engine reports it (whole blocks of
        ``block_size`` within ``kv_capacity_tokens``: vLLM ``num_gpu_blocks × block_size``)."""
        block = self.config.block_size
        return max(block, self.config.kv_capacity_tokens // block * block)

    def inject(self, g: int, prompt: int, output: int, count: int = 1) -> list[EmulatedRequest]:
        """Queue ``count`` requests straight on replica ``g``, bypassing every proxy (foreign
        load: a direct client, another router); nobody reads them, they run to the end."""
        out = []
        for _ in range(count):
            req = EmulatedRequest(rid=f"foreign-{self.counts['injected']}", prompt=prompt, output=output,
                                  replica=g, event=asyncio.Event(), limit=output)
            self.counts["injected"] += 1
            self.submit(req)
            out.append(req)
        return out

    def abort(self, req: EmulatedRequest) -> None:
        """The client went away: drop ``req`` and its KV."""
        if req.done:
            return
        rep = self.replicas[req.replica]
        if req in rep.running:
            rep.running.remove(req)
            rep.load -= req.prompt + req.age
            rep.blocks -= self._blocks(req.prompt + req.age)
        elif req in rep.waiting:
            rep.waiting.remove(req)
        req.done = True
        rep.aborted += 1
        rep.finished["abort"] += 1
        self.counts["aborted"] += 1

    def kill(self, g: int) -> None:
        """Replica g dies: its requests' streams are cut, new requests get 503."""
        rep = self.replicas[g]
        rep.killed = True
        for req in [*rep.running, *rep.waiting]:
            req.broken = req.done = True
            req.event.set()
        rep.running.clear()
        rep.waiting.clear()
        rep.load = rep.blocks = 0

    def revive(self, g: int) -> None:
        """Replica g is back: it admits requests again."""
        self.replicas[g].killed = False
        self._work.set()

    def hang(self, g: int, hung: bool) -> None:
        """Replica g freezes (as under SIGSTOP: its streams stop, nothing it is asked is
        answered) or thaws."""
        self.replicas[g].hung = hung
        self._work.set()

    async def wait_thawed(self, g: int | None = None, prefill: int | None = None) -> None:
        """Return once decode replica ``g`` (or prefill instance ``prefill``) is not hung."""
        while (g is not None and self.replicas[g].hung) or (prefill is not None and self.prefill_hung[prefill]):
            await asyncio.sleep(0.05)

    def _admit(self) -> bool:
        """Each replica's scheduling for the step about to run (``ReplicaEngine._schedule``):
        while its running KV exceeds the budget it preempts the newest running request (back to
        the head of its queue, KV lost); only in a step without a preemption it admits waiting
        requests in order while the next one's KV (s_i + a_i) fits and a slot is free, a
        replica with nothing running taking its head request whatever its size. Returns whether
        a request started for the first time."""
        admitted = False
        slots = self.config.slots
        cap = self.kv_budget // self.config.block_size  # blocks
        blocks = self._blocks
        for rep in self.replicas:
            rep.recompute = 0
            if rep.killed or rep.hung:
                continue
            if rep.blocks > cap and len(rep.running) > 1:
                while rep.blocks > cap and len(rep.running) > 1:
                    req = rep.running.pop()  # the newest running request
                    rep.load -= req.prompt + req.age
                    rep.blocks -= blocks(req.prompt + req.age)
                    req.recompute = True
                    rep.waiting.appendleft(req)
                    rep.preempted += 1
                    self.counts["preempted"] += 1
                continue
            while rep.waiting and len(rep.running) < slots:
                req = rep.waiting[0]
                need = req.prompt + req.age
                if rep.running and rep.blocks + blocks(need) > cap:
                    break
                rep.waiting.popleft()
                rep.running.append(req)
                rep.load += need
                rep.blocks += blocks(need)
                if req.recompute:
                    req.recompute = False
                    rep.recompute += need
                    self.counts["recomputed_tokens"] += need
                    continue
                rep.prompt_tokens += req.prompt
                self.counts["admitted"] += 1
                admitted = True
        return admitted

    def _blocks(self, tokens: int) -> int:
        """KV blocks that ``tokens`` of one request hold."""
        return -(-tokens // self.config.block_size)

    def _advance(self) -> int:
        """Every running request gets one token (L_g grows by n_g); finished or cut ones leave
        with their s_i + age tokens. Returns the tokens generated."""
        stamp = time.monotonic()
        generated = 0
        for rep in self.replicas:
            if not rep.running or rep.hung:
                continue
            n = len(rep.running)
            rep.load += n
            rep.generated += n
            generated += n
            keep = []
            block = self.config.block_size
            for req in rep.running:
                if (req.prompt + req.age) % block == 0:  # its next token starts a new block
                    rep.blocks += 1
                req.age += 1
                req.stamp = stamp
                if req.break_at and req.age >= req.break_at:
                    req.broken = req.done = True
                    rep.load -= req.prompt + req.age
                    rep.blocks -= self._blocks(req.prompt + req.age)
                    self.counts["broken"] += 1
                elif req.age >= req.output:
                    req.done = True
                    rep.load -= req.prompt + req.age
                    rep.blocks -= self._blocks(req.prompt + req.age)
                    rep.completed += 1
                    self.counts["completed"] += 1
                else:
                    keep.append(req)
                req.event.set()
            rep.running = keep
        return generated

    def begin_step(self) -> tuple[NDArray, float, bool] | None:
        """Admit waiting requests and book the step about to run (``core.dynamics``): its loads
        L_g, its τ and whether it admitted anything; ``None`` when nothing runs."""
        admitted = self._admit()
        if not any(rep.running and not rep.hung for rep in self.replicas):
            return None
        g_count = self.config.num_replicas
        loads = np.fromiter((r.load for r in self.replicas), dtype=np.float64, count=g_count)
        active = np.fromiter((len(r.running) for r in self.replicas), dtype=np.float64, count=g_count)
        slow = np.fromiter((0.0 if r.hung else r.slow for r in self.replicas), dtype=np.float64, count=g_count)
        steps = self.config.replica_steps
        recompute = any(r.recompute for r in self.replicas)
        if steps is None and not recompute:
            tau = self.config.step_model.step_time(loads, active, slow)
        else:  # replicas of different speed, or a local prefill in the step: the barrier waits
            per = steps or (self.config.step_model,) * g_count  # for the slowest replica
            p = self.config.recompute_s_per_token
            tau = max(m.b + f * (m.a * x + m.c * n) + p * r.recompute
                      for m, f, x, n, r in zip(per, slow, loads, active, self.replicas))
        self.totals.record(loads, float(tau))
        return loads, tau, admitted

    def end_step(self, admitted: bool) -> None:
        """The step's τ has elapsed: deliver its tokens."""
        self.totals.generate(self._advance(), assigned=admitted)

    def step(self) -> tuple[NDArray, float] | None:
        """One whole step at once, without waiting: (L_g, τ), or ``None`` when nothing runs."""
        begun = self.begin_step()
        if begun is None:
            return None
        self.end_step(begun[2])
        return begun[0], begun[1]

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            begun = self.begin_step()
            if begun is None:
                self._work.clear()
                await self._work.wait()
                deadline = None
                continue
            now = loop.time()
            if self.wall_start is None:
                self.wall_start = time.monotonic()
            if deadline is None or now - deadline > 1.0:
                deadline = now
            deadline += self.scaled(begun[1])
            delay = deadline - loop.time()
            await asyncio.sleep(delay if delay > 0 else 0)
            self.end_step(begun[2])
            self.wall_last = time.monotonic()
