"""Real prefill→decode KV hand-off: vLLM CPU servers with NIXL behind ``serve --kv-dialect nixl``.

One prefill server (``kv_producer``) and two decode servers (``kv_consumer``; the second with
``--data-parallel-size 2``, its ranks addressed by ``X-data-parallel-rank``: three decode
replicas for the proxy), vLLM's NixlConnector on CPU (``kv_buffer_device: cpu``, UCX over loopback), serving a tiny Llama with
**seeded random weights** written here (``vllm_tiny_model.py --weights``): dummy weights give
near-uniform logits, so a wrong hand-off would be invisible; these make the top-k logprobs a
fingerprint of the KV the decode server attended to. Checked on every request of the openai
client matrix (stream / non-stream, chat / completions, usage off / final / continuous):

* the KV came over NIXL: decode's ``vllm:prompt_tokens_by_source_total`` grew by the prompt
  under ``external_kv_transfer`` (on one engine) and not at all under ``local_compute``;
* the top-k logprobs equal those of a colocated run of the same prompt on a decode server
  (another ``cache_salt``, so nothing is reused from a cache);
* exact token accounting (usage, vLLM's generation counters on prefill — 1 token — and decode,
  the proxy's relayed tokens), and the proxy's ledger back to 0.

A client that hangs up during decode aborts the decode request, and the prefill server has
released the request's blocks (its KV usage back to 0, no lease expiry). The short-lease test
tells the proxy the prefill server's lease is ``SHORT_LEASE_S`` and holds a pool that cannot
drain within it: no decode request is forwarded past it (decode takes no KV but the held
streams'), each late request is prefilled again, then answered with a clear
``kv_lease_expired`` error.

The servers' own lease (``kv_lease_duration``) is ``LEASE_S`` = 180 s, not shorter: vLLM counts a
hand-off as expired when decode's done-notice reaches prefill after the lease, even though the KV
arrived whole. On this 2-core box that notice came over 60 s late beside a two-worker reproduce
while each of the four NIXL agents' UCX progress threads spun a core; since ``nixl_site`` (on the
servers' ``PYTHONPATH``) lets those threads sleep, the box is no longer saturated by idle servers
(docs/real-pd.md), and the lease stays long because the tests must not hinge on the load beside
them. vLLM has no per-request lease, so the short-lease test uses the proxy's lease
(shorter than the server's: the proxy only gets more careful) rather than a fourth server.

Needs the vLLM venv of ``.ci/vllm-venv.sh`` with ``nixl`` in it (``BALANCEROUTE_VLLM_PYTHON``)
and a machine where ``nixl_probe.py`` can move bytes between two processes; skipped, with the
reason, otherwise. The three servers start at once, share one module fixture (≈ 3 GB RSS each)
and are killed by process group at teardown. ``BALANCEROUTE_VLLM_PD_URLS=prefill,decode,dp-decode`` runs the module against
servers already started with the same flags (docs/real-pd.md), for working on the tests.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.servers import free_port, wait_http

from .test_vllm_cpu import (
    CASES,
    _case_id,
    _process,
    _tail,
    draining,
    metric,
    prompt_tokens,
    scrape,
    wait_until,
)

VLLM_PYTHON = os.environ.get("BALANCEROUTE_VLLM_PYTHON", "")
#: on the servers' PYTHONPATH: its sitecustomize stops NIXL's progress thread from spinning a core
NIXL_SITE = Path(__file__).with_name("nixl_site")
RUNNING = [u for u in os.environ.get("BALANCEROUTE_VLLM_PD_URLS", "").split(",") if u]
MODEL = "tiny-llama"
SEED = 0
#: the servers' kv_lease_duration (and the matrix proxy's --kv-lease). vLLM counts a hand-off as
#: expired when decode's done-notice reaches prefill after the lease, though the KV arrived whole:
#: 12 s failed whole runs here (notices 8-13 s late on two starved cores), and so did 60 s once a
#: two-worker reproduce ran beside the suite (load ≈ 20: a notice over 60 s late, the KV whole),
#: both before nixl_site stopped the four progress threads from spinning.
LEASE_S = 180
#: the lease the short-lease test's proxy is told (the servers keep LEASE_S: vLLM has no
#: per-request lease, and a fourth server would cost 3 GB and a busy-polling UCX thread)
SHORT_LEASE_S = 8
#: how long a check waits for prefill to release a request's blocks (its done-notice, or the lease)
RELEASE_TIMEOUT_S = LEASE_S + 30.0
#: the short-lease test holds every decode slot until its waiting requests are answered, at most
#: this long (a LONG_STREAM decode takes longer here; a correct proxy answers within two prefills
#: and two forward-by periods)
HOLD_CAP_S = 120.0
#: ... or longer while the prefill server still has a request, up to this: beside two busy loops
#: a second prefill of 300 tokens took 115 s, the hold ended first, and the freed slots rightly
#: served the requests within their second lease (200, not the 503 the test waits for)
HOLD_MAX_S = 360.0
START_TIMEOUT_S = 900.0
TOP_K = 3
PROMPT_LEN = 300
MESSAGES = [{"role": "user", "content": "route this request to the replica with the least load, "
                                        "then stream every token of the answer back " * 4}]
#: the servers' --max-model-len (the tiny model has 65,536 positions; 2 KB of KV per token)
MAX_MODEL_LEN = 32_768
# A decode long enough to be running when the client hangs up or the test ends: 3,500 tokens once
# ended on a fast replica inside the short-lease test's hold (64 s), freeing a slot it relied on.
LONG_STREAM = 30_000
#: the second decode server runs this many DP engines, addressed by X-data-parallel-rank
DP_SIZE = 2
#: direct hand-offs tried per decode replica in the warm-up: CI once saw a fresh decode server
#: answer its first with a 500 (its KV did not arrive); the failures are reported as a warning
WARM_ATTEMPTS = 3


def _why_skip() -> str | None:
    if not (VLLM_PYTHON and os.access(VLLM_PYTHON, os.X_OK)):
        return ("no vLLM CPU venv: BALANCEROUTE_VLLM_PYTHON is unset or not an executable "
                f"({VLLM_PYTHON!r}); `bash .ci/vllm-venv.sh` builds it and prints the path (.ci/run "
                "does both)")
    probe = subprocess.run([VLLM_PYTHON, "-c", "import importlib.util as u; print(u.find_spec('nixl') is not None)"],
                           capture_output=True, text=True, timeout=60)
    if probe.stdout.strip() != "True":
        return (f"nixl is not installed in the vLLM venv ({VLLM_PYTHON}): `bash .ci/vllm-venv.sh` "
                "adds it")
    # Can this machine move bytes between two processes with NIXL at all (no vLLM, no proxy)?
    env = {**os.environ, "PYTHONPATH": str(NIXL_SITE)}
    try:
        moved = subprocess.run([VLLM_PYTHON, str(Path(__file__).with_name("nixl_probe.py"))], capture_output=True,
                               text=True, timeout=240, env=env)
        said = (moved.stdout.strip().splitlines() or [f"no output (exit {moved.returncode})"])[-1]
        errors = [line.strip() for line in moved.stderr.splitlines() if "ERROR" in line or "Error" in line]
        said += f"; stderr: {errors[-1][-300:]}" if moved.returncode and errors else ""
    except subprocess.TimeoutExpired:
        said, moved = "failed: no answer in 240 s", None
    if moved is None or moved.returncode != 0:
        return f"this machine cannot move KV between two processes with NIXL on CPU (nixl_probe.py: {said})"
    return None


_SKIP = _why_skip()
pytestmark = [pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""), pytest.mark.timeout(1500)]


def prompt_ids(seed: int, n: int = PROMPT_LEN) -> list[int]:
    """``n`` token ids in [2, 400) from a seeded linear congruential walk (no BOS/EOS)."""
    state, out = 12345 + seed, []
    for _ in range(n):
        state = (1103515245 * state + 12345) % 2**31
        out.append(2 + (state >> 8) % 398)
    return out


# ------------------------------------------------------------------------ servers
def _vllm_env(side_port: int, cpus: str = "0") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    # nixl_site/sitecustomize.py: NIXL's UCX progress thread sleeps in poll() instead of spinning
    # a core per agent (four agents here: load 55 on 2 cores without it).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(NIXL_SITE), env.get("PYTHONPATH", "")) if p)
    # One OMP thread on core 0 for every server: on 2 cores this layout starved the proxy and the
    # test least.
    # TORCHDYNAMO_DISABLE: the logprobs op vLLM wraps in torch.compile runs eagerly; its first
    # call compiled (inductor, C++) for 1-5 min per server here, for a 400-token vocabulary.
    env.update(TORCHDYNAMO_DISABLE="1", VLLM_HOST_IP="127.0.0.1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=cpus,
               VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT=str(side_port),
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def _vllm_cmd(model: Path, port: int, role: str, *extra: str) -> list[str]:
    kv = {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu",
          "kv_connector_extra_config": {"kv_lease_duration": LEASE_S}}
    return [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", MODEL, "--seed", "0", "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8", "--dtype", "float32", "--enforce-eager",
            "--disable-uvicorn-access-log", "--kv-transfer-config", _json(kv), *extra]


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


@dataclass
class Servers:
    """The prefill server and the decode servers (the last one with ``DP_SIZE`` ranks), with
    their logs."""

    prefill: str
    decode: list[str]
    logs: Path
    started_s: float = 0.0
    warmed_s: float = 0.0

    def all(self) -> list[str]:
        return [self.prefill, *self.decode]

    def replicas(self) -> list[tuple[str, int | None]]:
        """The proxy's decode replicas: (url, DP rank or ``None``)."""
        *single, dp = self.decode
        return [(u, None) for u in single] + [(dp, r) for r in range(DP_SIZE)]


