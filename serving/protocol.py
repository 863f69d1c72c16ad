"""What the proxy and the emulator say on the wire: OpenAI errors, request checks at the HTTP
edge, the prefill/decode request bodies of vLLM's PD proxies, SSE framing and token estimates.

Pydantic is used here only, to check client bodies; everything inside works on plain dicts.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

__all__ = [
    "ApiError",
    "normalize_upstream_error",
    "ClientRequest",
    "NIXL_PREFILL_PARAMS",
    "SSE_DONE",
    "approx_prompt_tokens",
    "decode_body",
    "error_body",
    "iter_sse",
    "prefill_body",
    "sse",
    "validate_request",
    "words_prompt_tokens",
]

#: What prefill gets in the NIXL dialect (vLLM's NixlConnector and vllm-ascend's PD proxies).
NIXL_PREFILL_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}

SSE_DONE = b"data: [DONE]\n\n"

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "upstream_timeout",
}


def error_body(message: str, *, status: int, type: str | None = None, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}`` as the OpenAI API returns it."""
    return {"error": {"message": message, "type": type or _ERROR_TYPES.get(status, "error"),
                      "param": param, "code": code}}


class ApiError(Exception):
    """An error answered to the client as an OpenAI error object with HTTP ``status``.

    ``kind`` is the metrics label (``errors_total{kind}``) and the request outcome.
    """

    def __init__(self, status: int, message: str, *, kind: str, type: str | None = None,
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.body = error_body(message, status=status, type=type, param=param, code=code)
        self.headers = headers or {}

    @classmethod
    def from_upstream(cls, status: int, content: bytes, *, kind: str) -> ApiError:
        """Relay an upstream 4xx answer (e.g. a prompt longer than the context) as it came."""
        body = normalize_upstream_error(status, content)
        err = cls(status, body["error"]["message"], kind=kind)
        err.body = body
        return err


def normalize_upstream_error(status: int, content: bytes) -> dict[str, Any]:
    """An upstream error body in OpenAI form (vLLM sends ``{"error": {...}}``, or
    ``{"object": "error", "message": ...}`` in older versions)."""
    try:
        data = json.loads(content)
    except (ValueError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            return {"error": {"message": str(err["message"]), "type": err.get("type") or _ERROR_TYPES.get(status, "error"),
                              "param": err.get("param"), "code": err.get("code")}}
        if "message" in data:
            return error_body(str(data["message"]), status=status, type=data.get("type"),
                              param=data.get("param"))
    text = content.decode("utf-8", "replace").strip()[:500] or f"HTTP {status}"
    return error_body(text, status=status)


# ------------------------------------------------------------------------ the HTTP edge
class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool | None = None
    continuous_usage_stats: StrictBool | None = None


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: StrictStr | None = None
    stream: StrictBool | None = False
    stream_options: _StreamOptions | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    n: StrictInt | None = Field(default=1, ge=1)


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: StrictStr


class _Chat(_Common):
    messages: list[_Message] = Field(min_length=1)


class _Completion(_Common):
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """A checked client body: ``payload`` is the original dict; ``chat`` whether it is a chat
    completion; the streaming options the client asked for."""

    payload: dict[str, Any]
    chat: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool

    @property
    def path(self) -> str:
        """The upstream path."""
        return "/v1/chat/completions" if self.chat else "/v1/completions"


def validate_request(payload: Any, *, chat: bool) -> ClientRequest:
    """Check a client body; raises :class:`ApiError` (400) naming the offending field."""
    if not isinstance(payload, dict):
        raise ApiError(400, "the request body must be a JSON object", kind="bad_request")
    model = _Chat if chat else _Completion
    try:
        checked = model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if not str(p).startswith(("function-", "list[")))
        raise ApiError(400, f"{param or 'body'}: {first['msg']}", kind="bad_request",
                       param=param or None) from None
    if checked.n not in (None, 1):
        raise ApiError(400, "n > 1 is not supported by the BalanceRoute proxy", kind="bad_request",
                       param="n")
    if not chat:
        prompt = checked.prompt  # type: ignore[attr-defined]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ApiError(400, "batched prompts are not supported; send one prompt per request",
                               kind="bad_request", param="prompt")
        if isinstance(prompt, list) and not prompt:
            raise ApiError(400, "prompt must not be empty", kind="bad_request", param="prompt")
    opts = checked.stream_options
    stream = bool(checked.stream)
    return ClientRequest(
        payload=payload, chat=chat, stream=stream,
        include_usage=bool(stream and opts is not None and opts.include_usage),
        continuous_usage=bool(stream and opts is not None and opts.include_usage
                              and opts.continuous_usage_stats),
    )


