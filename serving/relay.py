"""Relaying decode's SSE stream: cheap byte scanning on the hot path, full JSON only where needed.

Per event the ledger needs ``usage.completion_tokens`` (a_i), whether a choice finished, and
whether the event is an error; the client needs the event as it asked for it (usage stripped or
nulled when it did not ask for per-chunk usage). All of that is read from the bytes:

* In JSON text an unescaped ``"`` always delimits a string, so ``,"usage":`` (or
  ``{"usage":``) can only be an object key, never string content; likewise ``"finish_reason"``
  and ``"choices":[]``. vLLM's usage object holds numbers, ``null`` and flat objects only, so its
  extent is found by counting braces.
* Events that may be errors (the bytes ``"error"`` or ``recomputed`` occur anywhere) are parsed
  in full and judged exactly; so are events before the first token, and every event of a
  non-streamed response (it is assembled from them).

Unchanged events are forwarded as the bytes that came in, all complete events of an upstream
read in one write.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from fastapi.responses import Response

from .asgi import SPLICE, Downstream

__all__ = ["DecodeStream", "Event", "RelayResponse", "StreamBroken", "Write", "event_error", "has_token"]

_USAGE_KEY = re.compile(rb'[{,]\s*"usage"\s*:\s*')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_FINISH = re.compile(rb'[{,]\s*"finish_reason"\s*:\s*(n?)')
_NO_CHOICES = re.compile(rb'[{,]\s*"choices"\s*:\s*\[\s*\]')
_DONE = b"[DONE]"


class StreamBroken(Exception):
    """Decode's stream broke or broke protocol; ``kind`` is the metrics label; ``timed_out``
    when the read timeout ended it (see :class:`UpstreamError`)."""

    def __init__(self, kind: str, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.timed_out = timed_out


def event_error(obj: dict) -> str | None:
    """The message of an in-stream error event, if ``obj`` is one."""
    err = obj.get("error")
    if isinstance(err, dict):
        return str(err.get("message", err))
    if err is not None:
        return str(err)
    if obj.get("object") == "error":
        return str(obj.get("message", "error"))
    for choice in obj.get("choices") or ():
        if isinstance(choice, dict) and choice.get("stop_reason") == "recomputed":
            return "decode replica preempted the request (stop_reason=recomputed)"
    return None


def has_token(obj: dict) -> bool:
    """Whether a parsed chunk carries generated output (or a finish)."""
    usage = obj.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int) and usage["completion_tokens"] >= 1:
        return True
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("finish_reason") is not None or choice.get("text"):
            return True
        delta = choice.get("delta") or {}
        if isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content")
                                        or delta.get("tool_calls")):
            return True
    return False


class Event:
    """One decode event as scanned from its bytes (``raw`` is the JSON, no ``data: ``)."""

    __slots__ = ("raw", "done", "completion_tokens", "finished", "usage_span", "obj")

    def __init__(self, raw: bytes, *, parse: bool) -> None:
        self.raw = raw
        self.done = raw == _DONE
        self.completion_tokens: int | None = None
        self.finished = False
        self.usage_span: tuple[int, int, int] | None = None  # (key start, value start, value end)
        self.obj: dict | None = None
        if self.done:
            return
        if parse or b'"error"' in raw or b"recomputed" in raw:
            self._parse()
        elif not (raw[:1] == b"{" and raw[-1:] == b"}"):
            raise StreamBroken("decode_protocol", f"decode sent a non-JSON event: {raw[:80]!r}")
        at = raw.rfind(b',"usage":')  # vLLM's compact form, usage last
        if at >= 0:
            key, start = at, at + 9
        else:  # other spacing or order; a string value "usage" never matches the key pattern
            m = _USAGE_KEY.search(raw) if b'"usage"' in raw else None
            key, start = (m.start(), m.end()) if m is not None else (-1, -1)
        if key >= 0:
            end = _object_end(raw, start)
            self.usage_span = (key, start, end)
            if end - start > 4:
                at = raw.find(b'"completion_tokens":', start, end)
                if at >= 0:  # int() takes the digits as bytes and ignores surrounding spaces
                    stop = raw.find(b",", at + 20, end)
                    try:
                        self.completion_tokens = int(raw[at + 20:stop if stop >= 0 else end - 1])
                    except ValueError:
                        pass
                else:
                    m = _COMPLETION.search(raw, start, end)
                    if m is not None:
                        self.completion_tokens = int(m.group(1))
        at = raw.find(b'"finish_reason":')
        if at > 0 and raw[at - 1] in b",{":
            self.finished = raw[at + 16:at + 17] not in (b"n", b" ")
            if raw[at + 16:at + 17] == b" ":
                m = _FINISH.search(raw)
                self.finished = m is not None and not m.group(1)
        else:
            m = _FINISH.search(raw)
            self.finished = m is not None and not m.group(1)

    @property
    def prompt_tokens(self) -> int | None:
        """``usage.prompt_tokens``, if the event has usage."""
        if self.usage_span is None:
            return None
        _, start, end = self.usage_span
        m = _PROMPT.search(self.raw, start, end)
        return int(m.group(1)) if m is not None else None

    def _parse(self) -> None:
        try:
            obj = json.loads(self.raw)
        except (ValueError, UnicodeDecodeError):
            raise StreamBroken("decode_protocol", f"decode sent a non-JSON event: {self.raw[:80]!r}") from None
        if not isinstance(obj, dict):
            raise StreamBroken("decode_protocol", "decode sent a non-object event")
        self.obj = obj

    def parsed(self) -> dict:
        """The event as a dict (parsed on first use)."""
        if self.obj is None:
            self._parse()
        return self.obj  # type: ignore[return-value]

    def error(self) -> str | None:
        """The in-stream error message, if this event is one (exact: parsed when suspect)."""
        return None if self.obj is None else event_error(self.obj)

    def for_client(self, include_usage: bool, continuous: bool) -> bytes | None:
        """The JSON the client gets: as it came, with usage nulled (``include_usage`` only) or
        removed (no usage asked), or ``None`` for the final usage-only chunk it did not ask for."""
        span = self.usage_span
        if span is None or continuous:
            return self.raw
        raw = self.raw
        if b'"choices":[]' in raw or (b"[]" in raw and _NO_CHOICES.search(raw) is not None):
            return raw if include_usage else None
        key, start, end = span
        if raw[start:end] == b"null":
            return raw if include_usage else _cut_key(raw, key, end)
        if include_usage:
            return raw[:start] + b"null" + raw[end:]
        return _cut_key(raw, key, end)


def _object_end(raw: bytes, start: int) -> int:
    """End of the value at ``start``: ``null``/a number, or a string-free object."""
    if raw[start:start + 1] != b"{":
        stop = start
        while stop < len(raw) and raw[stop:stop + 1] not in (b",", b"}", b" "):
            stop += 1
        return stop
    depth, i = 1, start + 1
    while depth:
        close = raw.find(b"}", i)
        if close < 0:
            return len(raw)
        opened = raw.find(b"{", i, close)
        if opened < 0:
            depth -= 1
            i = close + 1
        else:
            depth += 1
            i = opened + 1
    return i


def _cut_key(raw: bytes, key: int, end: int) -> bytes:
    """``raw`` without the member starting at ``key`` (its ``,`` or ``{``) and ending at ``end``."""
    if raw[key:key + 1] == b",":
        return raw[:key] + raw[end:]
    rest = raw[end:].lstrip()
    return raw[:key + 1] + (rest[1:] if rest[:1] == b"," else rest)


class DecodeStream:
    """An open decode response read as :class:`Event` batches (one batch per upstream read);
    ``response`` follows the :mod:`.upstream` contract."""

    def __init__(self, response: Any) -> None:
        self.response = response
        self._buf = b""
        self.buffered: list[Event] = []
        self.finished = False
        self.ended = False

    async def next_batch(self, *, parse: bool = False) -> list[Event]:
        """The complete events of the next upstream read (``[]`` once the stream has ended)."""
        while not self.ended:
            chunk = await self.response.read()
            events = self.feed(chunk, parse=parse) if chunk else self.feed_end(parse=parse)
            if events:
                return events
        return []

    def feed(self, chunk: bytes, *, parse: bool = False) -> list[Event]:
        """The events that ``chunk`` completes (the rest waits for the next one)."""
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:  # CRLF line ends (possibly split across reads)
            buf = buf.replace(b"\r\n", b"\n")
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self._buf = buf
            return []
        self._buf = buf[cut + 2:]
        return self._frame(buf[:cut].split(b"\n\n"), parse)

    def feed_end(self, *, parse: bool = False) -> list[Event]:
        """The body ended: the event left unterminated, if any."""
        self.ended = True
        tail = self._buf.strip()
        self._buf = b""
        return self._frame([tail + b"\n\n"], parse) if tail else []

    def _frame(self, blocks: list[bytes], parse: bool) -> list[Event]:
        out = []
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:
                data = block[6:]
            else:  # comments, other fields, multi-line data
                lines = [line[5:].lstrip(b" ") for line in block.strip().split(b"\n") if line.startswith(b"data:")]
                if not lines:
                    continue
                data = b"\n".join(lines)
            event = Event(data.strip(), parse=parse)
            self.finished = self.finished or event.finished
            out.append(event)
        return out

    async def aclose(self) -> None:
        """Close the upstream response (before its end: vLLM aborts the request)."""
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(Exception):
                await self.response.aclose()


Write = Callable[[bytes], Awaitable[None]]


class RelayResponse(Response):
    """A raw ASGI event stream: ``body(write)`` writes it, one ASGI send per ``write`` (no
    body iterator or task group per chunk). A watcher cancels ``body`` when the client
    disconnects; ``on_close`` (close upstream, end the ticket) always runs, even if the body
    never started. Under the native server (the ``balanceroute.splice`` scope extension)
    ``splice(downstream)`` runs instead, once the head is sent: it relays without a coroutine
    per chunk and returns when the stream has ended."""

    def __init__(self, body: Callable[[Write], Awaitable[None]], *, on_close: Callable[[], Awaitable[None]],
                 headers: dict[str, str], splice: Callable[[Downstream], Awaitable[None]] | None = None) -> None:
        self.status_code = 200
        self.background = None
        self.media_type = "text/event-stream"
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
                            *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())]
        self._body = body
        self._splice = splice
        self._on_close = on_close
        self._closed = False

    async def discard(self) -> None:
        """Release everything without sending (once)."""
        if not self._closed:
            self._closed = True
            with anyio.CancelScope(shield=True):
                await self._on_close()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        spliced = scope.get("extensions", {}).get(SPLICE) if self._splice is not None else None
        if spliced is not None:  # the native server: the relay writes to its transport itself
            try:
                await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
                await self._splice(spliced["downstream"])  # type: ignore[misc]
            except BaseException:
                await self.discard()
                raise
            self._closed = True  # the relay has ended the ticket and closed upstream itself
            return

        async def write(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        async def run() -> None:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await self._body(write)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.append(True)
            relay.cancel()

        # The body runs in a task of its own: each upstream read wakes a short chain of
        # coroutines, not the whole middleware stack this call is nested in.
        gone: list[bool] = []
        relay = asyncio.ensure_future(run())
        watcher = asyncio.ensure_future(watch())
        try:
            await relay
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not gone or (task is not None and task.cancelling()):
                raise  # cancelled from outside, not by the client leaving
        except OSError:  # ASGI 2.4 servers raise on a send after the client went away
            pass
        finally:
            watcher.cancel()
            if not relay.done():
                relay.cancel()
                with contextlib.suppress(BaseException):
                    await relay
            await self.discard()
