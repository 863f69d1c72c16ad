"""An emulated prefill–decode cluster that speaks vLLM's HTTP API (``balanceroute emulate``).

Prefill instances answer a ``max_tokens=1`` request after ``b_p + a_p·s`` seconds with
``usage.prompt_tokens`` and ``kv_transfer_params`` (NIXL style: ``remote_engine_id``,
``remote_block_ids``, ``remote_request_id``, ...; Mooncake style: the KV is held under the
proxy's ``transfer_id`` and the DP engine ids are served at ``/query``). The G decode replicas
step in lock-step like DP ranks joined by a collective: each step lasts
``τ = b + max_g(slow_g·(a·L_g + c·n_g))`` (``core.simulator.StepModel``), scaled to wall time by
``time_scale``, then every running request gets one token. A replica admits waiting requests
up to ``slots`` at the start of a step (vLLM ``max_num_seqs``).

Tokenisation (documented, tokenizer-free): a prompt has one token per whitespace-separated
word, token-id prompts count exactly, chat messages add 4 tokens each. Output length is
``max_tokens`` (``max_completion_tokens`` first; 16 if absent) when ``ignore_eos`` is set or no
output distribution is configured, else a draw from the configured lengths capped at
``max_tokens``. Token k of every response is ``" " + WORDS[k % len(WORDS)]``.

Measured like the simulator: I(k) = G·M(k) − Σ_g L_g(k) per step; ``mean_imbalance`` over the
loaded phase (steps up to the last one that admitted a request), throughput = generated
tokens / Σ τ (emulated time, independent of wall-clock jitter).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect

from balanceroute.core.dynamics import StepModel

from .protocol import SSE_DONE, error_body, words_prompt_tokens

__all__ = ["WORDS", "EmulatedCluster", "EmulatorConfig", "create_decode_app", "create_prefill_app",
           "emulated_text"]

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
    stamp_chunks: bool = False
    prefill_fail_rate: float = 0.0
    decode_fail_rate: float = 0.0
    stream_break_rate: float = 0.0
    killed: tuple[int, ...] = ()
    slow: tuple[tuple[int, float], ...] = ()
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
        for name in ("prefill_fail_rate", "decode_fail_rate", "stream_break_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be in [0, 1]")
        if any(not 0 <= g < self.num_replicas for g in self.killed):
            raise ValueError(f"{self.killed=} names a replica that does not exist")
        if any(not 0 <= g < self.num_replicas or not f > 0 for g, f in self.slow):
            raise ValueError(f"{self.slow=} must be (replica, factor > 0) pairs")
        if self.output_lengths is not None and (
                self.output_lengths.ndim != 1 or self.output_lengths.size == 0 or self.output_lengths.min() < 1):
            raise ValueError("output_lengths must be a non-empty 1-D array of lengths >= 1")


@dataclass(slots=True, eq=False)
class _Req:
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


@dataclass(slots=True, eq=False)
class _Replica:
    running: list[_Req] = field(default_factory=list)
    waiting: deque = field(default_factory=deque)
    load: int = 0
    killed: bool = False
    slow: float = 1.0
    fail_rate: float = 0.0
    break_rate: float = 0.0
    completed: int = 0
    aborted: int = 0
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
        self.prefill_fail = [config.prefill_fail_rate] * config.num_prefill
        self.holds: dict[str, _Hold] = {}
        self._work = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.reset_stats()

    # --------------------------------------------------------------- stats
    def reset_stats(self) -> None:
        """Start a new measurement window."""
        self.steps = 0
        self.sum_i = self.sum_gm = self.sum_tau = 0.0
        self.generated = 0
        self.loaded: tuple[float, float, int, float, int] = (0.0, 0.0, 0, 0.0, 0)
        self.kv = {"hits": 0, "misses": 0, "expired": 0}
        self.counts = {"prefilled": 0, "admitted": 0, "completed": 0, "aborted": 0, "broken": 0,
                       "failed_injected": 0, "rejected": 0}
        self.wall_start: float | None = None
        self.wall_last = 0.0

    def stats(self) -> dict[str, Any]:
        """Measured imbalance, throughput and counters since the last reset."""
        g_count = self.config.num_replicas
        loaded_i, loaded_gm, loaded_steps, loaded_tau, loaded_gen = self.loaded
        wall = (self.wall_last - self.wall_start) if self.wall_start is not None else 0.0
        return {
            "replicas": g_count,
            "slots": self.config.slots,
            "time_scale": self.config.time_scale,
            "steps": self.steps,
            "emulated_time_s": self.sum_tau,
            "wall_time_s": wall,
            "generated_tokens": self.generated,
            "throughput_tok_s": self.generated / self.sum_tau if self.sum_tau else 0.0,
            "wall_throughput_tok_s": self.generated / wall if wall else 0.0,
            "mean_imbalance": loaded_i / loaded_steps if loaded_steps else 0.0,
            "mean_imbalance_all": self.sum_i / self.steps if self.steps else 0.0,
            "barrier_idle_fraction": loaded_i / loaded_gm if loaded_gm else 0.0,
            "loaded_steps": loaded_steps,
            "loaded_throughput_tok_s": loaded_gen / loaded_tau if loaded_tau else 0.0,
            "mean_step_ms": 1e3 * self.sum_tau / self.steps if self.steps else 0.0,
            "requests": dict(self.counts),
            "kv": dict(self.kv),
            "running": sum(len(r.running) for r in self.replicas),
            "waiting": sum(len(r.waiting) for r in self.replicas),
            "per_replica": [
                {"running": len(r.running), "waiting": len(r.waiting), "load": r.load,
                 "completed": r.completed, "aborted": r.aborted, "killed": r.killed, "slow": r.slow}
                for r in self.replicas],
        }

    # ---------------------------------------------------------- lifecycle
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

    # ----------------------------------------------------------- requests
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

    def pick_rank(self) -> int:
        """The least-loaded live replica (what a DP server does without a rank header)."""
        live = [g for g, r in enumerate(self.replicas) if not r.killed]
        if not live:
            return 0
        return min(live, key=lambda g: (len(self.replicas[g].running) + len(self.replicas[g].waiting),
                                        self.replicas[g].load))

    def submit(self, req: _Req) -> None:
        """Queue ``req`` on its replica; it is admitted at the start of a step."""
        self.replicas[req.replica].waiting.append(req)
        self._work.set()

    def abort(self, req: _Req) -> None:
        """The client went away: drop ``req`` and its KV."""
        if req.done:
            return
        rep = self.replicas[req.replica]
        if req in rep.running:
            rep.running.remove(req)
            rep.load -= req.prompt + req.age
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
        rep.load = 0

    # ------------------------------------------------------------ the loop
    def _admit(self) -> bool:
        admitted = False
        slots = self.config.slots
        for rep in self.replicas:
            if rep.killed:
                continue
            while rep.waiting and len(rep.running) < slots:
                req = rep.waiting.popleft()
                rep.running.append(req)
                rep.load += req.prompt
                rep.prompt_tokens += req.prompt
                self.counts["admitted"] += 1
                admitted = True
        return admitted

    def _advance(self) -> None:
        stamp = time.monotonic()
        for rep in self.replicas:
            if not rep.running:
                continue
            n = len(rep.running)
            rep.load += n
            rep.generated += n
            self.generated += n
            keep = []
            for req in rep.running:
                req.age += 1
                req.stamp = stamp
                if req.break_at and req.age >= req.break_at:
                    req.broken = req.done = True
                    rep.load -= req.prompt + req.age
                    self.counts["broken"] += 1
                elif req.age >= req.output:
                    req.done = True
                    rep.load -= req.prompt + req.age
                    rep.completed += 1
                    self.counts["completed"] += 1
                else:
                    keep.append(req)
                req.event.set()
            rep.running = keep

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        g_count = self.config.num_replicas
        model = self.config.step_model
        deadline: float | None = None
        while True:
            admitted = self._admit()
            if not any(rep.running for rep in self.replicas):
                self._work.clear()
                await self._work.wait()
                deadline = None
                continue
            loads = np.fromiter((r.load for r in self.replicas), dtype=np.float64, count=g_count)
            active = np.fromiter((len(r.running) for r in self.replicas), dtype=np.float64, count=g_count)
            slow = np.fromiter((r.slow for r in self.replicas), dtype=np.float64, count=g_count)
            tau = model.b + float(np.max(slow * (model.a * loads + model.c * active)))
            envelope = float(loads.max())
            self.sum_i += g_count * envelope - float(loads.sum())
            self.sum_gm += g_count * envelope
            self.sum_tau += tau
            self.steps += 1
            now = loop.time()
            if self.wall_start is None:
                self.wall_start = time.monotonic()
            if deadline is None or now - deadline > 1.0:
                deadline = now
            deadline += self.scaled(tau)
            delay = deadline - loop.time()
            await asyncio.sleep(delay if delay > 0 else 0)
            self._advance()
            if admitted:
                self.loaded = (self.sum_i, self.sum_gm, self.steps, self.sum_tau, self.generated)
            self.wall_last = time.monotonic()


# ----------------------------------------------------------------------- HTTP layer
def _json_error(status: int, message: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status=status, code=code), status_code=status)


async def _payload(request: Request) -> dict[str, Any] | JSONResponse:
    try:
        payload = json.loads(await request.body())
    except ClientDisconnect:
        return _json_error(499, "client disconnected")
    except ValueError as exc:
        return _json_error(400, f"invalid JSON body: {exc}")
    if not isinstance(payload, dict):
        return _json_error(400, "the request body must be a JSON object")
    return payload


def _cluster(request: Request) -> EmulatedCluster:
    return request.app.state.cluster


def _chunk(req: _Req, cid: str, created: int, model: str, chat: bool, text: str | None,
           finish: str | None, usage: dict | None, stamp: bool, role: bool = False) -> bytes:
    if chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created,
                               "model": model, "choices": [choice]}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        obj = {"id": cid, "object": "text_completion", "created": created, "model": model,
               "choices": [choice]}
    if usage is not None:
        obj["usage"] = usage
    if stamp:
        obj["emulator_ts"] = req.stamp
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _usage(req: _Req, done: int) -> dict[str, int]:
    return {"prompt_tokens": req.prompt, "total_tokens": req.prompt + done, "completion_tokens": done}


async def _stream(cluster: EmulatedCluster, req: _Req, payload: dict, chat: bool) -> AsyncIterator[bytes]:
    opts = payload.get("stream_options") or {}
    include_usage = bool(opts.get("include_usage"))
    continuous = include_usage and bool(opts.get("continuous_usage_stats"))
    cid = ("chatcmpl-" if chat else "cmpl-") + req.rid
    created = int(time.time())
    model = cluster.config.model
    stamp = cluster.config.stamp_chunks
    try:
        if chat:
            yield _chunk(req, cid, created, model, chat, None, None,
                         _usage(req, 0) if continuous else None, stamp, role=True)
        while True:
            await req.event.wait()
            req.event.clear()
            if req.broken:
                return  # the stream just stops: no finish_reason, no [DONE]
            if req.age > req.emitted:
                text = emulated_text(req.emitted, req.age)
                req.emitted = req.age
                finish = None
                if req.done:
                    finish = "length" if req.output >= req.limit else "stop"
                    cluster.replicas[req.replica].finished[finish] += 1
                yield _chunk(req, cid, created, model, chat, text, finish,
                             _usage(req, req.age) if continuous else None, stamp)
            if req.done:
                if include_usage:
                    final = {"id": cid, "object": "chat.completion.chunk" if chat else "text_completion",
                             "created": created, "model": model, "choices": [], "usage": _usage(req, req.age)}
                    yield b"data: " + json.dumps(final, separators=(",", ":")).encode() + b"\n\n"
                yield SSE_DONE
                return
    finally:
        cluster.abort(req)


async def _decode(request: Request, chat: bool) -> Response:
    cluster = _cluster(request)
    payload = await _payload(request)
    if isinstance(payload, JSONResponse):
        return payload
    g = request.app.state.replica
    if g is None:
        rank = request.headers.get("x-data-parallel-rank")
        if rank is None:
            g = cluster.pick_rank()
        elif not rank.isdigit() or int(rank) >= cluster.config.num_replicas:
            return _json_error(400, f"X-data-parallel-rank {rank!r} is not a rank of this server")
        else:
            g = int(rank)
    rep = cluster.replicas[g]
    if rep.killed:
        cluster.counts["rejected"] += 1
        return _json_error(503, f"decode replica {g} is down (emulated fault)")
    if rep.fail_rate and cluster.rng.random() < rep.fail_rate:
        cluster.counts["failed_injected"] += 1
        return _json_error(500, f"decode replica {g} failed (emulated fault)")
    poison = cluster.config.poison_word
    if poison and poison in json.dumps(payload.get("prompt", payload.get("messages"))):
        cluster.counts["failed_injected"] += 1
        return _json_error(500, f"decode replica {g} cannot serve this request (emulated poison request)")
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    kv = payload.get("kv_transfer_params")
    prompt = None
    if isinstance(kv, dict) and kv.get("do_remote_prefill"):
        prompt = cluster.take_hold(kv, request_id)
    if prompt is None:  # no remote prefill (or it is gone): prefill here
        prompt = words_prompt_tokens(payload)
        await asyncio.sleep(cluster.scaled(cluster.prefill_seconds(prompt)))
    output = cluster.output_len(payload)
    limit = int(payload.get("max_completion_tokens") or payload.get("max_tokens") or 16)
    req = _Req(rid=request_id, prompt=prompt, output=output, replica=g, event=asyncio.Event(), limit=limit)
    if rep.break_rate and output > 1 and cluster.rng.random() < rep.break_rate:
        req.break_at = int(cluster.rng.integers(1, output))
    cluster.submit(req)
    if payload.get("stream"):
        return StreamingResponse(_stream(cluster, req, payload, chat), media_type="text/event-stream")
    text: list[str] = []
    finish = None
    async for raw in _stream(cluster, req, {**payload, "stream_options": {"include_usage": True}}, chat):
        if raw == SSE_DONE:
            break
        obj = json.loads(raw[6:])
        for choice in obj["choices"]:
            text.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
            finish = choice.get("finish_reason") or finish
    if not req.done or req.broken:
        return _json_error(500, "decode replica failed mid-request (emulated fault)")
    choice = ({"index": 0, "message": {"role": "assistant", "content": "".join(text)}} if chat
              else {"index": 0, "text": "".join(text)})
    choice.update(logprobs=None, finish_reason=finish)
    return JSONResponse({"id": ("chatcmpl-" if chat else "cmpl-") + req.rid,
                         "object": "chat.completion" if chat else "text_completion",
                         "created": int(time.time()), "model": cluster.config.model, "choices": [choice],
                         "usage": _usage(req, req.age)})


async def _prefill(request: Request, chat: bool) -> Response:
    cluster = _cluster(request)
    p = request.app.state.prefill_index
    payload = await _payload(request)
    if isinstance(payload, JSONResponse):
        return payload
    if cluster.prefill_killed[p]:
        return _json_error(503, f"prefill instance {p} is down (emulated fault)")
    if cluster.prefill_fail[p] and cluster.rng.random() < cluster.prefill_fail[p]:
        cluster.counts["failed_injected"] += 1
        return _json_error(500, f"prefill instance {p} failed (emulated fault)")
    prompt = words_prompt_tokens(payload)
    await asyncio.sleep(cluster.scaled(cluster.prefill_seconds(prompt)))
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    rank_header = request.headers.get("x-data-parallel-rank", "0")
    rank = int(rank_header) % cluster.config.prefill_dp if rank_header.isdigit() else 0
    engine_id = f"emu-prefill-{p}-dp{rank}"
    kv_in = payload.get("kv_transfer_params")
    kv_out = None
    if isinstance(kv_in, dict) and kv_in.get("do_remote_decode"):
        if kv_in.get("transfer_id"):  # Mooncake: decode pulls by transfer id, prefill returns nothing
            cluster.hold(str(kv_in["transfer_id"]), prompt, engine_id)
        else:  # NIXL: prefill tells decode where the blocks are
            cluster.hold(request_id, prompt, engine_id)
            blocks = -(-prompt // cluster.config.block_size)
            kv_out = {"do_remote_prefill": True, "do_remote_decode": False,
                      "remote_block_ids": list(range(blocks)), "remote_engine_id": engine_id,
                      "remote_request_id": request_id, "remote_host": "127.0.0.1",
                      "remote_port": 5600 + p, "tp_size": 1}
    cluster.counts["prefilled"] += 1
    token = emulated_text(1)
    choice = ({"index": 0, "message": {"role": "assistant", "content": token}} if chat
              else {"index": 0, "text": token})
    choice.update(logprobs=None, finish_reason="length")
    return JSONResponse({"id": ("chatcmpl-" if chat else "cmpl-") + request_id,
                         "object": "chat.completion" if chat else "text_completion",
                         "created": int(time.time()), "model": cluster.config.model, "choices": [choice],
                         "usage": {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1},
                         "kv_transfer_params": kv_out})


class _VllmCollector:
    """vLLM's metric names for the engines a server hosts."""

    def __init__(self, cluster: EmulatedCluster, engines: list[int], decode: bool) -> None:
        self.cluster = cluster
        self.engines = engines
        self.decode = decode

    def collect(self) -> Iterator[Any]:
        cl = self.cluster
        labels = ["engine", "model_name"]
        model = cl.config.model
        families = {
            "running": GaugeMetricFamily("vllm:num_requests_running", "Number of requests in model execution batches.", labels=labels),
            "waiting": GaugeMetricFamily("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels=labels),
            "kv": GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels=labels),
            "prompt": CounterMetricFamily("vllm:prompt_tokens", "Number of prefill tokens processed.", labels=labels),
            "gen": CounterMetricFamily("vllm:generation_tokens", "Number of generation tokens processed.", labels=labels),
        }
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=[*labels, "finished_reason"])
        for g in self.engines:
            key = [str(g), model]
            if self.decode:
                rep = cl.replicas[g]
                families["running"].add_metric(key, len(rep.running))
                families["waiting"].add_metric(key, len(rep.waiting))
                families["kv"].add_metric(key, min(1.0, rep.load / cl.config.kv_capacity_tokens))
                families["prompt"].add_metric(key, rep.prompt_tokens)
                families["gen"].add_metric(key, rep.generated)
                for reason in ("length", "stop", "abort"):
                    success.add_metric([*key, reason], rep.finished[reason])
            else:
                for name in families:
                    families[name].add_metric(key, 0)
        yield from families.values()
        yield success