# -------------------------------------------------------------------- upstream bodies
def prefill_body(payload: dict[str, Any], kv_params: dict[str, Any]) -> dict[str, Any]:
    """The prefill request: the client body with ``stream=false``, ``max_tokens=1`` (and
    ``max_completion_tokens=1`` if present), ``stream_options``/``min_tokens`` removed and
    ``kv_transfer_params`` set."""
    body = dict(payload)
    body["stream"] = False
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    for key in ("stream_options", "min_tokens", "min_completion_tokens"):
        body.pop(key, None)
    body["kv_transfer_params"] = kv_params
    return body


def decode_body(payload: dict[str, Any], kv_params: dict[str, Any] | None) -> dict[str, Any]:
    """The decode request: the client body streamed with per-chunk usage (the a_i signal) and
    prefill's ``kv_transfer_params``."""
    body = dict(payload)
    body["stream"] = True
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if kv_params is not None:
        body["kv_transfer_params"] = kv_params
    else:
        body.pop("kv_transfer_params", None)
    return body


# ------------------------------------------------------------------------------- SSE
def sse(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


async def iter_sse(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The ``data`` payload of each server-sent event in a byte stream (comments and other
    fields skipped; multi-line data joined with newlines)."""
    buf = b""
    async for chunk in chunks:
        if not chunk:
            continue
        buf += chunk
        if b"\r" in buf:  # CRLF line ends, possibly split across chunks
            buf = buf.replace(b"\r\n", b"\n")
        while True:
            end = buf.find(b"\n\n")
            if end < 0:
                break
            block, buf = buf[:end], buf[end + 2:]
            data = [line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
            if data:
                yield b"\n".join(data)
    tail = buf.strip()
    if tail.startswith(b"data:"):
        yield tail[5:].lstrip(b" ")


# ------------------------------------------------------------------- token estimates
def _texts(payload: dict[str, Any]) -> tuple[list[str], int, int]:
    """(text pieces, explicit token ids, number of chat messages)."""
    if "messages" in payload:
        texts: list[str] = []
        messages = payload.get("messages") or []
        for msg in messages:
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):
                texts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
        return texts, 0, len(messages)
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return [prompt], 0, 0
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):
            return [], len(prompt), 0
        if isinstance(first, list):
            return [], len(first), 0
        return [str(p) for p in prompt], 0, 0
    return [], 0, 0


def approx_prompt_tokens(payload: dict[str, Any]) -> int:
    """Tokenizer-free estimate of s_i used without a prefill stage: token-id prompts count
    exactly; text counts ⌈UTF-8 bytes / 4⌉ (≈ 4 bytes per token for BPE vocabularies on
    English); each chat message adds 4 template tokens. Decode's first ``usage.prompt_tokens``
    replaces the estimate."""
    texts, ids, messages = _texts(payload)
    return max(1, ids + sum(math.ceil(len(t.encode()) / 4) for t in texts) + 4 * messages)


def words_prompt_tokens(payload: dict[str, Any]) -> int:
    """The emulator's tokenizer: one token per whitespace-separated word; token-id prompts
    count exactly; each chat message adds 4 template tokens."""
    texts, ids, messages = _texts(payload)
    return max(1, ids + sum(len(t.split()) for t in texts) + 4 * messages)
