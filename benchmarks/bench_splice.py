"""The spliced relay's CPU per chunk, in one process (no sockets, no server, no emulator).

One upstream read is one call of the upstream connection's ``data_received`` with one whole
vLLM-shaped chunk (compact JSON, continuous usage, one token); what is timed is everything the
proxy does with it until the client's bytes are handed to its transport (a stub that counts the
writes): the chunk framing check, the event scan, the ledger's progress, the client's chunk.
The floor in the same run is ``relay_floor.py``'s pipe on the same upstream connection class:
the chunk handed on as it came, nothing scanned — the part of the per-chunk Python cost that
any relay on this stack pays. Thread CPU time, garbage collection off while timing, rounds
alternating between the two.

    python benchmarks/bench_splice.py [--tokens 200] [--streams 20] [--rounds 8] [--json]

The socket read and write, the event loop and the per-request work are not in this figure:
``bench_proxy.py --section peer`` measures the whole relay next to vllm-router.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
import types
from typing import Any

if not __package__:  # run as a script: the repository root holds the ``benchmarks`` package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from balanceroute.serving.ledger import Ledger  # noqa: E402
from balanceroute.serving.relay import DecodeStream  # noqa: E402
from balanceroute.serving.stream_relay import StreamRelay  # noqa: E402
from balanceroute.serving.upstream_conn import UpstreamConnection, UpstreamResponse  # noqa: E402
from benchmarks.relay_floor import _Pipe  # noqa: E402


def vllm_chunk(k: int, prompt: int = 64) -> bytes:
    """Token ``k`` of a completion stream as vLLM frames it (one whole chunk)."""
    obj = {"id": "cmpl-3f2a9c1e5b7d4e0f8a6b2c1d9e8f7a6b", "object": "text_completion",
           "created": 1733270000, "model": "m",
           "choices": [{"index": 0, "text": f" tok{k}", "logprobs": None, "finish_reason": None,
                        "stop_reason": None}],
           "usage": {"prompt_tokens": prompt, "total_tokens": prompt + k, "completion_tokens": k}}
    payload = b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
    return b"%x\r\n%b\r\n" % (len(payload), payload)


class _Transport:
    """A client or upstream transport that counts writes."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _Downstream:
    """The client's side of a spliced response (the :class:`~balanceroute.serving.asgi.Downstream` calls used)."""

    gone = False

    def __init__(self) -> None:
        self.transport = _Transport()

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def chunk_writer(self) -> Any:
        return self.transport.write

    def listen(self, listener: Any) -> None:
        pass

    def end(self) -> None:
        pass


async def _one_round(kind: str, chunks: list[bytes], streams: int) -> float:
    """CPU seconds per chunk of ``streams`` streams of ``chunks`` through ``kind`` (``ours`` or
    ``floor``)."""
    loop = asyncio.get_running_loop()
    ledger = Ledger([streams], pool_capacity=streams)
    pool = types.SimpleNamespace(release=lambda key, conn: None)
    spent = 0.0
    for s in range(streams):
        ticket = ledger.admit(f"r{s}", endpoint="completions", now=0.0)
        ledger.enqueue(ticket, 64, 0.0, 60.0)
        ticket.state, ticket.replica, ticket.slot, ticket.prompt_checked = "active", 0, s, True
        conn = UpstreamConnection(loop)
        conn.transport = _Transport()  # type: ignore[assignment]
        response = UpstreamResponse(pool, ("http", "decode", 80), conn, 200, {"transfer-encoding": "chunked"},
                                    b"", 60.0)
        down = _Downstream()
        if kind == "floor":
            sink: Any = _Pipe(response, down)
        else:
            creq = types.SimpleNamespace(include_usage=False, continuous_usage=False)
            sink = StreamRelay(ticket, DecodeStream(response), creq, observe=lambda t, e: None,
                               progress=ledger.progress,  # what Proxy relays through without a speed fit
                               end=lambda t, o: None, broken=lambda t, e: None)
            sink._down, sink._done = down, loop.create_future()
        response.attach(sink)
        received = conn.data_received
        gc.disable()
        t0 = time.thread_time()
        for data in chunks:
            received(data)
        spent += time.thread_time() - t0
        gc.enable()
        if down.transport.writes != len(chunks):
            raise RuntimeError(f"{kind}: {down.transport.writes} writes for {len(chunks)} chunks")
        conn.close()
    if kind == "ours" and int(ledger.loads[0]) != streams * len(chunks):  # (placed by hand: no s_i)
        raise RuntimeError("the ledger did not see every token")
    return spent / (streams * len(chunks))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=200, help="tokens (chunks) per stream")
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=8, help="alternating rounds of ours and the floor")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    chunks = [vllm_chunk(k) for k in range(1, args.tokens + 1)]
    runs: dict[str, list[float]] = {"ours": [], "floor": []}
    for k in range(args.rounds):
        for kind in (("ours", "floor") if k % 2 == 0 else ("floor", "ours")):
            runs[kind].append(1e6 * asyncio.run(_one_round(kind, chunks, args.streams)))
    out = {kind: {"median_us": sorted(v)[len(v) // 2], "min_us": min(v), "rounds_us": v} for kind, v in runs.items()}
    out["load_average"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for kind in ("ours", "floor"):
        print(f"{kind:>6}: {out[kind]['median_us']:.2f} µs CPU per chunk (median of {args.rounds} rounds; "
              f"min {out[kind]['min_us']:.2f})")
    print(f"ours − floor: {out['ours']['median_us'] - out['floor']['median_us']:.2f} µs per chunk; "
          f"load average (1 min) {out['load_average']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