def _counters(url: str) -> dict[str, float]:
    """The vLLM counters the checks read, on one server."""
    s = scrape(url)

    def get(name: str, **labels: str) -> float:
        found = [v for n, lab, v in s if n == name and all(lab.get(k) == w for k, w in labels.items())]
        return float(sum(found))

    return {"external": get("vllm:prompt_tokens_by_source_total", source="external_kv_transfer"),
            "local": get("vllm:prompt_tokens_by_source_total", source="local_compute"),
            "generated": get("vllm:generation_tokens_total"),
            "length": get("vllm:request_success_total", finished_reason="length"),
            "running": get("vllm:num_requests_running") + get("vllm:num_requests_waiting"),
            "kv_usage": get("vllm:kv_cache_usage_perc"),
            "expired": get("vllm:nixl_num_kv_expired_reqs_total"),
            "after_expiry": get("vllm:nixl_num_notifications_after_expiry_total"),
            "xfers": get("vllm:nixl_xfer_time_seconds_count")}


def _log(path: Path) -> str:
    return _tail(path) if path.exists() else f"(no log: {path.name} was started outside the test)"


def _sum(snaps: list[dict[str, float]]) -> dict[str, float]:
    return {k: sum(s[k] for s in snaps) for k in snaps[0]}


def _by_engine(url: str) -> dict[str, float]:
    """``external_kv_transfer`` prompt tokens per engine (DP rank) of one server."""
    out: dict[str, float] = {}
    for n, lab, v in scrape(url):
        if n == "vllm:prompt_tokens_by_source_total" and lab.get("source") == "external_kv_transfer":
            out[lab.get("engine", "0")] = out.get(lab.get("engine", "0"), 0.0) + v
    return out


