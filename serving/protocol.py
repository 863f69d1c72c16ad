"""What the proxy and the emulator say on the wire: OpenAI errors, request checks at the HTTP
edge, the prefill/decode request bodies of vLLM's PD proxies, SSE framing and token estimates.

Pydantic is used here only, to check client bodies; everything inside works on plain dicts.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

__all__ = [
    "ApiError",
    "ClientRequest",
    "MAX_JSON_DEPTH",
    "NIXL_PREFILL_PARAMS",
    "SSE_DONE",
    "approx_prompt_tokens",
    "decode_body",
    "error_body",
    "is_retryable",
    "normalize_upstream_error",
    "parse_body",
    "prefill_body",
    "public_reason",
    "redact",
    "request_schema",
    "sse",
    "upstream_headers",
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
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "upstream_timeout",
}


_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def is_retryable(status: int) -> bool:
    """Upstream statuses worth another host (timeouts, overload, server errors); other 4xx are
    the request's own fault and are relayed."""
    return status in _RETRYABLE_STATUS


def upstream_headers(request_id: str, dp_rank: int | None, api_key: str | None) -> dict[str, str]:
    """Headers of an upstream call: ``X-Request-Id``, the DP rank, and a bearer token only when
    one is configured for that upstream."""
    headers = {"X-Request-Id": request_id}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    if dp_rank is not None:
        headers["X-data-parallel-rank"] = str(dp_rank)
    return headers


