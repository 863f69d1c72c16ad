"""Render the dashboard's panels from a real emulator + proxy run (Grafana is not installable here).

Starts ``balanceroute emulate`` (G replicas, lock-step decode), ``balanceroute serve`` in front
of it and ``balanceroute loadgen`` against the proxy, scrapes the proxy's ``/metrics`` once a
second, and draws the panels of ``balanceroute-proxy.json`` with matplotlib from those samples
(each panel evaluates the same expression over the scraped series: a rate over a sliding
window, a histogram quantile from the buckets). Everything binds 127.0.0.1 on free ports.

    python docs/grafana/scrape_run.py --seconds 90 --out docs/grafana/panels.png

The proxy runs with the speed fit and engine-reported state on (``--no-speed-fit``,
``--engine-state off`` turn them off), so the per-replica speed and foreign-load panels have data.

``--samples FILE`` keeps (or, with ``--render-only``, reads) the scraped samples as JSON lines
(gzipped when FILE ends in ``.gz``); the picture in the docs is drawn from
``panels-samples.jsonl.gz``, the samples of the run it shows.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parse(text: str) -> dict[str, float]:
    """Prometheus text → {'name{labels}': value} (comments dropped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


def _wait(url: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not come up within {timeout:g} s")


def run(args: argparse.Namespace) -> list[dict]:
    """Start the three processes, scrape for ``args.seconds``, stop them; the samples."""
    exe = [sys.executable, "-m", "balanceroute.cli"]
    tmp = Path(tempfile.mkdtemp(prefix="br-dash-"))
    proxy_port = _free_port()
    procs: list[subprocess.Popen] = []
    samples: list[dict] = []
    try:
        procs.append(subprocess.Popen(
            [*exe, "emulate", "-G", str(args.replicas), "-B", str(args.slots), "--prefill", "1",
             "--port", "0", "--write-proxy-config", str(tmp / "emu.json"), "--log-level", "warning",
             *(["--slow-replica", args.slow_replica] if args.slow_replica else [])],
            start_new_session=True))
        end = time.monotonic() + 120
        while not (tmp / "emu.json").exists() and time.monotonic() < end:
            time.sleep(0.5)
        config = json.loads((tmp / "emu.json").read_text())
        config.update(speed_fit=args.speed_fit, engine_state=args.engine_state)
        (tmp / "proxy.json").write_text(json.dumps(config))
        procs.append(subprocess.Popen(
            [*exe, "serve", "--config", str(tmp / "proxy.json"), "--policy", args.policy,
             "--port", str(proxy_port), "--log-level", "warning"], start_new_session=True))
        base = f"http://127.0.0.1:{proxy_port}"
        _wait(base + "/health", 180)
        procs.append(subprocess.Popen(
            [*exe, "loadgen", "--url", base, "--workload", args.workload, "--requests", "100000",
             "--clip-output", "600", "--clip-prompt", "8000", "--concurrency", str(args.concurrency),
             "--time-limit", str(args.seconds), "--json"],
            stdout=subprocess.DEVNULL, start_new_session=True))
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds + 5:
            try:
                with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
                    samples.append({"t": time.monotonic() - t0, "m": _parse(r.read().decode())})
            except OSError:
                pass
            time.sleep(1.0)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    return samples


def main(argv: list[str] | None = None) -> int:
    """Command line: run (or read) the samples and draw the panels."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=90)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=72)
    ap.add_argument("--policy", default="br0")
    ap.add_argument("--workload", default="servegen-r1")
    ap.add_argument("--slow-replica", default="3:1.5", help="G:FACTOR for the emulator ('' for none)")
    ap.add_argument("--speed-fit", action=argparse.BooleanOptionalAction, default=True,
                    help="the proxy fits each replica's step time (config speed_fit)")
    ap.add_argument("--engine-state", default="vllm", choices=("off", "vllm", "sglang"),
                    help="the proxy reads the emulated engines' own load (config engine_state)")
    ap.add_argument("--samples", default=None, help="JSON lines of the scraped samples")
    ap.add_argument("--render-only", action="store_true", help="read --samples instead of running")
    ap.add_argument("--out", default="docs/grafana/panels.png")
    args = ap.parse_args(argv)
    if args.render_only:
        raw = Path(args.samples).read_bytes()
        text = (gzip.decompress(raw) if args.samples.endswith(".gz") else raw).decode()
        samples = [json.loads(line) for line in text.splitlines() if line]
    else:
        samples = run(args)
        if args.samples:
            text = "".join(json.dumps(s) + "\n" for s in samples).encode()
            Path(args.samples).write_bytes(gzip.compress(text) if args.samples.endswith(".gz") else text)
    from render_panels import render  # noqa: PLC0415 (the sibling module)

    render(samples, args.out, title=f"balanceroute serve --policy {args.policy} in front of "
           f"balanceroute emulate -G {args.replicas} -B {args.slots} (loadgen {args.workload}, "
           f"{args.concurrency} clients)")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