WARM_TIMEOUT_S = 600  # a fresh server's first logprobs request compiles its sampler, three at once


def _post(url: str, body: dict[str, Any], chat: bool = False,
          headers: dict[str, str] | None = None) -> httpx.Response:
    """A warm-up request, straight to a vLLM server (a time-out fails naming the server)."""
    path = url + ("/v1/chat/completions" if chat else "/v1/completions")
    try:
        return httpx.post(path, json=body, headers=headers or {}, timeout=WARM_TIMEOUT_S)
    except httpx.TimeoutException as exc:
        raise AssertionError(f"{path} answered nothing within {WARM_TIMEOUT_S} s ({exc!r})") from None


def _completion(url: str, body: dict[str, Any], chat: bool = False,
                headers: dict[str, str] | None = None) -> dict[str, Any]:
    resp = _post(url, body, chat, headers)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _settle(prefill: str) -> None:
    """An idle prefill engine reads decode's transfer notifications only when it next steps:
    two one-token requests a second apart, so late notifications are counted before a check."""
    body = {"model": MODEL, "prompt": prompt_ids(998, 4), "max_tokens": 1, "cache_salt": uuid.uuid4().hex}
    for _ in range(2):
        _completion(prefill, body)
        time.sleep(1.0)


def _warm(servers: Servers) -> None:
    """The first ``logprobs`` request of a fresh server compiles its sampler (up to minutes on
    2 cores): one per server, in parallel; then one direct NIXL hand-off per decode server (its
    first pulls the prefill server's NIXL metadata)."""
    body = {"model": MODEL, "prompt": prompt_ids(999, 20), "max_tokens": 2, "logprobs": TOP_K,
            "temperature": 0.0, "ignore_eos": True, "return_tokens_as_token_ids": True}
    p0 = _counters(servers.prefill)
    with ThreadPoolExecutor(len(servers.all())) as pool:
        list(pool.map(lambda u: _completion(u, body), servers.all()))
        chat = {**{k: v for k, v in body.items() if k != "prompt"}, "messages": MESSAGES, "logprobs": True,
                "top_logprobs": TOP_K}
        list(pool.map(lambda u: _completion(u, chat, chat=True), servers.all()))
    failed: list[str] = []
    for k, (url, rank) in enumerate(servers.replicas()):
        log = servers.logs / f"decode-{min(k, 1)}.log"
        for attempt in range(1, WARM_ATTEMPTS + 1):
            before = _by_engine(url)
            salt = f"warm-{k}-{uuid.uuid4().hex}"
            pre = _completion(servers.prefill, {**body, "max_tokens": 1, "cache_salt": salt,
                                                "kv_transfer_params": {"do_remote_decode": True,
                                                                       "do_remote_prefill": False}})
            params = pre.get("kv_transfer_params")
            assert isinstance(params, dict) and params.get("remote_block_ids"), pre
            resp = _post(url, {**body, "cache_salt": salt, "kv_transfer_params": params},
                         headers={} if rank is None else {"X-data-parallel-rank": str(rank)})
            if resp.status_code == 200:
                break
            # vLLM fails a request whose KV did not arrive (kv_load_failure_policy "fail"): a 500
            failed.append(f"decode {url} rank {rank}, hand-off {attempt}: {resp.status_code} {resp.text[:200]}\n"
                          f"decode log:\n{_log(log)}\nprefill log:\n{_log(servers.logs / 'prefill.log')}")
        else:
            raise AssertionError(f"{WARM_ATTEMPTS} warm-up hand-offs failed:\n" + "\n".join(failed))
        grew = {e: n - before.get(e, 0) for e, n in _by_engine(url).items() if n != before.get(e, 0)}
        assert grew == {str(rank or 0): len(body["prompt"])}, (
            f"decode {url} rank {rank} did not take the prompt's KV over NIXL: {grew}\n" + _log(log))
    if failed:
        # seen in CI: a fresh decode server's first hand-off answered 500 (others report a first
        # request after start-up failing and the next one working)
        warnings.warn("warm-up hand-offs failed and were retried:\n" + "\n".join(failed), stacklevel=1)

    # A server's first hand-off can notify prefill after the lease (79 s once, load 50): then
    # prefill counts the expiry, and the late notice only when it next steps. Every warm-up KV
    # was pulled, so wait until each expiry has its late notice, lest one land in a test's count
    # (a failed hand-off's KV expires with no notice: at most one expiry each without one).
    def notices_in() -> bool:
        _settle(servers.prefill)
        p = _counters(servers.prefill)
        silent = (p["expired"] - p0["expired"]) - (p["after_expiry"] - p0["after_expiry"])
        return p["kv_usage"] == 0 and 0 <= silent <= len(failed)

    wait_until(notices_in, "prefill to count every warm-up hand-off's done-notice", timeout=RELEASE_TIMEOUT_S + 60,
               describe=lambda: f"prefill {p0} -> {_counters(servers.prefill)}")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    if RUNNING:
        out = Servers(prefill=RUNNING[0], decode=RUNNING[1:], logs=tmp_path_factory.mktemp("logs-pd"))
        _warm(out)
        yield out
        return
    model = tmp_path_factory.mktemp("tiny-llama-seeded")
    subprocess.run([VLLM_PYTHON, str(Path(__file__).with_name("vllm_tiny_model.py")), str(model),
                    "--weights", str(SEED)], check=True, capture_output=True, timeout=300)
    logs = tmp_path_factory.mktemp("logs-pd")
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        started = []
        # the DP server's threads are not bound: every DP engine steps while any rank has work
        dp = ("--data-parallel-size", str(DP_SIZE), "--data-parallel-address", "127.0.0.1")
        for name, role, extra, cpus in [("prefill", "kv_producer", (), "0"), ("decode-0", "kv_consumer", (), "0"),
                                        ("decode-1", "kv_consumer", dp, "nobind")]:
            port = free_port()
            log = logs / f"{name}.log"
            proc = stack.enter_context(_process(_vllm_cmd(model, port, role, *extra), log,
                                                _vllm_env(free_port(), cpus)))
            started.append((f"http://127.0.0.1:{port}", proc, log))
        for url, proc, log in started:
            wait_http(url + "/v1/models", timeout=START_TIMEOUT_S, proc=proc, interval=1.0,
                      context=lambda log=log: _tail(log))
        out = Servers(prefill=started[0][0], decode=[u for u, _, _ in started[1:]], logs=logs,
                      started_s=time.monotonic() - t0)
        _warm(out)
        out.warmed_s = time.monotonic() - t0
        print(f"\nvLLM PD servers: up after {out.started_s:.0f} s, warm after {out.warmed_s:.0f} s")
        yield out


