"""Replaying a workload against an OpenAI endpoint (``balanceroute loadgen``).

Each workload row i becomes one streamed request with s_i prompt tokens and
``max_tokens = o_i`` with ``ignore_eos`` (so the server generates exactly o_i tokens). The
prompt is s_i token ids (``prompt_style="ids"``, exact on any vLLM server; completions only) or
s_i words (``"words"``: exact on the emulator, approximate on a real tokenizer; chat messages
carry s_i − 4 words since the emulator adds 4 template tokens per message).

Open loop: request i is sent at ``arrival_s[i] / rate_scale``. Closed loop: ``concurrency``
clients each send the next request when their previous one ends. Reported: throughput (completion
tokens / makespan), TTFT (send → first token), TPOT ((last − first token) / (n − 1)), end-to-end
latency, errors; with ``emulator_stats`` the emulator's measured imbalance and throughput over
the same window.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import numpy as np

from balanceroute.core.workloads.base import Workload

__all__ = ["LoadgenConfig", "RequestRecord", "run_load", "run_load_sync"]

_PROMPT_TOKEN_ID = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadgenConfig:
    """Where and how to send the workload (see the module docstring)."""

    url: str
    api: Literal["completions", "chat"] = "completions"
    model: str = "balanceroute-emulator"
    mode: Literal["closed", "open"] = "closed"
    concurrency: int = 64
    rate_scale: float = 1.0
    prompt_style: Literal["ids", "words"] = "ids"
    timeout_s: float = 600.0
    time_limit_s: float | None = None
    emulator_stats: str | None = None
    api_key_env: str | None = "OPENAI_API_KEY"

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"{self.url=} must be an http(s) URL")
        if self.api not in ("completions", "chat"):
            raise ValueError(f"{self.api=} must be 'completions' or 'chat'")
        if self.mode not in ("closed", "open"):
            raise ValueError(f"{self.mode=} must be 'closed' or 'open'")
        if self.concurrency < 1:
            raise ValueError(f"{self.concurrency=} must be >= 1")
        if not self.rate_scale > 0:
            raise ValueError(f"{self.rate_scale=} must be > 0")
        if self.prompt_style not in ("ids", "words"):
            raise ValueError(f"{self.prompt_style=} must be 'ids' or 'words'")
        if self.api == "chat" and self.prompt_style == "ids":
            raise ValueError("chat requests need prompt_style='words'")
        if not self.timeout_s > 0:
            raise ValueError(f"{self.timeout_s=} must be > 0")


@dataclass(slots=True)
class RequestRecord:
    """What one request measured (times in seconds; NaN where not applicable)."""

    ok: bool = False
    error: str = ""
    sent: float = float("nan")
    ttft: float = float("nan")
    tpot: float = float("nan")
    e2e: float = float("nan")
    completion_tokens: int = 0


def _body(config: LoadgenConfig, prompt_len: int, output_len: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": config.model, "max_tokens": int(output_len), "ignore_eos": True,
                            "stream": True, "stream_options": {"include_usage": True}}
    if config.api == "chat":
        body["messages"] = [{"role": "user", "content": "hi " * max(1, int(prompt_len) - 4)}]
    elif config.prompt_style == "ids":
        body["prompt"] = [_PROMPT_TOKEN_ID] * int(prompt_len)
    else:
        body["prompt"] = "hi " * int(prompt_len)
    return body


async def _one(client: httpx.AsyncClient, config: LoadgenConfig, path: str, headers: dict[str, str],
               prompt_len: int, output_len: int) -> RequestRecord:
    rec = RequestRecord(sent=time.perf_counter())
    first = last = None
    try:
        async with client.stream("POST", config.url + path, json=_body(config, prompt_len, output_len),
                                 headers=headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                rec.error = f"HTTP {resp.status_code}: {text[:160]}"
                return rec
            buf = b""
            async for chunk in resp.aiter_raw():
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if not event.startswith(b"data:"):
                        continue
                    data = event[5:].strip()
                    if data == b"[DONE]":
                        rec.ok = not rec.error
                        continue
                    obj = json.loads(data)
                    if "error" in obj:
                        rec.error = str(obj["error"].get("message", obj["error"]))[:160]
                        continue
                    now = time.perf_counter()
                    for choice in obj.get("choices") or ():
                        if choice.get("text") or (choice.get("delta") or {}).get("content"):
                            first = now if first is None else first
                            last = now
                    if obj.get("usage"):
                        rec.completion_tokens = int(obj["usage"].get("completion_tokens") or 0)
    except httpx.HTTPError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:160]
        rec.ok = False
    if rec.ok and not rec.completion_tokens:
        rec.ok, rec.error = False, "no usage in the stream"
    end = time.perf_counter()
    rec.e2e = end - rec.sent
    if first is not None:
        rec.ttft = first - rec.sent
        if rec.completion_tokens > 1 and last is not None:
            rec.tpot = (last - first) / (rec.completion_tokens - 1)
    return rec


def _pct(values: np.ndarray, prefix: str, scale: float) -> dict[str, float]:
    values = values[~np.isnan(values)]
    if values.size == 0:
        return {f"{prefix}_p50": float("nan"), f"{prefix}_p95": float("nan"), f"{prefix}_p99": float("nan")}
    p50, p95, p99 = np.percentile(values, [50, 95, 99]) * scale
    return {f"{prefix}_p50": float(p50), f"{prefix}_p95": float(p95), f"{prefix}_p99": float(p99)}


async def run_load(workload: Workload, config: LoadgenConfig, *,
                   client: httpx.AsyncClient | None = None) -> tuple[dict[str, Any], list[RequestRecord]]:
    """Replay ``workload``; returns (summary metrics, per-request records in workload order)."""
    n = len(workload)
    if n == 0:
        raise ValueError("the workload has no requests")
    if config.mode == "open" and workload.arrival_s is None:
        raise ValueError(f"workload {workload.name!r} has no arrival times: use the closed loop")
    path = "/v1/chat/completions" if config.api == "chat" else "/v1/completions"
    key = os.environ.get(config.api_key_env) if config.api_key_env else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    own = client is None
    http = client or httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
                                       timeout=httpx.Timeout(config.timeout_s, connect=10.0))
    records: list[RequestRecord] = [RequestRecord(error="not sent") for _ in range(n)]
    prompt = workload.prompt_len.tolist()
    output = workload.output_len.tolist()
    try:
        if config.emulator_stats:
            await http.post(config.emulator_stats.rstrip("/") + "/reset")
        start = time.perf_counter()
        stop_at = start + config.time_limit_s if config.time_limit_s else float("inf")

        async def send(i: int) -> None:
            records[i] = await _one(http, config, path, headers, prompt[i], output[i])

        if config.mode == "closed":
            cursor = iter(range(n))

            async def client_loop() -> None:
                for i in cursor:
                    if time.perf_counter() >= stop_at:
                        return
                    await send(i)

            await asyncio.gather(*(client_loop() for _ in range(min(config.concurrency, n))))
        else:
            assert workload.arrival_s is not None
            times = (workload.arrival_s - workload.arrival_s[0]) / config.rate_scale
            tasks = []
            for i in range(n):
                delay = start + float(times[i]) - time.perf_counter()
                if start + float(times[i]) >= stop_at:
                    break
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(send(i)))
            await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        emulator = None
        if config.emulator_stats:
            emulator = (await http.get(config.emulator_stats)).json()
    finally:
        if own:
            await http.aclose()

    sent = [r for r in records if r.error != "not sent"]
    ok = [r for r in sent if r.ok]
    errors: dict[str, int] = {}
    for r in sent:
        if not r.ok:
            kind = r.error.split(":")[0] or "error"
            errors[kind] = errors.get(kind, 0) + 1
    tokens = sum(r.completion_tokens for r in sent)
    arr = {k: np.array([getattr(r, k) for r in ok], dtype=np.float64) for k in ("ttft", "tpot", "e2e")}
    summary: dict[str, Any] = {
        "requests": len(sent), "ok": len(ok), "errors": len(sent) - len(ok), "error_kinds": errors,
        "duration_s": duration, "completion_tokens": tokens,
        "throughput_tok_s": tokens / duration if duration > 0 else 0.0,
        "request_rate_s": len(ok) / duration if duration > 0 else 0.0,
        **_pct(arr["ttft"], "ttft_s", 1.0), **_pct(arr["tpot"], "tpot_ms", 1e3),
        **_pct(arr["e2e"], "e2e_s", 1.0),
    }
    if emulator is not None:
        summary["emulator"] = {k: emulator[k] for k in (
            "mean_imbalance", "mean_imbalance_all", "barrier_idle_fraction", "throughput_tok_s",
            "throughput_loaded_tok_s", "mean_step_ms", "steps", "generated_tokens", "kv") if k in emulator}
    return summary, records


def run_load_sync(workload: Workload, config: LoadgenConfig) -> tuple[dict[str, Any], list[RequestRecord]]:
    """:func:`run_load` in a fresh event loop."""
    return asyncio.run(run_load(workload, config))
