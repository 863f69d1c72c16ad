"""The relay's byte scanning agrees with a full JSON parse; SSE framing; logprobs assembly."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.serving.assemble import Assembler
from balanceroute.serving.relay import DecodeStream, Event, StreamBroken, event_error

pytestmark = pytest.mark.anyio

_text = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ['"usage":', ',"usage":{"completion_tokens":99}', "usage", '"finish_reason":null', "error", "\\"])


@st.composite
def chunks(draw) -> dict:
    """A vLLM-shaped chunk (chat or completion), usage absent, null or an object."""
    chat = draw(st.booleans())
    finish = draw(st.sampled_from([None, "length", "stop"]))
    if chat:
        choice = {"index": 0, "delta": {"content": draw(_text)}, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": draw(_text), "logprobs": None, "finish_reason": finish, "stop_reason": None}
    obj = {"id": draw(_text), "object": "chat.completion.chunk" if chat else "text_completion",
           "created": 1, "model": draw(_text), "choices": draw(st.sampled_from([[choice], []]))}
    usage = draw(st.sampled_from(["absent", "null", "object", "details"]))
    if usage != "absent":
        done = draw(st.integers(0, 10**6))
        obj["usage"] = None if usage == "null" else {
            "prompt_tokens": 7, "total_tokens": 7 + done, "completion_tokens": done,
            **({"prompt_tokens_details": {"cached_tokens": 3}} if usage == "details" else {})}
    keys = list(obj)
    order = draw(st.permutations(keys))
    return {k: obj[k] for k in order}


def _expected_client(obj: dict, include_usage: bool, continuous: bool) -> dict | None:
    if "usage" not in obj or continuous:
        return obj
    if not obj.get("choices"):
        return obj if include_usage else None
    out = dict(obj)
    if include_usage:
        out["usage"] = None
    else:
        del out["usage"]
    return out


@settings(max_examples=400, deadline=None)
@given(chunks(), st.booleans(), st.booleans(), st.booleans())
def test_byte_scan_matches_the_parsed_event(obj: dict, include_usage: bool, continuous: bool, spaced: bool) -> None:
    raw = json.dumps(obj, ensure_ascii=False, separators=(", ", ": ") if spaced else (",", ":")).encode()
    event = Event(raw, parse=False)
    usage = obj.get("usage")
    assert event.completion_tokens == (usage["completion_tokens"] if usage else None)
    assert event.prompt_tokens == (usage["prompt_tokens"] if usage else None)
    assert event.finished == any(c.get("finish_reason") is not None for c in obj["choices"])
    assert (event.usage_span is not None) == ("usage" in obj)
    out = event.for_client(include_usage, continuous and include_usage)
    expected = _expected_client(obj, include_usage, continuous and include_usage)
    assert (json.loads(out) if out is not None else None) == expected


def test_suspect_events_are_parsed_and_errors_found() -> None:
    assert Event(b'{"error": {"message": "boom"}}', parse=False).error() == "boom"
    assert Event(b'{"object": "error", "message": "m"}', parse=False).error() == "m"
    recomputed = b'{"choices": [{"text": "", "finish_reason": "abort", "stop_reason": "recomputed"}]}'
    assert "recomputed" in Event(recomputed, parse=False).error()
    # "error" as text is parsed, judged exactly, and is not an error
    assert Event(b'{"choices": [{"text": "error", "finish_reason": null}]}', parse=False).error() is None
    with pytest.raises(StreamBroken):
        Event(b"not json", parse=False)
    assert event_error({"choices": [{"text": "x"}]}) is None


async def test_framing_reassembles_split_events_and_crlf() -> None:
    raw = b'data: {"a": 1}\r\n\r\n: comment\n\ndata: {"b":\ndata: 2}\n\ndata: [DONE]\n\n'
    for size in (1, 5, len(raw)):
        parts = [raw[i:i + size] for i in range(0, len(raw), size)]
        stream = DecodeStream(_Parts(parts))
        got = []
        while batch := await stream.next_batch():
            got.extend(e.raw for e in batch)
        assert got == [b'{"a": 1}', b'{"b":\n2}', b"[DONE]"]


class _Parts:
    """A decode response (the :mod:`balanceroute.serving.upstream` contract) of given reads."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = list(parts)

    async def read(self) -> bytes:
        return self.parts.pop(0) if self.parts else b""

    async def aclose(self) -> None:
        self.parts.clear()


def test_assembler_keeps_logprobs() -> None:
    chat = Assembler(chat=True)
    for tok, lp in (("a", -0.1), ("b", -0.2)):
        chat.add({"id": "c", "choices": [{"delta": {"content": tok}, "finish_reason": None,
                                          "logprobs": {"content": [{"token": tok, "logprob": lp, "top_logprobs": []}]}}]})
    chat.add({"choices": [{"delta": {}, "finish_reason": "stop", "logprobs": None}]})
    choice = chat.result()["choices"][0]
    assert choice["message"]["content"] == "ab" and choice["finish_reason"] == "stop"
    assert [t["token"] for t in choice["logprobs"]["content"]] == ["a", "b"]
    text = Assembler(chat=False)
    for k, tok in enumerate(("x", "yy")):
        text.add({"choices": [{"text": tok, "finish_reason": None, "logprobs": {
            "tokens": [tok], "token_logprobs": [-1.0 * k], "top_logprobs": [{tok: -1.0 * k}], "text_offset": [k]}}]})
    assert text.result()["choices"][0]["logprobs"] == {
        "tokens": ["x", "yy"], "token_logprobs": [0.0, -1.0], "top_logprobs": [{"x": 0.0}, {"yy": -1.0}],
        "text_offset": [0, 1]}
    assert Assembler(chat=False).result()["choices"][0]["logprobs"] is None