@contextlib.contextmanager
def proxy(servers: Servers, log: Path, *extra: str, lease_s: float = LEASE_S) -> Iterator[str]:
    """``balanceroute serve --kv-dialect nixl`` in front of ``servers``, told the prefill
    server's lease is ``lease_s``; yields its URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    config = log.with_suffix(".json")
    config.write_text(_json({"prefill": [servers.prefill], "decode": [
        {"url": u} if rank is None else {"url": u, "dp_rank": rank} for u, rank in servers.replicas()]}))
    cmd = [sys.executable, "-m", "balanceroute.cli", "serve", "--config", str(config), "--host", "127.0.0.1",
           "--port", str(port), "--kv-dialect", "nixl", "--slots", "8", "--kv-lease", str(lease_s),
           "--health-interval", "0", "--log-level", "debug",
           # an engine step here can stall for tens of seconds on two starved cores: a retry (a
           # new prefill, never the same KV) is right for a proxy but breaks exact accounting
           "--prefill-timeout", "240", "--first-token-timeout", "240", "--stall-timeout", "240",
           # nor is a test client starved between its connect and its request
           "--header-timeout", "240", "--body-timeout", "240",
           # the short-lease test's held streams are not read while the pool waits
           "--write-stall-timeout", "240", *extra]
    with _process(cmd, log, env) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", timeout=120.0, proc=proc, interval=0.2, context=lambda: _tail(log))
        yield url


@dataclass
class PD:
    """The proxy in front of the PD servers."""

    url: str
    servers: Servers
    log: Path
    chat_prompt_tokens: int = 0
    seen: list[str] = field(default_factory=list)

    def snapshot(self) -> tuple[dict[str, float], dict[str, float]]:
        """(prefill's counters, the decode servers' counters summed)."""
        return _counters(self.servers.prefill), _sum([_counters(u) for u in self.servers.decode])

    def relayed(self) -> float:
        return metric(scrape(self.url), "balanceroute_relayed_tokens_total")

    def idle(self) -> bool:
        s = scrape(self.url)
        return (metric(s, "balanceroute_in_flight") == 0 and metric(s, "balanceroute_pool_size") == 0
                and metric(s, "balanceroute_replica_kv_load_tokens") == 0
                and metric(s, "balanceroute_replica_running") == 0)

    def upstream_idle(self) -> bool:
        p, d = self.snapshot()
        return p["running"] == 0 and d["running"] == 0 and p["kv_usage"] == 0

    def tail(self) -> str:
        return "proxy log:\n" + _tail(self.log, 30)


@pytest.fixture(scope="module")
def pd(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PD]:
    log = tmp_path_factory.mktemp("logs-pd-proxy") / "proxy.log"
    with proxy(servers, log) as url:
        yield PD(url=url, servers=servers, log=log, chat_prompt_tokens=prompt_tokens(servers.decode[0], MODEL, MESSAGES))


# ---------------------------------------------------------------------- requests
def _body(api: str, n: int, salt: str, stream: bool = False, usage: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": n, "temperature": 0.0, "ignore_eos": True,
                            "cache_salt": salt, "stream": stream, "return_tokens_as_token_ids": True}
    if stream and usage is not None:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": usage == "continuous"}
    if api == "chat":
        body.update(messages=MESSAGES, logprobs=True, top_logprobs=TOP_K)
    else:
        body.update(prompt=prompt_ids(1), logprobs=TOP_K)
    return body


Tops = list[tuple[str, dict[str, float]]]  # per generated token: (token, {top-k token: logprob})


def _tops(choice: dict[str, Any], api: str) -> Tops:
    lp = choice.get("logprobs") or {}
    if api == "chat":
        return [(c["token"], {t["token"]: t["logprob"] for t in c["top_logprobs"]}) for c in lp.get("content") or []]
    return list(zip(lp.get("tokens") or [], lp.get("top_logprobs") or [], strict=True))


def _send(url: str, api: str, body: dict[str, Any]) -> tuple[Tops, dict[str, Any] | None, list[Any], list[str]]:
    """One request with the openai client: (per-token top-k, the final usage, every chunk's
    usage, finish reasons)."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    extra = ("ignore_eos", "cache_salt", "return_tokens_as_token_ids")  # vLLM's own fields
    kwargs = {k: v for k, v in body.items() if k not in extra}
    kwargs["extra_body"] = {k: body[k] for k in extra if k in body}
    create = client.chat.completions.create if api == "chat" else client.completions.create
    result = create(**kwargs)
    if not body["stream"]:
        data = result.model_dump()
        return _tops(data["choices"][0], api), data["usage"], [], [data["choices"][0]["finish_reason"]]
    tops: Tops = []
    usages: list[Any] = []
    finishes: list[str] = []
    for chunk in result:
        data = chunk.model_dump()
        usages.append(data.get("usage"))
        for choice in data["choices"]:
            tops.extend(_tops(choice, api))
            if choice.get("finish_reason"):
                finishes.append(choice["finish_reason"])
    return tops, usages[-1] if usages else None, usages, finishes