def error_body(message: str, *, status: int, type: str | None = None, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}`` as the OpenAI API returns it."""
    return {"error": {"message": message, "type": type or _ERROR_TYPES.get(status, "error"),
                      "param": param, "code": code}}


class ApiError(Exception):
    """An error answered to the client as an OpenAI error object with HTTP ``status``.

    ``kind`` is the metrics label (``errors_total{kind}``) and the request outcome.
    ``detail`` is for the log only (upstream addresses, upstream bodies): the proxy logs it
    with the request id; the client sees ``message``, which never carries either.
    """

    def __init__(self, status: int, message: str, *, kind: str, type: str | None = None,
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.body = error_body(message, status=status, type=type, param=param, code=code)
        self.headers = headers or {}
        self.detail = detail

    @classmethod
    def from_upstream(cls, status: int, content: bytes, *, kind: str) -> ApiError:
        """Relay an upstream 4xx answer (e.g. a prompt longer than the context): its message
        with addresses, host names and file paths redacted (:func:`redact`); the body as it
        came goes to ``detail`` (the log)."""
        body = normalize_upstream_error(status, content)
        message = redact(body["error"]["message"])
        err = cls(status, message, kind=kind, detail=f"HTTP {status}: {_excerpt(content)}")
        body["error"]["message"] = message
        err.body = body
        return err


_REDACT = re.compile(
    r"[a-zA-Z][a-zA-Z0-9+.-]*://\S+"                         # URLs
    r"|\[[0-9a-fA-F:.]+\](?::\d+)?"                          # [IPv6](:port)
    r"|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"                 # IPv4(:port)
    r"|\b[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+){2,}(?::\d+)?\b"      # host.domain.tld(:port)
    r"|\b[a-zA-Z0-9-]+:\d{2,5}\b"                             # host:port
    r"|(?<![\w.])/[\w.@+-]+(?:/[\w.@+-]+)+")                  # /absolute/file/paths
#: What a client may learn of why its stream broke: fixed words, never upstream text.
_REASONS = (("read timeout", "read timeout: no data from the replica"), ("timed out", "timed out"),
            ("stall", "stalled"), ("deadline", "deadline passed"),
            ("mid-response", "upstream closed the connection mid-response"),
            ("chunked", "bad chunked encoding"), ("connection lost", "connection lost"),
            ("ended before", "stream ended before the request finished"),
            ("non-json", "malformed event"), ("non-object", "malformed event"),
            ("preempted", "preempted by the decode replica"), ("connect", "connect failed"),
            ("timeout", "timed out"), ("not a json", "reply is not a JSON object"),
            ("in service", "none in service"))
_HTTP_STATUS = re.compile(r"\bHTTP ([1-5]\d\d)\b")


def redact(message: str) -> str:
    """``message`` without URLs, IP addresses, ``host:port``, dotted host names and absolute
    file paths (each replaced by ``<redacted>``), at most 300 characters: what an upstream's
    4xx message may show a client."""
    return _REDACT.sub("<redacted>", message)[:300]


def public_reason(lead: str, detail: str) -> str:
    """The client's message for a request that failed upstream: the fixed phrase ``lead``
    (e.g. ``"decode replica failed"``) and, when ``detail`` (the log's text) names a known
    cause, that cause in fixed words; no upstream address or text reaches a client."""
    status = _HTTP_STATUS.search(detail)  # first: what follows it is the upstream's body
    low = detail.lower()
    reason = (f"HTTP {status.group(1)}" if status is not None
              else next((words for key, words in _REASONS if key in low), None))
    return f"{lead} ({reason})" if reason else lead


def _excerpt(content: bytes) -> str:
    return content[:500].decode("utf-8", "replace")


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
#: deepest nesting of objects/arrays accepted in a client body
MAX_JSON_DEPTH = 64
_INT32 = 2**31 - 1
_INT64 = 2**63
_JUST_INT = frozenset((int,))


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, kind="bad_request", param=param)


def _reject_constant(name: str) -> Any:
    raise _bad(f"invalid JSON body: {name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _bad(f"invalid JSON body: the number {text[:40]} is out of range")
    return value


def _check_tree(value: Any) -> None:
    """Depth ≤ :data:`MAX_JSON_DEPTH`, integers in int64, strings (and keys) valid Unicode
    without lone surrogates."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is str:
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise _bad("invalid JSON body: a string holds a lone UTF-16 surrogate") from None
        elif kind is int:
            if not -_INT64 <= item < _INT64:
                raise _bad("invalid JSON body: an integer is outside the 64-bit range")
        elif kind is dict or kind is list:
            if depth > MAX_JSON_DEPTH:
                raise _bad(f"invalid JSON body: nested deeper than {MAX_JSON_DEPTH} levels")
            if kind is dict:
                stack.extend((k, depth) for k in item)
                stack.extend((v, depth + 1) for v in item.values())
            elif item and set(map(type, item)) == _JUST_INT:  # token ids: C-speed passes
                if not (-_INT64 <= min(item) and max(item) < _INT64):
                    raise _bad("invalid JSON body: an integer is outside the 64-bit range")
            else:
                stack.extend((v, depth + 1) for v in item)


def parse_body(body: bytes) -> Any:
    """Strict JSON: no NaN/Infinity, finite numbers, int64 integers, valid Unicode (no lone
    surrogates), nesting ≤ :data:`MAX_JSON_DEPTH`; raises :class:`ApiError` (400)."""
    try:
        value = json.loads(body, parse_constant=_reject_constant, parse_float=_finite_float)
    except ApiError:
        raise
    except RecursionError:
        raise _bad(f"invalid JSON body: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"invalid JSON body: {exc}") from None
    _check_tree(value)
    return value


_Count = Annotated[int, Field(strict=True, ge=0, le=_INT32)]
_Positive = Annotated[int, Field(strict=True, ge=1, le=_INT32)]
_Seed = Annotated[int, Field(strict=True, ge=-_INT64, lt=_INT64)]
_TokenId = Annotated[int, Field(strict=True, ge=0, le=_INT32)]


def _real(**bounds: float) -> Any:
    return Annotated[float, Field(strict=True, **bounds)]


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool | None = None
    continuous_usage_stats: StrictBool | None = None


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: StrictStr | None = None
    stream: StrictBool | None = False
    stream_options: _StreamOptions | None = None
    max_tokens: _Positive | None = None
    max_completion_tokens: _Positive | None = None
    min_tokens: _Count | None = None
    n: _Positive | None = 1
    temperature: _real(ge=0.0) | None = None
    top_p: _real(gt=0.0, le=1.0) | None = None
    top_k: Annotated[int, Field(strict=True, ge=-1, le=_INT32)] | None = None
    min_p: _real(ge=0.0, le=1.0) | None = None
    presence_penalty: _real(ge=-2.0, le=2.0) | None = None
    frequency_penalty: _real(ge=-2.0, le=2.0) | None = None
    repetition_penalty: _real(gt=0.0) | None = None
    seed: _Seed | None = None
    ignore_eos: StrictBool | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: StrictStr
    content: StrictStr | list[dict[str, Any]] | None = None


class _Chat(_Common):
    messages: list[_Message] = Field(min_length=1)
    logprobs: StrictBool | None = None
    top_logprobs: _Count | None = None


class _Completion(_Common):
    prompt: StrictStr | list[_TokenId] | list[StrictStr] | list[list[_TokenId]]
    logprobs: _Count | None = None
    echo: StrictBool | None = None


def request_schema(chat: bool) -> dict[str, Any]:
    """JSON Schema of the body the edge accepts (inlined, for ``/openapi.json``)."""
    schema = (_Chat if chat else _Completion).model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.rsplit("/", 1)[1]])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return inline(schema)


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


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


