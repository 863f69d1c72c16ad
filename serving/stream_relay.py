"""Relaying one streamed completion to its client, by either of two drivers over the same
per-batch rule (:meth:`StreamRelay.convert`):

* :meth:`StreamRelay.run` — a coroutine reading the decode stream and awaiting each write (any
  ASGI server, any upstream client);
* :meth:`StreamRelay.splice` — the zero-wake relay (native server, lean upstream client): the
  upstream connection's ``data_received`` de-frames the chunk, the events are scanned, the ledger
  updated and the client's bytes written to its transport, all in that one callback. The
  client's write buffer past its high-water mark pauses the upstream socket, its draining
  resumes it; the client's disconnect closes the upstream connection (vLLM aborts); an upstream
  failure or read timeout ends the stream with an error event, as in :meth:`run`.

Every way a relay ends calls ``end(ticket, outcome)`` (idempotent: a ticket ends exactly once).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .asgi import Downstream
from .event_scan import scan, scan_read
from .ledger import Ticket
from .protocol import SSE_DONE, ClientRequest, error_body, public_reason, sse
from .relay import DecodeStream, Event, StreamBroken, Write
from .upstream import UpstreamError

__all__ = ["StreamRelay"]

log = logging.getLogger("balanceroute.serving.proxy")

# what an open stream gets when the proxy's drain grace is over (serving/drain.py)
SHUTDOWN_EVENT = sse(error_body("the proxy is shutting down; the stream was ended before it finished",
                                status=503, code="shutting_down")) + SSE_DONE


class StreamRelay:
    """One stream's relay. ``observe(ticket, event)`` records progress (``progress(ticket,
    completion_tokens)`` once the prompt length is settled); ``end(ticket, outcome)``
    ends the ticket; ``broken(ticket, exc)`` accounts a stream that broke (metrics, the
    replica's failure, the ticket's end)."""

    def __init__(self, ticket: Ticket, stream: DecodeStream, creq: ClientRequest, *,
                 observe: Callable[[Ticket, Event], None], progress: Callable[[Ticket, int], None],
                 end: Callable[[Ticket, str], None], broken: Callable[[Ticket, StreamBroken], None]) -> None:
        self.ticket = ticket
        self.stream = stream
        self.include_usage = creq.include_usage
        self.continuous = creq.continuous_usage
        self._observe = observe
        self._progress = progress
        self._end = end
        self._broken = broken
        self._down: Downstream | None = None
        self._raw_write: Callable[[bytes], None] | None = None  # the client's transport, once its head is out
        self._done: asyncio.Future[None] | None = None
        self._stopping = False  # :meth:`shutdown` was called
        self._task: asyncio.Task | None = None  # the coroutine driver's task

    # ------------------------------------------------------------ the rule per batch
    def convert(self, batch: list[Event]) -> tuple[bytes, bool]:
        """The client's bytes for ``batch`` and whether the stream is over (``[DONE]``);
        :class:`StreamBroken` on an in-stream error event."""
        out = []
        ticket, usage, continuous, observe = self.ticket, self.include_usage, self.continuous, self._observe
        for event in batch:
            if event.done:
                out.append(SSE_DONE)
                return b"".join(out), True
            if event.obj is not None:  # parsed: a suspect event
                message = event.error()
                if message is not None:
                    raise StreamBroken("decode_error_event", message)
            observe(ticket, event)
            data = event.for_client(usage, continuous)
            if data is not None:
                out.append(b"data: " + data + b"\n\n")
        return (out[0] if len(out) == 1 else b"".join(out)), False

    def _at_end(self) -> bytes:
        """The upstream body ended without ``[DONE]``: fine once the request finished."""
        if not self.stream.finished:
            raise StreamBroken("decode_stream", "decode stream ended before the request finished")
        return SSE_DONE

    def _error_event(self, exc: StreamBroken) -> bytes:
        self._broken(self.ticket, exc)
        message = public_reason("upstream decode failed mid-stream", str(exc))  # no upstream text
        return sse(error_body(message, status=502, code=exc.kind)) + SSE_DONE

    # ---------------------------------------------------------- the coroutine driver
    async def run(self, write: Write) -> None:
        """Relay with a coroutine: read, convert, ``await write(...)``."""
        outcome = "client_disconnect"
        stream = self.stream
        self._task = asyncio.current_task()
        try:
            try:
                if self._stopping:
                    raise asyncio.CancelledError
                batch, stream.buffered = stream.buffered, []
                while True:
                    data, done = self.convert(batch)
                    if done:
                        outcome = "ok"
                        await write(data)
                        break
                    if data:
                        await write(data)
                    try:
                        batch = await stream.next_batch()
                    except UpstreamError as exc:
                        raise StreamBroken("decode_stream", f"decode stream broke: {exc}",
                                           timed_out=exc.timed_out) from None
                    if not batch:
                        tail = self._at_end()
                        outcome = "ok"
                        await write(tail)
                        break
            except StreamBroken as exc:
                outcome = exc.kind
                await write(self._error_event(exc))
            except asyncio.CancelledError:
                if not self._stopping:
                    raise
                if self._task is not None and self._task.cancelling():
                    self._task.uncancel()
                outcome = "shutdown"
                await write(SHUTDOWN_EVENT)
        finally:
            self._task = None
            self._end(self.ticket, outcome)
            await stream.aclose()

    def shutdown(self) -> None:
        """The proxy's drain grace is over: end the stream now with an error event and
        ``[DONE]`` (the replica is not charged; the upstream request is aborted)."""
        if self._stopping:
            return
        self._stopping = True
        if self._done is not None:  # spliced
            if not self._done.done() and self._down is not None:
                self._down.write(SHUTDOWN_EVENT)
                self._finish("shutdown")
        elif self._task is not None:  # the coroutine driver: interrupt its read or write
            self._task.cancel()
        # not started yet: run() or splice() ends it at once

    # ------------------------------------------------------------ the zero-wake driver
    def splice(self, down: Downstream) -> asyncio.Future[None]:
        """Relay from the upstream connection's callbacks into ``down``; the future resolves
        when the stream has ended (however it ends)."""
        self._down = down
        self._done = asyncio.get_running_loop().create_future()
        if down.gone:
            self._finish("client_disconnect")
            return self._done
        if self._stopping:
            down.write(SHUTDOWN_EVENT)
            self._finish("shutdown")
            return self._done
        down.listen(self)
        batch, self.stream.buffered = self.stream.buffered, []
        self._relay(batch)
        if not self._done.done():
            self.stream.response.attach(self)
        return self._done

    def _relay(self, batch: list[Event]) -> None:
        try:
            data, done = self.convert(batch)
        except StreamBroken as exc:
            self._fail(exc)
            return
        if data:
            self._down.write(data)  # type: ignore[union-attr]
        if done:
            self._finish("ok")

    def on_frame(self, data: bytes) -> bool:
        """One upstream read ``data`` that is exactly one whole chunk holding one event in vLLM's
        compact form (:func:`~.event_scan.scan_chunk`): recorded and written to the client as one
        chunk, the chunk as it came when the client keeps the usage; ``False``, untouched, for
        anything else (the read is then decoded and :meth:`on_body` gets the payload)."""
        write = self._raw_write
        if write is None:
            write = self._raw_write = self._down.chunk_writer()  # type: ignore[union-attr]
            if write is None:
                return False
        if self.stream._buf or not self.ticket.prompt_checked:
            return False
        try:
            hit = scan_read(data)
            if hit is None:
                return False
            start, done, at, finished = hit
            self._record(done, finished)
            if self.continuous:
                write(data)
            elif self.include_usage:
                write(b"%x\r\n%bnull}\n\n\r\n" % (at + 16 - start, data[start:at + 9]))
            else:
                write(b"%x\r\n%b}\n\n\r\n" % (at + 3 - start, data[start:at]))
        except Exception:
            self._internal_error()
        return True

    def on_body(self, data: bytes) -> None:
        """Upstream body bytes (:class:`~.upstream.BodySink`): whole events (the usual read)
        event by event, each by :meth:`_fast_event` where it applies, else by :meth:`convert`;
        anything else (an event split across reads, CRLF line ends) through the stream's
        general framing."""
        stream = self.stream
        try:
            if not data.endswith(b"\n\n") or b"\r" in data or self._general_only(data):
                batch = stream.feed(data)
                if batch:
                    self._relay(batch)
                return
            out = []
            start, end = 0, len(data)
            while start < end:
                stop = data.find(b"\n\n", start)
                if stop == start:
                    start += 2
                    continue
                at = self._fast_event(data, start, stop)
                if at < 0:
                    piece, done = self.convert(stream._frame([data[start:stop]], False))
                    if done:
                        out.append(piece)
                        self._down.write(b"".join(out))  # type: ignore[union-attr]
                        self._finish("ok")
                        return
                elif self.continuous:
                    piece = data[start:stop + 2]
                elif self.include_usage:
                    piece = data[start:at + 9] + b"null}\n\n"
                else:
                    piece = data[start:at] + b"}\n\n"
                if piece:  # b"": a usage-only event the client did not ask for
                    out.append(piece)
                start = stop + 2
            if out:
                self._down.write(out[0] if len(out) == 1 else b"".join(out))  # type: ignore[union-attr]
        except StreamBroken as exc:
            self._fail(exc)
        except Exception:
            self._internal_error()

    def _general_only(self, data: bytes) -> bool:
        """Whether the read ``data`` must take the general path whatever its framing: part of an
        event is still buffered, the prompt length is not settled yet (``prompt_checked``), or
        the read holds ``[]`` (a usage-only chunk), ``"error"`` or ``recomputed`` (an event
        that may be an error) — what :meth:`_fast_event` leaves to its callers. (CR line ends
        are the caller's check: a whole chunk's framing holds CRs.)"""
        return (self.stream._buf != b"" or not self.ticket.prompt_checked
                or b"[]" in data or b'"error"' in data or b"recomputed" in data)

    def _internal_error(self) -> None:
        """A bug in the relay: the client gets an error event, the accounting stays right."""
        log.exception("relay of %s failed", self.ticket.request_id)
        self._end(self.ticket, "internal")
        self._down.write(sse(error_body("internal proxy error in the relay", status=500)))  # type: ignore[union-attr]
        self._finish("internal")

    def _fast_event(self, data: bytes, start: int, stop: int) -> int:
        """The fast path for the event ``data[start:stop]`` (no trailing blank line) in vLLM's
        compact form (:mod:`.event_scan`'s rule): records its progress and returns where
        ``,"usage":`` starts (the client's bytes are cut there, as :meth:`convert` would); -1,
        untouched, for anything else. The caller has ruled out what needs the general path
        anywhere in the read (:meth:`_general_only`, and CR line ends)."""
        hit = scan(data, start, stop)
        if hit is None:
            return -1
        self._record(hit[0], hit[2])
        return hit[1]

    def _record(self, done: int, finished: bool) -> None:
        """A fast-path event's a_i = ``done`` and whether it finished."""
        ticket = self.ticket
        if done > ticket.age:
            self._progress(ticket, done)
        if finished:
            self.stream.finished = True

    def on_end(self) -> None:
        """The upstream body ended."""
        try:
            data, done = self.convert(self.stream.feed_end())
            if not done:
                data += self._at_end()
        except StreamBroken as exc:
            self._fail(exc)
            return
        self._down.write(data)  # type: ignore[union-attr]
        self._finish("ok")

    def on_error(self, exc: UpstreamError) -> None:
        """The upstream body broke (connection lost, bad framing, read timeout)."""
        self._fail(StreamBroken("decode_stream", f"decode stream broke: {exc}", timed_out=exc.timed_out))

    def on_gone(self) -> None:
        """The client left: abort upstream."""
        self._finish("client_disconnect")

    def pause_writing(self) -> None:
        """The client reads slower than decode writes: stop reading upstream."""
        self.stream.response.pause()

    def resume_writing(self) -> None:
        """The client caught up."""
        self.stream.response.resume()

    def _fail(self, exc: StreamBroken) -> None:
        if self._done is None or self._done.done():
            return
        self._down.write(self._error_event(exc))  # type: ignore[union-attr]
        self._finish(exc.kind)

    def _finish(self, outcome: str) -> None:
        done, down = self._done, self._down
        if done is None or done.done() or down is None:
            return
        self._end(self.ticket, outcome)
        down.listen(None)
        self.stream.response.close(drain=outcome == "ok")
        if outcome != "client_disconnect":
            down.end()
        done.set_result(None)