def assert_same_logprobs(got: Tops, want: Tops, context: str) -> None:
    """Same tokens, same top-k tokens, logprobs equal to float32 rounding."""
    assert [t for t, _ in got] == [t for t, _ in want], f"tokens differ from the colocated run; {context}"
    for k, ((_, g), (_, w)) in enumerate(zip(got, want, strict=True)):
        assert g.keys() == w.keys() and all(math.isclose(g[t], w[t], rel_tol=0, abs_tol=1e-4) for t in g), (
            f"top-{TOP_K} logprobs of token {k} differ from the colocated run: {g} vs {w}; {context}")


def run_case(pd: PD, api: str, stream: bool, usage: str | None, n: int) -> None:
    """One request through the proxy, checked against the engines' counters and a colocated
    run of the same prompt."""
    wait_until(pd.upstream_idle, "vLLM to be idle before the request", timeout=RELEASE_TIMEOUT_S)
    salt = f"pd-{uuid.uuid4().hex}"
    body = _body(api, n, salt, stream, usage)
    prompt = pd.chat_prompt_tokens if api == "chat" else PROMPT_LEN
    (p0, d0), relayed = pd.snapshot(), pd.relayed()
    e0 = {(u, e): v for u in pd.servers.decode for e, v in _by_engine(u).items()}
    tops, last, usages, finishes = _send(pd.url, api, body)
    wait_until(pd.idle, "the proxy's ledger to drain", describe=pd.tail)
    wait_until(lambda: pd.snapshot()[1]["generated"] >= d0["generated"] + n, "decode's generation counter")
    wait_until(pd.upstream_idle, "prefill to release the request's blocks", timeout=RELEASE_TIMEOUT_S,
               describe=lambda: f"{pd.snapshot()}")
    p1, d1 = pd.snapshot()
    moved = {k: d1[k] - d0[k] for k in d0}
    context = f"decode counters grew by {moved}; prefill {p0} -> {p1}; {pd.tail()}"
    # the logprobs are those of the same prompt computed on one server
    want, *_ = _send(pd.servers.decode[0], api, {**_body(api, n, f"colocated-{salt}"), "stream": False})
    assert_same_logprobs(tops, want, context)
    # the KV came over NIXL, nothing was recomputed on decode
    assert moved["external"] == prompt and moved["local"] == 0, context
    assert moved["xfers"] >= 1, context
    e1 = {(u, e): v for u in pd.servers.decode for e, v in _by_engine(u).items()}
    took = [v - e0.get(k, 0) for k, v in e1.items() if v != e0.get(k, 0)]
    assert took == [prompt], f"the prompt's KV went to more than one engine: {e0} -> {e1}; {context}"
    # exact accounting: prefill made 1 token, decode n, the proxy relayed n
    assert (p1["generated"] - p0["generated"], moved["generated"]) == (1, n), context
    assert pd.relayed() - relayed == n
    assert p1["expired"] == p0["expired"] and p1["after_expiry"] == p0["after_expiry"], context
    assert len(tops) == n and finishes == ["length"]
    if not stream or usage is not None:
        assert last is not None and (last["prompt_tokens"], last["completion_tokens"]) == (prompt, n)
    if stream:
        if usage is None:
            assert all(u is None for u in usages)
        elif usage == "final":
            assert all(u is None for u in usages[:-1]), "usage on chunks the client did not ask it for"
        else:
            done = [u["completion_tokens"] for u in usages[:-1]]
            assert done == sorted(done) and done[-1] == n


