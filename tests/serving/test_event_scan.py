"""The relay's per-token rule (serving/event_scan.py): worked examples, and the compiled rule
(``_event_scan.c``) against the Python one on generated events, offsets included."""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.serving import event_scan
from balanceroute.serving.event_scan import scan_event

RULES = [pytest.param(scan_event, id="python")]
if event_scan.compiled is not None:
    RULES.append(pytest.param(event_scan.compiled, id="compiled"))


def event(k: int, finish: str | None = None, **usage: object) -> bytes:
    obj = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
           "choices": [{"index": 0, "text": f" t{k}", "logprobs": None, "finish_reason": finish,
                        "stop_reason": None}],
           "usage": {"prompt_tokens": 5, "total_tokens": 5 + k, "completion_tokens": k, **usage}}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode()


@pytest.mark.parametrize("rule", RULES)
def test_worked_examples(rule) -> None:
    data = event(57) + b"\n\n"
    at = data.index(b',"usage":{')
    assert rule(data, 0, len(data) - 2) == (57, at, False)
    data = b"x\r\n" + event(9, "length") + b"\n\n\r\n"  # one whole chunk: payload from 3
    assert rule(data, 3, len(data) - 4) == (9, data.index(b',"usage":{'), True)
    # what the general path must see instead
    assert rule(event(3).replace(b'"choices":[{', b'"choices":[],"c":[{'), 0, len(event(3)) + 9) is None
    for bad in (event(3).replace(b'"m"', b'"error"'), event(3).replace(b'"m"', b'"recomputed"'),
                event(3).replace(b'"m"', b'"a\\rb"').replace(b"\\r", b"\r"),
                event(3).replace(b'"m"', b'"a\nb"'), event(3).replace(b"data: ", b"data:"),
                event(3).replace(b'"completion_tokens"', b'"completion_token"'),
                event(3).replace(b',"usage":{', b',"usage":{"x":{},')):
        assert rule(bad, 0, len(bad)) is None, bad
    # the count as int() reads it: signs and underscores too, anything else declined
    assert rule(event(3).replace(b":3}", b":1_2}"), 0, len(event(3)) + 2)[0] == 12
    assert rule(event(3).replace(b":3}", b":x}"), 0, len(event(3)) + 2) is None
    big = event(3).replace(b":3}", b":123456789012345678901234}")
    assert rule(big, 0, len(big))[0] == 123456789012345678901234
    # offsets outside the bytes: declined, never read from the end
    data = event(4)
    assert rule(data, -1, len(data)) is None and rule(data, 0, len(data) + 1) is None
    assert rule(data, 5, 3) is None


_PIECES = [b'data: {', b'"choices":[{"index":0,"text":"a","finish_reason":', b'null', b'"stop"',
           b'}]', b',"usage":{', b'"prompt_tokens":5,', b'"completion_tokens":', b'7', b'12', b'0',
           b'-', b'_', b' ', b'+', b'}', b'}}', b'{', b'[]', b'[', b']', b',', b'"', b'"error"',
           b'recomputed', b'\r', b'\n', b'"finish_reason":n', b'x', b'9' * 20]


@st.composite
def events(draw: st.DrawFn) -> tuple[bytes, int, int]:
    """Mostly near-valid events (a valid one with pieces inserted or cut), some random bytes;
    offsets inside the bytes and a few outside."""
    if draw(st.booleans()):
        data = bytearray(event(draw(st.integers(0, 10**6)), draw(st.sampled_from([None, "stop"]))))
        text = data.index(b'"text":"') + 8  # raw bytes into the text: the rest stays valid
        data[text:text] = b"".join(draw(st.lists(st.sampled_from(_PIECES), max_size=2)))
        for _ in range(draw(st.integers(0, 3))):
            at = draw(st.integers(0, len(data)))
            if draw(st.booleans()):
                data[at:at] = draw(st.sampled_from(_PIECES))
            else:
                del data[at:at + draw(st.integers(1, 12))]
        data = bytes(data)
    else:
        data = b"".join(draw(st.lists(st.sampled_from(_PIECES), max_size=24)))
    prefix = draw(st.sampled_from([b"", b"1f\r\n", b"data: {}\n\n"]))
    suffix = draw(st.sampled_from([b"", b"\n\n", b"\n\n\r\n"]))
    whole = prefix + data + suffix
    start = draw(st.one_of(st.just(len(prefix)), st.integers(-2, len(whole) + 2)))
    stop = draw(st.one_of(st.just(len(prefix) + len(data)), st.integers(-2, len(whole) + 2)))
    return whole, start, stop


