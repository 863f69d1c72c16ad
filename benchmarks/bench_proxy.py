"""Proxy benchmarks on 127.0.0.1, emulator and proxy in their own processes.

``overhead``: the same streams read straight from the emulator's decode servers and through
``balanceroute serve`` (no prefill stage, so only the proxy is added), in the same run:
 * added latency per streamed token — client receive time minus the emulator's generation time
   (``emulator_ts``, the shared monotonic clock), P50/P99, proxied minus direct;
 * relayed tokens/s at saturation (tiny steps, many streams) — proxied / direct.
``peer``: the same emulated decode cluster behind ``balanceroute serve`` and behind vllm-router
(PyPI ``vllm-router``, Rust, installed in the benchmark's own venv by ``make bench-venv``: a peer to
measure, not a dependency), one router at a time, side by side:
 * proxy CPU per relayed token (µs): utime + stime of the router's process tree from
   ``/proc/<pid>/stat`` over a saturating run, divided by the tokens the clients received;
 * chunks/s ceiling on one core: the router pinned to one CPU (every thread), relayed SSE chunks
   per CPU-second of the router — the rate one fully busy core sustains at that per-chunk cost
   (the measured rate and the router's share of its core are printed next to it);
 * added per-token latency P50/P99 at 16 streams, as in ``overhead`` (minus direct);
 the 1-minute load average seen during the run is printed, with a warning above 2.
``policies``: br0 and round_robin through the same proxy on an emulated G = 8 cluster under a
saturated closed loop, a decode-heavy workload (ServeGen DeepSeek-R1, outputs scaled down);
the emulator's measured mean imbalance and token throughput (emulated time).

    python benchmarks/bench_proxy.py [--section overhead|peer|policies|all] [--quick] [--json]
                                     [--vllm-router PATH] [--floor] [--uvicorn]
                                     [--rounds N] [--seconds S] [--cpu-only] [--baseline REV]

``--baseline REV`` adds our proxy at an earlier commit as a column of the peer section (built
into a scratch directory first), with the per-round ratio: a change measured against the code
before it, in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np

if not __package__:  # run as a script: the repository root holds the ``benchmarks`` package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.servers import free_port, wait_http  # noqa: E402

CLI = [sys.executable, "-m", "balanceroute.cli"]


@contextlib.contextmanager
def _router_process(cmd: list[str], url: str) -> Iterator[subprocess.Popen]:
    """A router subprocess, up once ``url``/health answers 200; terminated by handle."""
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            wait_http(url + "/health", timeout=60.0, proc=proc)
        except RuntimeError:
            log.seek(0)
            sys.stderr.write(log.read()[-4000:].decode(errors="replace"))
            raise
        yield proc
    finally:
        log.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def emulator(args: list[str]) -> Iterator[dict[str, Any]]:
    """An emulator subprocess; yields the proxy config mapping it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "proxy.json")
        proc = subprocess.Popen([*CLI, "emulate", "--port", "0", "--write-proxy-config", path, *args])
        try:
            end = time.monotonic() + 30
            while not os.path.exists(path):
                if proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError("emulator did not start")
                time.sleep(0.05)
            with open(path) as fh:
                yield json.load(fh)
        finally:
            proc.terminate()
            proc.wait(10)


