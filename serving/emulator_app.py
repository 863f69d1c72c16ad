"""The emulated cluster's HTTP servers: vLLM's OpenAI-compatible API, ``/metrics``,
``/stats`` and fault injection, over the shared :class:`~.emulator.EmulatedCluster` (see
``serving/emulator.py`` for what is emulated and how it is measured).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect

from .emulator import EmulatedCluster, EmulatedRequest, emulated_text
from .protocol import SSE_DONE, error_body, words_prompt_tokens

__all__ = ["create_decode_app", "create_prefill_app"]


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


def _chunk(req: EmulatedRequest, cid: str, created: int, model: str, chat: bool, text: str | None,
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


def _usage(req: EmulatedRequest, done: int) -> dict[str, int]:
    return {"prompt_tokens": req.prompt, "total_tokens": req.prompt + done, "completion_tokens": done}


async def _stream(cluster: EmulatedCluster, req: EmulatedRequest, payload: dict, chat: bool) -> AsyncIterator[bytes]:
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
        if payload.get("routed_dp_rank") is not None:  # SGLang names the rank in the body
            rank = str(payload["routed_dp_rank"])
        if rank is None:
            g = cluster.pick_rank()
        elif not rank.isdigit() or int(rank) >= cluster.config.num_replicas:
            return _json_error(400, f"X-data-parallel-rank {rank!r} is not a rank of this server")
        else:
            g = int(rank)
    rep = cluster.replicas[g]
    await cluster.wait_thawed(g)  # a hung replica answers nothing
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
    elif payload.get("bootstrap_room") is not None:  # SGLang: pull from the room's prefill leg
        prompt = await cluster.pull_room(int(payload["bootstrap_room"]))
        if prompt is None:
            return _json_error(500, "Decode transfer failed for request rank=0 "
                               f"bootstrap_room={payload['bootstrap_room']}: Lost connection with prefill "
                               "instance (emulated)")
    if prompt is None:  # no remote prefill (or it is gone): prefill here
        prompt = words_prompt_tokens(payload)
        await asyncio.sleep(cluster.scaled(cluster.prefill_seconds(prompt)))
    output = cluster.output_len(payload)
    limit = int(payload.get("max_completion_tokens") or payload.get("max_tokens") or 16)
    req = EmulatedRequest(rid=request_id, prompt=prompt, output=output, replica=g, event=asyncio.Event(), limit=limit)
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
    await cluster.wait_thawed(prefill=p)
    if cluster.prefill_killed[p]:
        return _json_error(503, f"prefill instance {p} is down (emulated fault)")
    if cluster.prefill_fail[p] and cluster.rng.random() < cluster.prefill_fail[p]:
        cluster.counts["failed_injected"] += 1
        return _json_error(500, f"prefill instance {p} failed (emulated fault)")
    prompt = words_prompt_tokens(payload)
    await asyncio.sleep(cluster.scaled(cluster.prefill_seconds(prompt)))
    await cluster.wait_thawed(prefill=p)  # hung mid-prefill: the answer waits
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    rank_header = request.headers.get("x-data-parallel-rank", "0")
    rank = int(rank_header) % cluster.config.prefill_dp if rank_header.isdigit() else 0
    engine_id = f"emu-prefill-{p}-dp{rank}"
    kv_in = payload.get("kv_transfer_params")
    kv_out = None
    if payload.get("bootstrap_room") is not None:  # SGLang: answer once decode pulled the KV
        if not await cluster.serve_room(int(payload["bootstrap_room"]), prompt):
            return _json_error(500, f"prefill instance {p}: no decode leg joined bootstrap room "
                               f"{payload['bootstrap_room']} within the bootstrap timeout (emulated)")
    elif isinstance(kv_in, dict) and kv_in.get("do_remote_decode"):
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
            "preempted": CounterMetricFamily("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                                             labels=labels),
        }
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=[*labels, "finished_reason"])
        cache = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                  labels=["block_size", "engine", "num_gpu_blocks"])
        block = cl.config.block_size
        for g in self.engines:
            key = [str(g), model]
            if self.decode:
                rep = cl.replicas[g]
                families["running"].add_metric(key, len(rep.running))
                families["waiting"].add_metric(key, len(rep.waiting))
                families["kv"].add_metric(key, min(1.0, rep.blocks * block / cl.kv_budget))  # blocks in use
                cache.add_metric([str(block), str(g), str(cl.kv_budget // block)], 1.0)
                families["prompt"].add_metric(key, rep.prompt_tokens)
                families["gen"].add_metric(key, rep.generated)
                families["preempted"].add_metric(key, rep.preempted)
                for reason in ("length", "stop", "abort"):
                    success.add_metric([*key, reason], rep.finished[reason])
            else:
                for name in families:
                    families[name].add_metric(key, 0)
        yield from families.values()
        yield success
        if self.decode:
            yield cache


router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    """200 unless this server's replica (or the header's DP rank) or prefill instance is down."""
    cluster = _cluster(request)
    state = request.app.state
    if state.prefill_index is not None:
        await cluster.wait_thawed(prefill=state.prefill_index)
        down = cluster.prefill_killed[state.prefill_index]
    else:
        g = state.replica
        rank = request.headers.get("x-data-parallel-rank")
        if g is None and rank is not None and rank.isdigit() and int(rank) < cluster.config.num_replicas:
            g = int(rank)
        await cluster.wait_thawed(g)
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


@router.get("/v1/loads")
async def loads(request: Request) -> Response:
    """SGLang's per-rank load report (``GET /v1/loads``, SGLang 0.5.x shape): one ``loads``
    entry per DP rank this decode server hosts (a one-replica server is rank 0)."""
    cluster = _cluster(request)
    g = request.app.state.replica
    if request.app.state.prefill_index is not None:
        return _json_error(404, "only decode servers report /v1/loads here")
    ranks = [(0, g)] if g is not None else list(enumerate(range(cluster.config.num_replicas)))
    entries = []
    for rank, k in ranks:
        rep = cluster.replicas[k]
        entries.append({"dp_rank": rank, "num_running_reqs": len(rep.running),
                        "num_waiting_reqs": len(rep.waiting), "num_used_tokens": rep.load,
                        "max_total_num_tokens": cluster.kv_budget, "max_running_requests": cluster.config.slots,
                        "token_usage": rep.load / cluster.kv_budget, "gen_throughput": 0.0})
    return JSONResponse({"timestamp": time.time(), "version": "emulated", "loads": entries,
                         "disaggregation": {}})


@router.post("/inject")
async def inject(request: Request) -> Response:
    """Traffic that bypasses every proxy: ``{"replica", "prompt", "output", "count"}`` queues
    ``count`` requests of ``prompt`` + ``output`` tokens straight on decode replica ``replica``
    (nobody reads their streams; they run to the end)."""
    cluster = _cluster(request)
    payload = await _payload(request)
    if isinstance(payload, JSONResponse):
        return payload
    try:
        g, prompt = int(payload["replica"]), int(payload.get("prompt", 64))
        output, count = int(payload.get("output", 64)), int(payload.get("count", 1))
    except (KeyError, TypeError, ValueError):
        return _json_error(400, "inject needs integer replica (and optional prompt, output, count)")
    if not 0 <= g < cluster.config.num_replicas or min(prompt, output, count) < 1:
        return _json_error(400, f"bad inject {payload!r}")
    cluster.inject(g, prompt, output, count)
    return JSONResponse({"replica": g, "injected": count})


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
    action ``kill``, ``revive``, ``hang``/``thaw`` (as SIGSTOP/SIGCONT: nothing answered,
    streams frozen), ``slow`` (decode: step-time factor), ``fail_rate`` or ``break_rate`` (decode)."""
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
            cluster.revive(index)
        elif action in ("hang", "thaw"):
            cluster.hang(index, action == "hang")
        elif action == "slow" and value > 0:
            rep.slow = float(value)
        elif action == "fail_rate" and 0 <= value <= 1:
            rep.fail_rate = float(value)
        elif action == "break_rate" and 0 <= value <= 1:
            rep.break_rate = float(value)
        else:
            return _json_error(400, f"bad decode fault {payload!r}")
        return JSONResponse({"replica": index, "killed": rep.killed, "hung": rep.hung, "slow": rep.slow,
                             "fail_rate": rep.fail_rate, "break_rate": rep.break_rate})
    if role == "prefill" and 0 <= index < cluster.config.num_prefill:
        if action in ("kill", "revive"):
            cluster.prefill_killed[index] = action == "kill"
        elif action in ("hang", "thaw"):
            cluster.prefill_hung[index] = action == "hang"
        elif action == "fail_rate" and 0 <= value <= 1:
            cluster.prefill_fail[index] = float(value)
        else:
            return _json_error(400, f"bad prefill fault {payload!r}")
        return JSONResponse({"prefill": index, "killed": cluster.prefill_killed[index],
                             "hung": cluster.prefill_hung[index],
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