def validate_request(payload: Any, *, chat: bool, max_model_len: int | None = None) -> ClientRequest:
    """Check a parsed client body (see :func:`parse_body` for the JSON itself); raises
    :class:`ApiError` (400) naming the offending field. ``max_tokens`` must fit in
    ``max_model_len`` when it is known."""
    if not isinstance(payload, dict):
        raise _bad("the request body must be a JSON object")
    model = _Chat if chat else _Completion
    try:
        checked = model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if str(p) not in _UNION_TAGS
                         and not str(p).startswith(("function-", "list[", "dict[", "constrained-")))
        raise _bad(f"{param or 'body'}: {first['msg']}", param or None) from None
    if checked.n not in (None, 1):
        raise _bad("n > 1 is not supported: the proxy binds one request to one decode slot; "
                   "send n requests instead", "n")
    for name in ("max_tokens", "max_completion_tokens"):
        value = getattr(checked, name)
        if max_model_len is not None and value is not None and value > max_model_len:
            raise _bad(f"{name}={value} exceeds the model's context length {max_model_len}", name)
    if checked.min_tokens and checked.max_tokens and checked.min_tokens > checked.max_tokens:
        raise _bad(f"min_tokens={checked.min_tokens} exceeds max_tokens={checked.max_tokens}", "min_tokens")
    if not chat:
        prompt = checked.prompt  # type: ignore[attr-defined]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise _bad("batched prompts are not supported; send one prompt per request", "prompt")
            if isinstance(prompt[0], list) and not prompt[0]:
                raise _bad("prompt must not be empty", "prompt")
        if isinstance(prompt, list) and not prompt:
            raise _bad("prompt must not be empty", "prompt")
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


# ------------------------------------------------------------------- token estimates
def _texts(payload: dict[str, Any]) -> tuple[list[str], int, int]:
    """(text pieces, explicit token ids, number of chat messages)."""
    if isinstance(payload.get("messages"), list):
        texts: list[str] = []
        messages = payload["messages"]
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


def output_cap(payload: dict[str, Any], *, chat: bool, max_model_len: int | None) -> int | None:
    """The most output tokens a checked request may get, as vLLM bounds it: chat's
    ``max_completion_tokens``, else ``max_tokens``; absent, the OpenAI API's default — 16 for a
    completion — or, for a chat completion (no default), the model's context length when known
    (``None`` otherwise)."""
    for name in ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",):
        value = payload.get(name)
        if value is not None:
            return int(value)
    return max_model_len if chat else 16


def words_prompt_tokens(payload: dict[str, Any]) -> int:
    """The emulator's tokenizer: one token per whitespace-separated word; token-id prompts
    count exactly; each chat message adds 4 template tokens."""
    texts, ids, messages = _texts(payload)
    return max(1, ids + sum(len(t.split()) for t in texts) + 4 * messages)