@contextlib.contextmanager
def proxy_process(mapping: dict[str, Any], extra: list[str],
                  cli: list[str] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """A ``serve`` subprocess (of ``cli``, default this tree's) on a free port; yields its URL
    and process."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "proxy.json")
        with open(path, "w") as fh:
            json.dump(mapping, fh)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [*(cli or CLI), "serve", "--config", path, "--host", "127.0.0.1", "--port", str(port),
               "--log-level", "warning", *extra]
        with _router_process(cmd, url) as proc:
            yield url, proc


@contextlib.contextmanager
def proxy(mapping: dict[str, Any], extra: list[str]) -> Iterator[str]:
    """A ``serve`` subprocess on a free port; yields its URL."""
    with proxy_process(mapping, extra) as (url, _):
        yield url


def default_vllm_router() -> str:
    """Where ``make bench-venv`` puts vllm-router: the machine's cache, not the clone."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "balanceroute", "bench-venv", "bin", "vllm-router")


@contextlib.contextmanager
def vllm_router(exe: str, worker_urls: list[str]) -> Iterator[tuple[str, subprocess.Popen]]:
    """vllm-router (round robin over ``worker_urls``) on free 127.0.0.1 ports, its Prometheus
    exporter on 127.0.0.1 too; yields its URL and process."""
    port, metrics_port = free_port(), free_port()
    while metrics_port == port:
        metrics_port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [exe, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *worker_urls,
           "--policy", "round_robin", "--prometheus-host", "127.0.0.1",
           "--prometheus-port", str(metrics_port), "--log-level", "warning"]
    with _router_process(cmd, url) as proc:
        yield url, proc


# ------------------------------------------------------------------- process accounting
def _process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (from /proc/*/stat parent ids)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, ()))
    return tree


def cpu_seconds(pid: int) -> float:
    """utime + stime (+ reaped children's) of ``pid``'s process tree, in seconds
    (/proc/<pid>/stat fields 14-17, all threads included)."""
    ticks = 0
    for p in _process_tree(pid):
        with contextlib.suppress(OSError):
            with open(f"/proc/{p}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            ticks += sum(int(x) for x in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def pin(pid: int, cpu: int) -> None:
    """Confine every thread of ``pid``'s process tree to ``cpu`` (threads started later
    inherit it)."""
    for p in _process_tree(pid):
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(tid), {cpu})


# ---------------------------------------------------------------------------- overhead
async def _stream_tokens(http: httpx.AsyncClient, url: str, n: int, lat: list[float], counter: list[int],
                         stop_at: float) -> None:
    body = {"model": "m", "prompt": [100] * 64, "max_tokens": n, "ignore_eos": True, "stream": True}
    while time.monotonic() < stop_at:
        async with http.stream("POST", url + "/v1/completions", json=body) as resp:
            buf = b""
            async for part in resp.aiter_raw():
                now = time.monotonic()
                buf += part
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    data = event[6:]
                    if data == b"[DONE]":
                        continue
                    obj = json.loads(data)
                    if obj.get("choices") and obj["choices"][0].get("text"):
                        lat.append(now - obj["emulator_ts"])
                        counter[0] += 1


async def _measure(urls: list[str], streams: int, n: int, seconds: float) -> tuple[np.ndarray, float]:
    lat: list[float] = []
    counter = [0]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        start = time.monotonic()
        await asyncio.gather(*(_stream_tokens(http, urls[i % len(urls)], n, lat, counter, start + seconds)
                               for i in range(streams)))
        elapsed = time.monotonic() - start
    return np.asarray(lat), counter[0] / elapsed


def bench_overhead(quick: bool) -> dict[str, Any]:
    """Added per-token latency (light load) and relayed tokens/s (saturation), direct vs proxied."""
    seconds = 4.0 if quick else 10.0
    out: dict[str, Any] = {}
    for phase, step, streams in (("latency", "b=0.02,a=0", 16), ("throughput", "b=0.002,a=0", 256)):
        args = ["--replicas", "4", "--slots", "64", "--prefill", "0", "--kv-dialect", "none",
                "--step-model", step, "--stamp-chunks"]
        with emulator(args) as mapping:
            direct_urls = [d["url"] for d in mapping["decode"]]
            direct, direct_tps = asyncio.run(_measure(direct_urls, streams, 200, seconds))
            with proxy({**mapping, "slots": 64, "policy": "br0"}, []) as url:
                proxied, proxied_tps = asyncio.run(_measure([url], streams, 200, seconds))
        if phase == "latency":
            d50, d99 = np.percentile(direct, [50, 99]) * 1e3
            p50, p99 = np.percentile(proxied, [50, 99]) * 1e3
            out["latency"] = {"streams": streams, "direct_p50_ms": d50, "direct_p99_ms": d99,
                              "proxied_p50_ms": p50, "proxied_p99_ms": p99,
                              "added_p50_ms": p50 - d50, "added_p99_ms": p99 - d99,
                              "tokens_measured": int(direct.size + proxied.size)}
        else:
            out["throughput"] = {"streams": streams, "direct_tok_s": direct_tps, "proxied_tok_s": proxied_tps,
                                 "ratio": proxied_tps / direct_tps if direct_tps else float("nan")}
    return out


# -------------------------------------------------------------------------------- peer
async def _count_stream(http: httpx.AsyncClient, url: str, n: int, counts: list[int], stop_at: float) -> None:
    """Streams of ``n`` tokens back to back until ``stop_at``; counts SSE events (chunks, the
    ``[DONE]`` excluded) and finished streams without decoding them."""
    body = {"model": "m", "prompt": [100] * 64, "max_tokens": n, "ignore_eos": True, "stream": True}
    while time.monotonic() < stop_at:
        async with http.stream("POST", url + "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                raise RuntimeError(f"{url}: HTTP {resp.status_code}")
            events, last = 0, b""
            async for part in resp.aiter_raw():
                events += (last + part).count(b"\n\n")
                last = part[-1:]
        counts[0] += events - 1
        counts[1] += 1


async def _closed_loop(url: str, streams: int, n: int, seconds: float) -> tuple[int, int, float]:
    """(chunks, tokens, wall seconds) of ``streams`` closed-loop streams started for
    ``seconds`` (each runs to its end)."""
    counts = [0, 0]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        start = time.monotonic()
        await asyncio.gather(*(_count_stream(http, url, n, counts, start + seconds) for _ in range(streams)))
        elapsed = time.monotonic() - start
    return counts[0], counts[1] * n, elapsed


@contextlib.contextmanager
def relay_floor(worker_urls: list[str], server: str = "native") -> Iterator[tuple[str, subprocess.Popen]]:
    """``benchmarks/relay_floor.py`` (a bare pipe through the proxy's upstream client, under
    ``server``: ``native`` — the proxy's own stack, spliced — or ``uvicorn``) on a free
    127.0.0.1 port; yields its URL and process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "relay_floor.py")
    with _router_process([sys.executable, script, str(port), ",".join(worker_urls), server], url) as proc:
        yield url, proc


@contextlib.contextmanager
def _retrying(start: Any, tries: int = 3) -> Iterator[tuple[str, subprocess.Popen]]:
    """``start()`` entered, started again (new free ports) when the router fails to come up:
    on a busy machine another process may take a port between :func:`free_port` and the bind."""
    for k in range(tries):
        with contextlib.ExitStack() as stack:
            try:
                started = stack.enter_context(start())
            except RuntimeError:
                if k == tries - 1:
                    raise
                continue
            yield started
            return


# ``python launcher.py SITE MODULE ARGS...``: MODULE run as ``__main__`` from the package in SITE
# (not from this tree, which an editable install would otherwise put first)
_LAUNCHER = """import runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, sys.argv.pop(1))
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""


@contextlib.contextmanager
def baseline_build(rev: str) -> Iterator[list[str]]:
    """This repository at git revision ``rev``, installed (compiled parts included) into a
    scratch directory, its numba kernels compiled there; yields the command that runs its CLI
    (``python launcher.py SITE balanceroute.cli``) — the baseline column of the peer section, so that a change
    is measured against the code before it in the same run. The scratch directory goes at exit."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as tmp:
        tree, site = os.path.join(tmp, "tree"), os.path.join(tmp, "site")
        subprocess.run(["git", "-C", root, "worktree", "add", "--detach", "--quiet", tree, rev], check=True)
        try:
            built = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                                    "--no-build-isolation", "--target", site, tree],
                                   capture_output=True, text=True)  # (setuptools' warnings: shown on failure)
            if built.returncode != 0:
                raise SystemExit(f"bench_proxy: installing {rev} failed:\n{built.stdout}{built.stderr}")
        finally:
            subprocess.run(["git", "-C", root, "worktree", "remove", "--force", tree], check=False)
        launcher = os.path.join(tmp, "launcher.py")
        with open(launcher, "w") as fh:
            fh.write(_LAUNCHER)
        # its kernels compiled once here, not while the router waits for the proxy to come up
        subprocess.run([sys.executable, launcher, site, "balanceroute.warm"], check=True, stdout=subprocess.DEVNULL)
        yield [sys.executable, launcher, site, "balanceroute.cli"]


def _routers(mapping: dict[str, Any], exe: str | None, floor: bool = False,
             uvicorn: bool = False, baseline: tuple[str, list[str]] | None = None,
             floor_tick: bool = False) -> list[tuple[str, Any]]:
    """(name, context manager yielding (url, process)) of ours, the peer when installed, and
    when asked the floor (on the native stack; with ``uvicorn`` also on uvicorn) and ours under
    uvicorn (``--http-server uvicorn``). Ours without health probes: on a saturated machine one
    late probe ejects a replica, and vllm-router probes once a minute; the relay is
    what is measured."""
    ours = {**mapping, "slots": 64, "policy": "br0", "health_interval_s": 0}
    workers = [d["url"] for d in mapping["decode"]]
    out: list[tuple[str, Any]] = [("balanceroute", lambda: proxy_process(ours, []))]
    if exe:
        out.append(("vllm-router", lambda: vllm_router(exe, workers)))
    if floor:
        out.append(("floor", lambda: relay_floor(workers)))
    if floor_tick:
        out.append(("floor + tick", lambda: relay_floor(workers, "native-tick")))
    if uvicorn:
        out.append(("ours on uvicorn", lambda: proxy_process(ours, ["--http-server", "uvicorn"])))
    if floor and uvicorn:
        out.append(("floor on uvicorn", lambda: relay_floor(workers, "uvicorn")))
    if baseline is not None:
        rev, cli = baseline
        out.append((f"ours at {rev}", lambda: proxy_process(ours, [], cli=cli)))
    return out


def bench_peer(quick: bool, exe: str | None, floor: bool = False, uvicorn: bool = False, *,
               rounds: int | None = None, seconds: float | None = None,
               cpu_only: bool = False, baseline: tuple[str, list[str]] | None = None,
               tokens: int = 200, floor_tick: bool = False) -> dict[str, Any]:
    """balanceroute serve and vllm-router, one after the other, in front of the same emulated
    decode cluster (G = 4, 20 ms steps), in rounds (direct, ours, peer; 3 rounds, 1 with
    ``quick``): added latency at 16 streams against the same round's direct read (chunks
    stamped), then, on unstamped (vLLM-shaped) chunks, the router pinned to one CPU and its CPU
    time over 64 streams (one token per chunk: no router falls behind at this rate, so the
    emulator never merges tokens). Latencies: the median over rounds; CPU: totals over rounds.
    ``floor`` adds ``relay_floor.py`` (the native server splicing the upstream chunks through
    the proxy's upstream client as they come) as a third router: what the HTTP stack, the event
    loop and the sockets alone cost; ``floor_tick`` adds it with the proxy's ledger and one BR-0
    tick per request (``native-tick``): that cost with the policy's decision and nothing else.
    ``rounds``/``seconds`` override the defaults; the routers
    take turns in each round, in reversed order every other round (no router always runs after
    the same one); ``cpu_only`` skips the latency rounds. The per-round ratio of our CPU per token
    to the peer's is kept too (its median and range: the load moves both routers of a round
    alike, less so rounds apart). ``baseline`` (revision, CLI command of :func:`baseline_build`)
    adds our proxy at that revision as a column, with its per-round ratio to ours. ``tokens``:
    the length of the CPU rows' streams (200; ``2`` makes the per-request work the main cost, and
    the row *CPU per request* its figure)."""
    seconds = seconds if seconds is not None else 4.0 if quick else 10.0
    rounds = rounds if rounds is not None else 1 if quick else 3
    cpu = max(os.sched_getaffinity(0))
    runs: dict[str, list[dict[str, float]]] = {}
    direct_runs: list[dict[str, float]] = []
    base = ["--replicas", "4", "--slots", "64", "--prefill", "0", "--kv-dialect", "none",
            "--step-model", "b=0.02,a=0"]
    loads: list[float] = [os.getloadavg()[0]]  # 1-minute load average, before each measurement
    nan = float("nan")

    def turns(k: int, mapping: dict[str, Any]) -> list[tuple[str, Any]]:
        order = _routers(mapping, exe, floor, uvicorn, baseline, floor_tick)
        return order if k % 2 == 0 else order[::-1]

    if not cpu_only:
        with emulator([*base, "--stamp-chunks"]) as mapping:
            for k in range(rounds):
                direct, _ = asyncio.run(_measure([d["url"] for d in mapping["decode"]], 16, 200, seconds))
                d50, d99 = (float(x) for x in np.percentile(direct, [50, 99]) * 1e3)
                direct_runs.append({"p50_ms": d50, "p99_ms": d99, "tokens": int(direct.size)})
                for name, start in turns(k, mapping):
                    loads.append(os.getloadavg()[0])
                    with _retrying(start) as (url, _):
                        lat, _ = asyncio.run(_measure([url], 16, 200, seconds))
                    p50, p99 = (float(x) for x in np.percentile(lat, [50, 99]) * 1e3)
                    runs.setdefault(name, []).append({"p50_ms": p50, "p99_ms": p99, "added_p50_ms": p50 - d50,
                                                      "added_p99_ms": p99 - d99})
    else:
        direct_runs.append({"p50_ms": nan, "p99_ms": nan, "tokens": 0})
    with emulator(base) as mapping:  # vLLM-shaped chunks (no stamp) for the CPU rows
        for k in range(rounds):
            for name, start in turns(k, mapping):
                loads.append(os.getloadavg()[0])
                with _retrying(start) as (url, proc):
                    pin(proc.pid, cpu)
                    before = cpu_seconds(proc.pid)
                    chunks, relayed, elapsed = asyncio.run(_closed_loop(url, 64, tokens, seconds))
                    used = cpu_seconds(proc.pid) - before
                if cpu_only:
                    runs.setdefault(name, []).append(dict.fromkeys(("p50_ms", "p99_ms", "added_p50_ms",
                                                                     "added_p99_ms"), nan))
                runs[name][k].update(cpu_s=used, tokens=relayed, chunks=chunks, elapsed_s=elapsed,
                                     requests=relayed // tokens, load=os.getloadavg()[0])
    out: dict[str, Any] = {"pinned_cpu": cpu, "seconds": seconds, "rounds": rounds, "latency_streams": 16,
                           "tokens_per_stream": tokens,
                           "cpu_streams": 64, "runs": runs, "direct_runs": direct_runs,
                           "direct": {k: float(np.median([r[k] for r in direct_runs])) for k in ("p50_ms", "p99_ms")},
                           "routers": {}, "load_average": {"min": min(loads), "max": max(loads),
                                                            "end": os.getloadavg()[0]}}
    for name, rs in runs.items():
        used, relayed, chunks, elapsed, requests = (sum(r[k] for r in rs) for k in (
            "cpu_s", "tokens", "chunks", "elapsed_s", "requests"))
        out["routers"][name] = {
            **{k: float(np.median([r[k] for r in rs])) for k in ("p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms")},
            "tokens_per_chunk": relayed / chunks, "cpu_us_per_token": 1e6 * used / relayed,
            "cpu_ms_per_request": 1e3 * used / requests,
            "chunks_per_cpu_s": chunks / used, "chunks_s": chunks / elapsed, "core_share": used / elapsed}
    ours, peer = out["routers"]["balanceroute"], out["routers"].get("vllm-router")
    out["targets"] = {"chunks_per_cpu_s >= 50000": ours["chunks_per_cpu_s"] >= 50_000}
    if peer is not None:
        out["cpu_per_token_ratio"] = ours["cpu_us_per_token"] / peer["cpu_us_per_token"]
        per_round = [(a["cpu_s"] / a["tokens"]) / (b["cpu_s"] / b["tokens"])
                     for a, b in zip(runs["balanceroute"], runs["vllm-router"])]
        out["cpu_per_token_ratio_rounds"] = per_round
        out["cpu_per_token_ratio_median"] = float(np.median(per_round))
        out["targets"]["cpu_per_token <= 1x vllm-router"] = out["cpu_per_token_ratio"] <= 1.0
        if not cpu_only:
            out["targets"]["added_p99 <= vllm-router + 1 ms"] = ours["added_p99_ms"] <= peer["added_p99_ms"] + 1.0
    if baseline is not None:
        then = runs[f"ours at {baseline[0]}"]
        out["baseline"] = baseline[0]
        out["cpu_per_token_vs_baseline_rounds"] = [(a["cpu_s"] / a["tokens"]) / (b["cpu_s"] / b["tokens"])
                                                   for a, b in zip(runs["balanceroute"], then)]
    return out


def print_peer(result: dict[str, Any], exe: str | None) -> None:
    """The side-by-side table."""
    peer = result["routers"].get("vllm-router")
    names = ["balanceroute", "vllm-router", *(k for k in result["routers"] if k not in ("balanceroute", "vllm-router"))]
    columns = [result["routers"].get(n) for n in names]
    rows = [
        ("proxy CPU per relayed token (µs)", "cpu_us_per_token", "{:.1f}"),
        (f"proxy CPU per request of {result['tokens_per_stream']} tokens (ms)", "cpu_ms_per_request", "{:.3f}"),
        ("chunks/s ceiling, one core", "chunks_per_cpu_s", "{:,.0f}"),
        ("  measured chunks/s (share of its core)", None, ""),
        ("added per-token latency P50, 16 streams (ms)", "added_p50_ms", "{:+.2f}"),
        ("added per-token latency P99, 16 streams (ms)", "added_p99_ms", "{:+.2f}"),
    ]
    print(f"{'':<46} " + " ".join(f"{n:>16}" for n in names))
    for label, key, fmt in rows:
        if key is None:
            cells = [f"{r['chunks_s']:,.0f} ({100 * r['core_share']:.0f} %)" if r else "—" for r in columns]
        else:
            cells = [fmt.format(r[key]) if r else "—" for r in columns]
        print(f"{label:<46} " + " ".join(f"{c:>16}" for c in cells))
    d = result["direct"]
    print(f"direct from the emulator: per-token latency P50 {d['p50_ms']:.2f} ms, P99 {d['p99_ms']:.2f} ms; "
          f"tokens per chunk relayed: " + ", ".join(f"{k} {r['tokens_per_chunk']:.2f}"
                                                    for k, r in result["routers"].items()))
    if peer is None:
        print(f"vllm-router not found ({exe or default_vllm_router()}): `make bench-venv` installs it")
    else:
        print(f"CPU per token: balanceroute / vllm-router = {result['cpu_per_token_ratio']:.2f}x over the "
              f"{result['rounds']} rounds' totals; per round median "
              f"{result['cpu_per_token_ratio_median']:.2f}x, range "
              f"{min(result['cpu_per_token_ratio_rounds']):.2f}–{max(result['cpu_per_token_ratio_rounds']):.2f}x")
        for name, rs in result["runs"].items():
            print(f"  {name} per round (µs/token): " + " ".join(
                f"{1e6 * r['cpu_s'] / r['tokens']:.1f}" for r in rs))
    if "baseline" in result:
        r = result["cpu_per_token_vs_baseline_rounds"]
        print(f"CPU per token: balanceroute / ours at {result['baseline']} per round: median "
              f"{float(np.median(r)):.2f}x, range {min(r):.2f}–{max(r):.2f}x")
    for target, met in result["targets"].items():
        print(f"target {target}: {'met' if met else 'NOT met'}")
    load = result["load_average"]
    print(f"load average (1 min) during the run: {load['min']:.2f}–{max(load['max'], load['end']):.2f}")
    if max(load["max"], load["end"]) > 2.0:
        print("WARNING: load average above 2 on this machine during the run: the latency rows "
              "(and to a lesser degree the CPU rows) are noise; rerun on a quieter machine")


# ---------------------------------------------------------------------------- policies
def bench_policies(quick: bool, repeats: int) -> dict[str, Any]:
    """br0 vs round_robin through the proxy: the emulator's measured imbalance and throughput."""
    from balanceroute.core.workloads import load_workload
    from balanceroute.core.workloads.base import Workload
    from balanceroute.serving.loadgen import LoadgenConfig, run_load_sync

    g_count, slots = 8, 8
    n = 200 if quick else 400
    base = load_workload("servegen-r1", requests=n, seed=1, clip_prompt=16_000, clip_output=3_000)
    workload = Workload(name="servegen-r1 (outputs clipped at 3000, then / 10)", prompt_len=base.prompt_len,
                        output_len=np.maximum(1, -(-base.output_len // 10)))
    args = ["--replicas", str(g_count), "--slots", str(slots), "--prefill", "2",
            "--step-model", "b=0.03,a=2e-6", "--prefill-time", "b=0.005,a=0", "--time-scale", "1.0"]
    runs: dict[str, list[dict[str, Any]]] = {"round_robin": [], "br0": []}
    for _ in range(repeats):
        for policy in runs:
            with emulator(args) as mapping, proxy({**mapping, "policy": policy, "pool_capacity": 1024}, []) as url:
                stats_url = mapping["decode"][0]["url"] + "/stats"
                config = LoadgenConfig(url=url, concurrency=g_count * slots + 2 * g_count, emulator_stats=stats_url)
                summary, _ = run_load_sync(workload, config)
            emu = summary["emulator"]
            runs[policy].append({"mean_imbalance": emu["mean_imbalance"], "throughput_tok_s": emu["throughput_tok_s"],
                                 "throughput_loaded_tok_s": emu["throughput_loaded_tok_s"],
                                 "mean_step_ms": emu["mean_step_ms"], "ok": summary["ok"],
                                 "tpot_p50_ms": summary["tpot_ms_p50"], "wall_tok_s": summary["throughput_tok_s"]})
    mean = {p: {k: float(np.mean([r[k] for r in rs])) for k in rs[0]} for p, rs in runs.items()}
    rr, br = mean["round_robin"], mean["br0"]
    return {"workload": workload.name, "requests": n, "G": g_count, "B": slots, "repeats": repeats,
            "runs": runs, "mean": mean,
            "imbalance_ratio_br0_over_rr": br["mean_imbalance"] / rr["mean_imbalance"],
            "throughput_gain_br0_over_rr": br["throughput_tok_s"] / rr["throughput_tok_s"] - 1.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", choices=("overhead", "peer", "policies", "all"), default="all")
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--repeats", type=int, default=1, help="policy runs per policy")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--floor", action="store_true",
                        help="peer section: also measure benchmarks/relay_floor.py (the HTTP stack alone; "
                             "with --uvicorn also on uvicorn)")
    parser.add_argument("--floor-tick", action="store_true",
                        help="peer section: also measure relay_floor.py with the proxy's ledger and one "
                             "BR-0 tick per request (the floor under the per-request goal)")
    parser.add_argument("--uvicorn", action="store_true",
                        help="peer section: also measure our proxy under uvicorn (--http-server uvicorn)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="peer section: alternating rounds (default 3; --quick 1)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="peer section: seconds per router per round (default 10; --quick 4)")
    parser.add_argument("--cpu-only", action="store_true",
                        help="peer section: only the CPU rows (no latency rounds)")
    parser.add_argument("--tokens", type=int, default=200,
                        help="peer section: tokens per stream in the CPU rows (2: the per-request work)")
    parser.add_argument("--baseline", metavar="REV", default=None,
                        help="peer section: also measure our proxy at git revision REV of this "
                             "repository (installed into a scratch directory, compiled parts and "
                             "numba kernels included: a minute or two first) as a column")
    parser.add_argument("--vllm-router", metavar="PATH", default=default_vllm_router(),
                        help="vllm-router executable for the peer section (default: where "
                             "`make bench-venv` installs it); the section runs without it")
    args = parser.parse_args()
    exe = args.vllm_router if os.access(args.vllm_router, os.X_OK) else None
    if args.tokens < 1:
        parser.error(f"--tokens {args.tokens}: a stream needs at least one token")
    result: dict[str, Any] = {}
    if args.section in ("overhead", "all"):
        result["overhead"] = bench_overhead(args.quick)
    if args.section in ("peer", "all"):
        with contextlib.ExitStack() as stack:
            baseline = None
            if args.baseline:
                baseline = (args.baseline, stack.enter_context(baseline_build(args.baseline)))
            result["peer"] = bench_peer(args.quick, exe, args.floor, args.uvicorn, rounds=args.rounds,
                                        seconds=args.seconds, cpu_only=args.cpu_only, baseline=baseline,
                                        tokens=args.tokens, floor_tick=args.floor_tick)
    if args.section in ("policies", "all"):
        result["policies"] = bench_policies(args.quick, args.repeats)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if "overhead" in result:
        lat, thr = result["overhead"]["latency"], result["overhead"]["throughput"]
        print(f"per-token latency  direct p50 {lat['direct_p50_ms']:.2f} ms p99 {lat['direct_p99_ms']:.2f} ms | "
              f"proxied p50 {lat['proxied_p50_ms']:.2f} ms p99 {lat['proxied_p99_ms']:.2f} ms | "
              f"added p50 {lat['added_p50_ms']:.2f} ms p99 {lat['added_p99_ms']:.2f} ms")
        print(f"relayed tokens/s   direct {thr['direct_tok_s']:.0f} | proxied {thr['proxied_tok_s']:.0f} | "
              f"ratio {thr['ratio']:.2f}")
    if "peer" in result:
        print_peer(result["peer"], args.vllm_router)
    if "policies" in result:
        pol = result["policies"]
        for name, m in pol["mean"].items():
            print(f"{name:>12}: mean imbalance {m['mean_imbalance']:.0f} tokens, throughput "
                  f"{m['throughput_tok_s']:.0f} tok/s (emulated), step {m['mean_step_ms']:.1f} ms")
        print(f"br0 / round_robin imbalance {pol['imbalance_ratio_br0_over_rr']:.3f}, "
              f"throughput {100 * pol['throughput_gain_br0_over_rr']:+.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
