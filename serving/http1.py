"""HTTP/1.1 framing (RFC 9112), no I/O: for the decode client (``upstream.py``) the status line
and headers and chunked transfer decoding by byte scanning; for the native server
(``http_server.py``) the response head and chunked encoding."""

from __future__ import annotations

import errno
import re
from collections.abc import Iterable
from http import HTTPStatus

__all__ = ["LAST_CHUNK", "LOCAL_ERRNOS", "MAX_LINE", "ChunkedDecoder", "UpstreamError", "encode_chunk",
           "local_error", "parse_head", "response_head", "whole_chunk"]

# errors that are the proxy's, not an upstream's: out of descriptors, buffers or memory
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def local_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` — or an exception it was raised from, or one in an exception group — is
    an OSError with an :data:`LOCAL_ERRNOS` code (never an upstream's fault)."""
    todo, seen = [exc], 0
    while todo and seen < 32:
        e = todo.pop()
        seen += 1
        if e is None:
            continue
        if isinstance(e, OSError) and e.errno in LOCAL_ERRNOS:
            return True
        if isinstance(e, UpstreamError) and e.local:
            return True
        todo.extend([e.__cause__, e.__context__, *getattr(e, "exceptions", ())])
    return False

_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
MAX_LINE = 8192  # a chunk-size or trailer line; the whole header block gets 8 × this
_SIZE, _DATA, _CRLF, _TRAILER, _DONE = range(5)


class UpstreamError(Exception):
    """An upstream call failed; ``connect`` when no connection could be made (refused or
    timed out), the evidence that charges a replica at once; ``local`` when the proxy itself
    ran out of something (:data:`LOCAL_ERRNOS`), which charges nobody; ``timed_out`` when a
    timer ended it (connect or read timeout), which charges the replica only if the proxy's own
    loop kept time meanwhile (:meth:`~balanceroute.serving.health.LoopLag.excuses`)."""

    def __init__(self, message: str, *, connect: bool = False, local: bool = False,
                 timed_out: bool = False) -> None:
        super().__init__(message)
        self.connect = connect and not local
        self.local = local
        self.timed_out = timed_out


_SIZE_LINES = tuple(b"%x\r\n" % n for n in range(1 << 12))  # the usual chunks' size lines, made once


def whole_chunk(data: bytes) -> int:
    """Where the payload starts when ``data`` is exactly one whole, non-empty chunk (its size
    line in lower-case hex without leading zeros, as servers write it; the payload ends at
    ``len(data) - 2``), else -1 (the general decoder's case)."""
    eol = data.find(b"\r\n", 0, 18)
    size = len(data) - eol - 4
    if eol > 0 and size > 0 and data.endswith(b"\r\n") and data.startswith(
            _SIZE_LINES[size] if size < 4096 else b"%x\r\n" % size):
        return eol + 2
    return -1


class ChunkedDecoder:
    """Incremental decoder of HTTP/1.1 chunked transfer coding (RFC 9112 §7.1): ``feed(bytes)``
    returns the payload bytes completed so far; ``done`` once the last chunk and the trailer
    section are read; ``extra`` holds bytes that came after the end; ``between`` whether nothing
    is half-read (the next byte starts a chunk-size line: a read that is one whole chunk would be
    returned whole, the decoder unchanged)."""

    __slots__ = ("_buf", "_left", "_state", "between", "extra")

    def __init__(self) -> None:
        self._buf = b""
        self._left = 0
        self._state = _SIZE
        self.between = True
        self.extra = b""

    @property
    def done(self) -> bool:
        """Whether the terminating chunk and the trailers have been read."""
        return self._state == _DONE

    def feed(self, data: bytes) -> bytes:
        """Decode ``data``; raise ``ValueError`` on malformed framing."""
        if self._state == _DONE:
            self.extra += data
            return b""
        if self.between:  # fast path: exactly one whole chunk
            start = whole_chunk(data)
            if start > 0:
                return data[start:-2]
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        pos, end, state = 0, len(buf), self._state
        while state == _SIZE:  # whole chunks back to back (a reader that fell behind)
            eol = buf.find(b"\r\n", pos, pos + 18)
            if eol <= pos or _HEX.fullmatch(buf, pos, eol) is None:
                break
            stop = eol + 2 + int(buf[pos:eol], 16)
            if stop == eol + 2 or stop + 2 > end:
                break  # the last chunk, or one not complete yet: the general loop below
            if buf[stop:stop + 2] != b"\r\n":
                raise ValueError("chunk data not followed by CRLF")
            out.append(buf[eol + 2:stop])
            pos = stop + 2
        while pos < end:
            if state == _DATA:
                take = min(self._left, end - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    state = _CRLF
            elif state == _CRLF:
                if end - pos < 2:
                    if buf[pos:pos + 1] != b"\r":
                        raise ValueError("chunk data not followed by CRLF")
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ValueError("chunk data not followed by CRLF")
                pos += 2
                state = _SIZE
            else:  # a chunk-size line or a trailer line
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > MAX_LINE:
                        raise ValueError("chunk-size or trailer line too long")
                    break
                line, pos = buf[pos:eol], eol + 2
                if state == _TRAILER:
                    if not line:
                        state = _DONE
                        self.extra = buf[pos:]
                        pos = end
                    continue
                size = line.split(b";", 1)[0].strip(b" \t")
                if _HEX.fullmatch(size) is None:
                    raise ValueError(f"bad chunk size {line[:40]!r}")
                self._left = int(size, 16)
                state = _DATA if self._left else _TRAILER
        self._state = state
        self._buf = buf[pos:] if pos < end else b""
        self.between = state == _SIZE and not self._buf
        return out[0] if len(out) == 1 else b"".join(out)


def parse_head(block: bytes) -> tuple[int, dict[str, str]]:
    """Status code and lower-cased headers (repeats joined by ", ") of a response head."""
    lines = block.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise UpstreamError(f"bad status line from upstream: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise UpstreamError(f"bad header line from upstream: {line[:80]!r}")
        name, value = name.lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return int(code), headers


LAST_CHUNK = b"0\r\n\r\n"
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


def encode_chunk(data: bytes) -> bytes:
    """``data`` as one chunk of chunked transfer coding (``data`` must not be empty)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def response_head(status: int, headers: Iterable[tuple[bytes, bytes]], *, chunked: bool,
                  keep_alive: bool) -> bytes:
    """A response's status line and header block: ``headers`` as given (lower-cased names),
    plus ``transfer-encoding: chunked`` when ``chunked`` and ``connection: close`` unless
    ``keep_alive``."""
    lines = [b"HTTP/1.1 %d %b" % (status, _REASONS.get(status, b""))]
    lines.extend(b"%b: %b" % (name, value) for name, value in headers)
    if chunked:
        lines.append(b"transfer-encoding: chunked")
    if not keep_alive:
        lines.append(b"connection: close")
    lines.append(b"\r\n")
    return b"\r\n".join(lines)
