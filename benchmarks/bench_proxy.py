"""Proxy benchmarks on 127.0.0.1, emulator and proxy in their own processes.

``overhead``: the same streams read straight from the emulator's decode servers and through
``balanceroute serve`` (no prefill stage, so only the proxy is added), in the same run:
 * added latency per streamed token — client receive time minus the emulator's generation time
   (``emulator_ts``, the shared monotonic clock), P50/P99, proxied minus direct;
 * relayed tokens/s at saturation (tiny steps, many streams) — proxied / direct.
``policies``: br0 and round_robin through the same proxy on an emulated G = 8 cluster under a
saturated closed loop, a decode-heavy workload (ServeGen DeepSeek-R1, outputs scaled down);
the emulator's measured mean imbalance and token throughput (emulated time).

    python benchmarks/bench_proxy.py [--section overhead|policies|all] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np

CLI = [sys.executable, "-m", "balanceroute.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


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
def proxy(mapping: dict[str, Any], extra: list[str]) -> Iterator[str]:
    """A ``serve`` subprocess on a free port; yields its URL."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "proxy.json")
        with open(path, "w") as fh:
            json.dump(mapping, fh)
        port = _free_port()
        proc = subprocess.Popen([*CLI, "serve", "--config", path, "--port", str(port),
                                 "--log-level", "warning", *extra])
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_http(url + "/health")
            yield url
        finally:
            proc.terminate()
            proc.wait(10)


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
                                 "loaded_throughput_tok_s": emu["loaded_throughput_tok_s"],
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
    parser.add_argument("--section", choices=("overhead", "policies", "all"), default="all")
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--repeats", type=int, default=1, help="policy runs per policy")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    result: dict[str, Any] = {}
    if args.section in ("overhead", "all"):
        result["overhead"] = bench_overhead(args.quick)
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