router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    """200 unless this server's replica (or the header's DP rank) or prefill instance is down."""
    cluster = _cluster(request)
    state = request.app.state
    if state.prefill_index is not None:
        down = cluster.prefill_killed[state.prefill_index]
    else:
        g = state.replica
        rank = request.headers.get("x-data-parallel-rank")
        if g is None and rank is not None and rank.isdigit() and int(rank) < cluster.config.num_replicas:
            g = int(rank)
        down = (cluster.replicas[g].killed if g is not None
                else all(r.killed for r in cluster.replicas))
    return Response(status_code=503 if down else 200)


@router.get("/v1/models")
async def models(request: Request) -> Response:
    """The emulated model."""
    return JSONResponse({"object": "list", "data": [
        {"id": _cluster(request).config.model, "object": "model", "created": 0, "owned_by": "balanceroute",
         "root": _cluster(request).config.model, "max_model_len": 1 << 20}]})


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    """Prefill or decode, depending on the server's role."""
    if request.app.state.prefill_index is not None:
        return await _prefill(request, chat=False)
    return await _decode(request, chat=False)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    """Prefill or decode, depending on the server's role."""
    if request.app.state.prefill_index is not None:
        return await _prefill(request, chat=True)
    return await _decode(request, chat=True)


@router.get("/get_load")
async def get_load(request: Request) -> Response:
    """``{"load": KV tokens}`` of this replica (DP server: the header's rank, else all ranks)."""
    cluster = _cluster(request)
    g = request.app.state.replica
    rank = request.headers.get("x-data-parallel-rank")
    if g is None and rank is not None and rank.isdigit() and int(rank) < cluster.config.num_replicas:
        g = int(rank)
    load = cluster.replicas[g].load if g is not None else sum(r.load for r in cluster.replicas)
    return JSONResponse({"load": load})


