"""The proxy's logs: set-up (text or one JSON object per line), the access line, request ids.

* :func:`configure_logging` — the root handler on stderr, ``text`` (``time level logger:
  message``) or ``json`` (one object per line: ``ts``, ``level``, ``logger``, ``message`` and
  an access line's fields at the top level). The upstream HTTP client's loggers (httpx,
  httpcore) stay at WARNING whatever the level, unless ``upstream_debug`` (``--log-upstream``
  or ``BALANCEROUTE_LOG_UPSTREAM=1``) lets them log at the proxy's level.
* :func:`log_access` — one INFO line per request on the ``balanceroute.access`` logger: the
  request id (the client's ``X-Request-Id`` when it sent one, else the proxy's), endpoint,
  replica, prompt and output tokens, pool wait, TTFT, duration, status and outcome.
* :func:`client_request_id` — a client's ``X-Request-Id`` made safe for logs and upstream
  headers (:data:`REQUEST_ID_CHARS`, at most :data:`MAX_REQUEST_ID` characters).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import time
from typing import Any

__all__ = [
    "ACCESS_FIELDS",
    "MAX_REQUEST_ID",
    "REQUEST_ID_CHARS",
    "JsonFormatter",
    "access_log",
    "client_request_id",
    "configure_logging",
    "log_access",
    "upstream_debug_from_env",
]

access_log = logging.getLogger("balanceroute.access")

#: The access line's fields, in order (``None`` prints as ``-`` in text, ``null`` in JSON).
ACCESS_FIELDS = ("request_id", "endpoint", "stream", "status", "outcome", "replica", "prompt_tokens",
                 "output_tokens", "pool_wait_s", "ttft_s", "duration_s", "attempts", "upstream_id")
#: Characters kept from a client's ``X-Request-Id`` (others are dropped).
REQUEST_ID_CHARS = "A-Za-z0-9._:@/+=~-"
MAX_REQUEST_ID = 128
_UNSAFE = re.compile(f"[^{REQUEST_ID_CHARS}]")
#: The upstream HTTP client's loggers: debug noise unless asked for.
UPSTREAM_LOGGERS = ("httpx", "httpcore", "hpack", "h2")
_ENV_UPSTREAM = "BALANCEROUTE_LOG_UPSTREAM"


def client_request_id(value: str | None) -> str | None:
    """The client's ``X-Request-Id`` with characters outside :data:`REQUEST_ID_CHARS` dropped,
    cut to :data:`MAX_REQUEST_ID`; ``None`` when nothing is left (or none was sent)."""
    if not value:
        return None
    cleaned = _UNSAFE.sub("", value)[:MAX_REQUEST_ID]
    return cleaned or None


def upstream_debug_from_env() -> bool:
    """Whether ``BALANCEROUTE_LOG_UPSTREAM`` asks for the upstream client's own log lines."""
    return os.environ.get(_ENV_UPSTREAM, "").strip().lower() in ("1", "true", "yes", "on", "debug")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (UTC ISO 8601), ``level``, ``logger``, ``message``,
    the access fields of an access line, and ``exc`` (the traceback as one string) if any."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        fields = getattr(record, "access", None)
        if isinstance(fields, dict):  # an access line: its fields, not their text again
            out["message"] = "access"
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, ensure_ascii=False, default=str)


class _TextFormatter(logging.Formatter):
    """``time level logger: message``, tracebacks indented under the line."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")


def configure_logging(level: str = "info", fmt: str = "text", *, upstream_debug: bool | None = None,
                      stream: Any = None) -> None:
    """Log at ``level`` to ``stream`` (stderr) as ``fmt`` (``"text"`` or ``"json"``), replacing
    the root logger's handlers. The upstream HTTP client logs at WARNING and above unless
    ``upstream_debug`` (``None``: the environment variable ``BALANCEROUTE_LOG_UPSTREAM``)."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log_format={fmt!r} must be 'text' or 'json'")
    if upstream_debug is None:
        upstream_debug = upstream_debug_from_env()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else _TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in UPSTREAM_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if upstream_debug else logging.WARNING)
    # uvicorn's own access log would repeat the access line without the proxy's fields
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4f}" if math.isfinite(value) else "-"
    return str(value)


def log_access(**fields: Any) -> None:
    """One access line (INFO, logger ``balanceroute.access``) with :data:`ACCESS_FIELDS`
    (missing ones are ``None``); text: ``key=value`` pairs, JSON: the fields at top level."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    record = {name: fields.get(name) for name in ACCESS_FIELDS}
    for name in ("pool_wait_s", "ttft_s", "duration_s"):
        value = record[name]
        if isinstance(value, float):
            record[name] = round(value, 4) if math.isfinite(value) else None
    text = " ".join(f"{name}={_text(value)}" for name, value in record.items()
                    if not (name == "upstream_id" and value is None))
    access_log.info("%s", text, extra={"access": record})