@pytest.mark.skipif(event_scan.compiled is None, reason="the compiled rule is not built here (no C compiler "
                    "at install): the relay runs the Python rule, checked above")
@settings(max_examples=3000, deadline=None)
@given(events())
def test_compiled_rule_agrees_with_python(case: tuple[bytes, int, int]) -> None:
    data, start, stop = case
    assert event_scan.compiled(data, start, stop) == scan_event(data, start, stop)


def test_the_rule_is_compiled_where_a_compiler_is() -> None:
    """The build is optional, so a C file that stops compiling would go unnoticed (the relay
    quietly runs the Python rule): where a compiler and Python's headers are, it must be built."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None or not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip(f"no C compiler ({cc}) or no Python headers here: the relay runs the Python rule")
    assert event_scan.compiled is not None, (
        "a C compiler is here but serving/_event_scan.c was not built: its optional build failed "
        "(`pip install -e . -v` shows why) and the relay runs the Python rule")
    assert event_scan.scan is event_scan.compiled and event_scan.scan_read is event_scan.compiled_chunk


CHUNK_RULES = [pytest.param(event_scan.scan_chunk, id="python")]
if event_scan.compiled_chunk is not None:
    CHUNK_RULES.append(pytest.param(event_scan.compiled_chunk, id="compiled"))


def chunk(payload: bytes, size_line: bytes | None = None) -> bytes:
    return (b"%x" % len(payload) if size_line is None else size_line) + b"\r\n" + payload + b"\r\n"


@pytest.mark.parametrize("rule", CHUNK_RULES)
def test_chunk_worked_examples(rule) -> None:
    """One read that is one whole chunk of one compact event: where its payload starts, then
    the event's answer; any other framing is the decoder's (``None``)."""
    payload = event(57) + b"\n\n"
    data = chunk(payload)
    start = data.index(b"\r\n") + 2
    assert rule(data) == (start, 57, data.index(b',"usage":{'), False)
    assert rule(chunk(event(9, "stop") + b"\n\n"))[1:4:2] == (9, True)
    for bad in (chunk(payload, b"%X" % len(payload)),  # upper-case hex: not the servers' form
                chunk(payload, b"0%x" % len(payload)),  # a leading zero
                chunk(payload, b"%x" % (len(payload) + 1)),  # a size that is not the payload's
                chunk(payload, b"%x;ext=1" % len(payload)),  # a chunk extension
                chunk(payload)[:-1],  # the chunk not whole yet
                chunk(payload) + chunk(payload),  # two chunks in one read
                chunk(event(57) + b"\n"), chunk(event(57)),  # no blank line after the event
                chunk(event(57) + b"\n\n" + event(58) + b"\n\n"),  # two events in one chunk
                chunk(b"data: [DONE]\n\n"), b"0\r\n\r\n", b"", b"\r\n"):
        assert rule(bad) is None, bad


@st.composite
def reads(draw: st.DrawFn) -> bytes:
    """Upstream reads: a valid token event or a generated one (:func:`events`), in the servers'
    chunk framing or a near miss of it (about a third of the reads are taken)."""
    if draw(st.booleans()):
        payload = event(draw(st.integers(0, 10**6)), draw(st.sampled_from([None, "stop"]))) + b"\n\n"
    else:
        data, start, stop = draw(events())
        payload = draw(st.sampled_from([data, data[max(start, 0):], data[max(start, 0):] + b"\n\n"]))
    size = len(payload) + draw(st.sampled_from([0] * 6 + [-1, 1, -len(payload)]))
    good = b"%x" % size
    line = draw(st.sampled_from([good] * 6 + [b"%X" % size, b"0" + good, good + b" ;a", b"",
                                              b"%x" % (size + 16**16)]))
    read = line + b"\r\n" + payload + b"\r\n"
    cut = draw(st.sampled_from([None] * 6 + [-1, 1, 3]))
    return read if cut is None else read[:cut] if cut < 0 else read[cut:]


@pytest.mark.skipif(event_scan.compiled_chunk is None, reason="the compiled rule is not built here (no C "
                    "compiler at install): the relay runs the Python rule, checked above")
@settings(max_examples=3000, deadline=None)
@given(reads())
def test_compiled_chunk_rule_agrees_with_python(data: bytes) -> None:
    assert event_scan.compiled_chunk(data) == event_scan.scan_chunk(data)