# -------------------------------------------------------------------------- tests
IDLE_AGENT = """
import time
from nixl import _bindings
from nixl._api import nixl_agent, nixl_agent_config
config = _bindings.nixlAgentConfig()
config.pthrDelay = 0  # what nixl_agent does for every agent
agent = nixl_agent("idle", nixl_agent_config(num_threads=4))
time.sleep(1.0)
c0 = time.process_time()
time.sleep(3.0)
print(config.pthrDelay, time.process_time() - c0)
"""


def test_nixl_progress_thread_sleeps_when_idle() -> None:
    """With ``nixl_site`` on the path, an agent's progress-thread delay is never 0 ms (NIXL's
    Python agent sets 0: its UCX progress thread then polls with a 0 ms timeout, a core per
    agent), and an idle agent's process uses well under a core. Without ``nixl_site``: delay 0
    and about 3 CPU-s in 3 s on a quiet box; on a busy one the spinning thread gets less CPU, so
    the delay is the check that cannot pass by luck."""
    env = {**os.environ, "PYTHONPATH": str(NIXL_SITE)}
    out = subprocess.run([VLLM_PYTHON, "-c", IDLE_AGENT], capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    delay_us, cpu_s = out.stdout.split()[-2:]
    assert int(delay_us) >= 1000, f"NIXL progress-thread delay {delay_us} µs: the thread polls with a 0 ms timeout"
    assert float(cpu_s) < 1.0, f"an idle NIXL agent used {float(cpu_s):.2f} CPU-s in 3 s"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_openai_matrix(pd: PD, case: tuple[str, bool, str | None]) -> None:
    run_case(pd, *case, n=6 + CASES.index(case))


def test_disconnect_during_decode_aborts_and_prefill_releases(pd: PD) -> None:
    """Hang up after a few streamed tokens: decode aborts (no request finishes with
    ``length``, far fewer than ``max_tokens`` generated), the prefill server holds nothing (its
    KV usage 0, no lease ran out) and the proxy's ledger is empty."""
    wait_until(pd.upstream_idle, "vLLM to be idle before the request", timeout=RELEASE_TIMEOUT_S)
    p0, d0 = pd.snapshot()
    body = {**_body("completions", LONG_STREAM, f"abort-{uuid.uuid4().hex}", stream=True), "logprobs": None}
    events = 0
    with httpx.Client(timeout=120) as http, http.stream("POST", pd.url + "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            events += line.startswith("data: {")
            if events == 5:
                break
    assert events == 5
    wait_until(lambda: pd.snapshot()[1]["running"] == 0, "decode to drop the request", describe=pd.tail)
    wait_until(pd.idle, "the proxy's ledger to drain", describe=pd.tail)
    wait_until(pd.upstream_idle, "prefill to hold no KV", timeout=RELEASE_TIMEOUT_S,
               describe=lambda: f"{pd.snapshot()}")
    p1, d1 = pd.snapshot()
    context = f"prefill {p0} -> {p1}; decode {d0} -> {d1}; {pd.tail()}"
    assert d1["length"] == d0["length"], "decode ran the request to max_tokens: the abort did not reach it; " + context
    assert d1["generated"] - d0["generated"] < LONG_STREAM, context
    assert d1["external"] - d0["external"] == PROMPT_LEN, context
    assert p1["expired"] == p0["expired"], "prefill's blocks were freed by the lease, not by the hand-off; " + context


def _hold_until_answered(futures: list[Any], t0: float, prefill: str, first_tokens: float) -> None:
    """Wait until every future is done: at most ``HOLD_CAP_S`` from ``t0``, or past it while the
    prefill server is still at work — a request running or waiting, or fewer than
    ``first_tokens`` first tokens made so far (its gauges can stand still through a starved
    engine step; its token counter is what it has finished) — and then ``SHORT_LEASE_S`` + 2 s
    more (a correct proxy answers a pooled request within its forward-by time of its prefill's
    answer), up to ``HOLD_MAX_S``."""
    end, hard_end = t0 + HOLD_CAP_S, t0 + HOLD_MAX_S
    last_busy = end  # past the cap: a request pooled just before it gets its forward-by time
    while not all(f.done() for f in futures):
        now = time.monotonic()
        if now >= hard_end:
            return
        if now >= end:
            c = _counters(prefill)
            if c["running"] > 0 or c["generated"] < first_tokens:
                last_busy = time.monotonic()
            elif time.monotonic() - last_busy >= SHORT_LEASE_S + 2.0:
                return
        time.sleep(0.2 if now < end else 1.0)


def test_short_lease_never_forwards_late(servers: Servers, tmp_path: Path) -> None:
    """The proxy is told the prefill server's lease is ``SHORT_LEASE_S``; one slot per decode
    replica, all three held by long streams: four more requests wait in the pool past what that
    lease allows. None reaches decode late (decode takes no KV but the streams'); each is
    prefilled again (the prefill server makes two first tokens for each), then answered 503
    ``kv_lease_expired``. The streams are hung up once the four are answered (or after
    ``HOLD_CAP_S`` — longer while prefill is still busy — should the proxy hold them): not earlier, as a slot freed while a request's
    second prefill is still within its lease rightly serves it (two prefills took over 10 s at
    load 45; beside two busy loops a second prefill once ran two minutes with vLLM's running and
    waiting gauges at 0, so the hold also waits for the prefills' first tokens)."""
    log = tmp_path / "proxy-short-lease.log"
    waiting = 4
    with proxy(servers, log, "--slots", "1", lease_s=SHORT_LEASE_S) as url:
        pd = PD(url=url, servers=servers, log=log)
        wait_until(pd.upstream_idle, "vLLM to be idle before the requests", timeout=RELEASE_TIMEOUT_S)
        p0, d0 = pd.snapshot()
        forward_by = SHORT_LEASE_S - 2.0  # the proxy's default transfer margin

        def one(k: int) -> tuple[int, dict[str, Any]]:
            body = {**_body("completions", 5, f"lease-{k}-{uuid.uuid4().hex}"), "logprobs": None}
            resp = httpx.post(url + "/v1/completions", json=body, timeout=600)
            return resp.status_code, resp.json()

        pool = ThreadPoolExecutor(waiting)
        with contextlib.ExitStack() as stack:  # leaving it hangs the streams up
            http = stack.enter_context(httpx.Client(timeout=300))
            streams = []
            for k in range(len(servers.replicas())):  # hold every decode slot
                body = {**_body("completions", LONG_STREAM, f"hold-{k}-{uuid.uuid4().hex}", stream=True),
                        "logprobs": None}
                resp = stack.enter_context(http.stream("POST", url + "/v1/completions", json=body))
                assert resp.status_code == 200
                lines = resp.iter_lines()
                while not next(lines).startswith("data: {"):
                    pass
                stack.enter_context(draining(lines))  # read as it comes: no write stall ends it
                streams.append(lines)
            t0 = time.monotonic()
            futures = [pool.submit(one, k) for k in range(waiting)]
            # every waiting request prefilled twice: the streams' first tokens and two each
            _hold_until_answered(futures, t0, servers.prefill,
                                 p0["generated"] + len(servers.replicas()) + 2 * waiting)
        results = [f.result() for f in futures]
        pool.shutdown()
        elapsed = time.monotonic() - t0
        wait_until(pd.idle, "the proxy's ledger to drain", describe=pd.tail)
        wait_until(lambda: pd.snapshot()[1]["running"] == 0, "decode to drop the streams")
        _settle(servers.prefill)
        p1, d1 = pd.snapshot()
        context = (f"results {results} after {elapsed:.1f} s; prefill {p0} -> {p1}; decode {d0} -> {d1}; "
                   f"{pd.tail()}")
        # decode got the held streams' prompts, over NIXL, and nothing else: no waiting request
        # was forwarded, however late
        streams_kv = PROMPT_LEN * len(servers.replicas())
        assert d1["external"] - d0["external"] == streams_kv, (
            "the proxy forwarded a request after its lease; " + context)
        assert d1["local"] == d0["local"], context
        assert p1["after_expiry"] == p0["after_expiry"], "a decode server pulled KV after its lease; " + context
        assert [status for status, _ in results] == [503] * waiting, context
        assert elapsed >= 2 * forward_by, "answered before two forward-by periods passed; " + context
        assert all(body["error"]["code"] == "kv_lease_expired" for _, body in results), context
        assert metric(scrape(url), "balanceroute_retries_total", stage="reprefill") == waiting, context
        # prefill made one first token per prefill: the streams', then two per waiting request
        # (the second after the first lease ran out), and _settle's two
        assert p1["generated"] - p0["generated"] == len(servers.replicas()) + 2 * waiting + 2, context