@router.get("/query")
async def query(request: Request) -> Response:
    """Mooncake bootstrap: ``{dp_rank: {"engine_id": ..., "worker_addr": ...}}``."""
    p = request.app.state.prefill_index
    if p is None:
        return _json_error(404, "only prefill servers have a bootstrap /query")
    return JSONResponse({str(r): {"engine_id": f"emu-prefill-{p}-dp{r}",
                                  "worker_addr": {"0": {"0": f"tcp://127.0.0.1:{5600 + p}"}}}
                         for r in range(_cluster(request).config.prefill_dp)})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """vLLM's gauge and counter names for this server's engines."""
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/stats")
async def stats(request: Request) -> Response:
    """The emulator's measurements (cluster-wide, on every server)."""
    return JSONResponse(_cluster(request).stats())


@router.post("/stats/reset")
async def stats_reset(request: Request) -> Response:
    """Start a new measurement window."""
    _cluster(request).reset_stats()
    return JSONResponse(_cluster(request).stats())


@router.post("/fault/{role}/{index}")
async def fault(request: Request, role: str, index: int) -> Response:
    """Fault injection. ``role`` = ``decode`` or ``prefill``; body ``{"action", "value"}`` with
    action ``kill``, ``revive``, ``slow`` (decode: step-time factor), ``fail_rate`` or
    ``break_rate`` (decode)."""
    cluster = _cluster(request)
    payload = await _payload(request)
    if isinstance(payload, JSONResponse):
        return payload
    action, value = payload.get("action"), payload.get("value", 0.0)
    if not isinstance(value, (int, float)):
        return _json_error(400, "value must be a number")
    if role == "decode" and 0 <= index < cluster.config.num_replicas:
        rep = cluster.replicas[index]
        if action == "kill":
            cluster.kill(index)
        elif action == "revive":
            rep.killed = False
            cluster._work.set()
        elif action == "slow" and value > 0:
            rep.slow = float(value)
        elif action == "fail_rate" and 0 <= value <= 1:
            rep.fail_rate = float(value)
        elif action == "break_rate" and 0 <= value <= 1:
            rep.break_rate = float(value)
        else:
            return _json_error(400, f"bad decode fault {payload!r}")
        return JSONResponse({"replica": index, "killed": rep.killed, "slow": rep.slow,
                             "fail_rate": rep.fail_rate, "break_rate": rep.break_rate})
    if role == "prefill" and 0 <= index < cluster.config.num_prefill:
        if action in ("kill", "revive"):
            cluster.prefill_killed[index] = action == "kill"
        elif action == "fail_rate" and 0 <= value <= 1:
            cluster.prefill_fail[index] = float(value)
        else:
            return _json_error(400, f"bad prefill fault {payload!r}")
        return JSONResponse({"prefill": index, "killed": cluster.prefill_killed[index],
                             "fail_rate": cluster.prefill_fail[index]})
    return _json_error(404, f"no {role} {index}")


def _app(cluster: EmulatedCluster, *, replica: int | None, prefill_index: int | None, title: str) -> FastAPI:
    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.cluster = cluster
    app.state.replica = replica
    app.state.prefill_index = prefill_index
    registry = CollectorRegistry(auto_describe=True)
    if prefill_index is not None:
        engines, decode = list(range(cluster.config.prefill_dp)), False
    else:
        engines = [replica] if replica is not None else list(range(cluster.config.num_replicas))
        decode = True
    registry.register(_VllmCollector(cluster, engines, decode))
    app.state.registry = registry
    app.include_router(router)
    return app


def create_decode_app(cluster: EmulatedCluster, replica: int | None) -> FastAPI:
    """A decode server: replica ``replica``, or (``None``) all replicas as DP ranks."""
    return _app(cluster, replica=replica, prefill_index=None,
                title=f"emulated decode {replica if replica is not None else 'DP'}")


def create_prefill_app(cluster: EmulatedCluster, index: int) -> FastAPI:
    """Prefill instance ``index``."""
    return _app(cluster, replica=None, prefill_index=index, title=f"emulated prefill {index}")
