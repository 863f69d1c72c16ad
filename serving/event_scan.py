"""The relay's per-token rule: one SSE event in vLLM's compact form, read by offsets.

:func:`scan_event` is the rule; :func:`scan_chunk` applies it to one upstream read that is
exactly one whole HTTP chunk holding one event (the usual read: one token). :data:`scan` and
:data:`scan_read` are what the relay calls — the same functions compiled (``_event_scan.c``,
built by ``pip install`` when the machine has a C compiler) or, without it, the ones below. Both
give the same answer for every input (tests/serving/test_event_scan.py checks them against each
other); compiled, ``scan_event`` is about nine times faster (2.1 → 0.23 µs on a 280-byte event),
and the relay runs one of the two once per relayed token.

The rule takes the event ``data[start:stop]`` (no trailing blank line) only when it is a single
``data: {...}`` line, with no CR, no ``[]`` (a usage-only chunk), no ``"error"`` and no
``recomputed`` (what may be an error event), its flat usage object last
(``...,"usage":{...}}``), an optional ``"finish_reason":`` of ``null`` or a string, and
``"completion_tokens":`` in the usage. Anything else is the general path's (``None``).
"""

from __future__ import annotations

from collections.abc import Callable

from .http1 import whole_chunk

__all__ = ["compiled", "compiled_chunk", "scan", "scan_chunk", "scan_event", "scan_read"]

Hit = tuple[int, int, bool]
ChunkHit = tuple[int, int, int, bool]


def scan_event(data: bytes, start: int, stop: int) -> Hit | None:
    """``(completion_tokens, at, finished)`` of the event ``data[start:stop]`` — ``at`` where
    ``,"usage":{`` starts (the client's bytes are cut there when it did not ask for usage),
    ``finished`` whether a choice has a finish reason — or ``None`` when the event needs the
    general path (see the module)."""
    if start < 0 or stop > len(data) or stop - start < 9:  # (no negative offsets from the end)
        return None
    end = stop - 2  # the usage object's closing brace
    if (not data.startswith(b"data: {", start) or not data.startswith(b"}}", end)
            or data.find(b"\r", start, stop) >= 0 or data.find(b"\n", start, stop) >= 0
            or data.find(b'"error"', start, stop) >= 0 or data.find(b"recomputed", start, stop) >= 0):
        return None
    i = data.find(b"[", start, stop)  # ``[]`` by its first byte (a one-byte search is far cheaper)
    while i >= 0:
        if data[i + 1] == 93:  # "]"
            return None
        i = data.find(b"[", i + 1, stop)
    at = data.rfind(b',"usage":{', start, end)
    if at < 0 or data.find(b"{", at + 10, end) >= 0 or data.find(b"}", at + 10, end) >= 0:
        return None
    c = data.find(b'"completion_tokens":', at, end)
    f = data.find(b'"finish_reason":', start, at)
    if c < 0 or (f >= 0 and (data[f - 1] not in b",{" or data[f + 16] not in b'n"')):
        return None
    comma = data.find(b",", c + 20, end)
    try:
        done = int(data[c + 20:comma if comma >= 0 else end])
    except ValueError:
        return None
    return done, at, f >= 0 and data[f + 16] == 34  # '"': a finish reason


def scan_chunk(data: bytes) -> ChunkHit | None:
    """``(start, completion_tokens, at, finished)`` when ``data`` is exactly one whole chunk in
    the servers' form (:func:`~.http1.whole_chunk`; its payload starts at ``start``) whose payload
    is one event and its blank line, ``data[start:-4]``, that :func:`scan_event` takes; else
    ``None``."""
    start = whole_chunk(data)
    if start < 0 or not data.endswith(b"\n\n\r\n"):
        return None
    hit = scan_event(data, start, len(data) - 4)
    return None if hit is None else (start, *hit)


try:
    from ._event_scan import scan_chunk as compiled_chunk  # type: ignore[import-not-found]
    from ._event_scan import scan_event as compiled  # type: ignore[import-not-found]
except ImportError:  # built without a C compiler: the rules as written above
    compiled = compiled_chunk = None

scan: Callable[[bytes, int, int], Hit | None] = compiled if compiled is not None else scan_event
scan_read: Callable[[bytes], ChunkHit | None] = compiled_chunk if compiled_chunk is not None else scan_chunk
