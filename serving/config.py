"""Configuration of the proxy (``balanceroute serve``): frozen dataclasses read from JSON/TOML.

A config file is a mapping with the fields of :class:`ProxyConfig`; ``prefill`` and ``decode``
are lists of tables. A decode entry is one replica (``{"url": ..., "dp_rank": 3}``), or a whole
data-parallel server expanded into its ranks (``{"url": ..., "dp_size": 8}``: replicas
``dp_rank = 0..7`` reached through the ``X-data-parallel-rank`` header).
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

if TYPE_CHECKING:  # core pulls numpy; the config is read by commands that need none of it
    from balanceroute.core.lease import LeaseRule

__all__ = [
    "MAX_BODY_BYTES",
    "DecodeReplica",
    "OutlierConfig",
    "PrefillEndpoint",
    "ProxyConfig",
    "load_config_file",
]

KvDialect = Literal["nixl", "mooncake", "sglang", "none"]
PrefillBalance = Literal["round_robin", "least_loaded"]
HttpServer = Literal["native", "uvicorn"]
EngineState = Literal["off", "vllm", "sglang"]
LogFormat = Literal["text", "json"]
MAX_BODY_BYTES = 16 * 1024 * 1024  # the default request body limit (the proxy and its HTTP server)


def _env_secret(name: str | None) -> str | None:
    """The value of environment variable ``name`` (``None`` when unset, empty or not named)."""
    return (os.environ.get(name) or None) if name else None


def read_secret_file(path: str, what: str) -> str:
    """The secret in file ``path`` (its first line, without surrounding blanks); a one-line
    ``ValueError`` naming ``what`` when it cannot be read or is empty."""
    try:
        with open(path, encoding="utf-8") as fh:
            secret = fh.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    if not secret:
        raise ValueError(f"{what} {path}: the file is empty")
    return secret


def _reject_unknown(cls: type, data: Mapping[str, Any], what: str) -> None:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {what}(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")


_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"), "float": ((int, float), "a number"), "bool": ((bool,), "true or false"),
    "str": ((str,), "a string"), "KvDialect": ((str,), "a string"), "PrefillBalance": ((str,), "a string"),
    "HttpServer": ((str,), "a string"), "EngineState": ((str,), "a string"), "LogFormat": ((str,), "a string"),
}


_PARSED = frozenset({"ttft_slo_s"})  # fields with their own parser (``"off"``)


def _check_types(cls: type, data: Mapping[str, Any], where: str = "") -> None:
    """Every value in ``data`` has its field's scalar type (``int``, ``float``, ``bool``,
    ``str``, optionally ``| None``): a config file's ``slots = "many"`` is a one-line error
    naming the key, not a ``TypeError`` from a comparison. Other field types are checked by
    their own parsers."""
    types = {f.name: str(f.type) for f in fields(cls)}
    for key, value in data.items():
        spec = types.get(key, "")
        optional = spec.endswith(" | None")
        kind = _KINDS.get(spec.removesuffix(" | None"))
        if kind is None or (optional and value is None) or key in _PARSED:
            continue
        allowed, words = kind
        if isinstance(value, bool) and bool not in allowed or not isinstance(value, allowed):
            raise ValueError(f"{where}{key}={value!r} must be {words}")


def field_error(exc: Exception, where: str = "") -> ValueError:
    """``exc`` as a one-line config error: ``self.`` dropped from ``self.x=...`` (the message
    names the config key ``x``), prefixed with ``where`` (e.g. ``decode[2]: ``)."""
    return ValueError(where + str(exc).replace("self.", ""))


def _check_url(url: str, what: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} url={url!r} must be an http(s)://host[:port] URL")
    return url.rstrip("/")


@dataclass(frozen=True, slots=True, kw_only=True)
class OutlierConfig:
    """Thresholds of :class:`~.outlier.OutlierDetector` (the ``[outlier]`` table), defaults after
    Envoy's outlier detection and vllm-router's circuit breaker; see docs/serving.md."""

    consecutive_failures: int = 5
    failure_rate: float = 0.5
    window_s: float = 30.0
    min_requests: int = 20
    base_ejection_s: float = 10.0
    max_ejection_s: float = 300.0
    max_ejected_fraction: float = 0.5
    panic_threshold: float = 0.5
    success_threshold: int = 3
    poison_hosts: int = 3
    probe_failure_threshold: int = 3
    probe_success_threshold: int = 2

    def __post_init__(self) -> None:
        for name in ("consecutive_failures", "min_requests", "success_threshold", "poison_hosts",
                     "probe_failure_threshold", "probe_success_threshold"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"outlier.{name}={getattr(self, name)!r} must be an int >= 1")
        for name in ("failure_rate", "max_ejected_fraction", "panic_threshold"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
                raise ValueError(f"outlier.{name}={value!r} must be in [0, 1]")
        for name in ("window_s", "base_ejection_s", "max_ejection_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"outlier.{name}={value!r} must be > 0")
        if self.max_ejection_s < self.base_ejection_s:
            raise ValueError(f"{self.max_ejection_s=} must be >= base_ejection_s")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> OutlierConfig:
        """From a config table; unknown keys and values of the wrong type are an error."""
        _reject_unknown(cls, data, "outlier key")
        _check_types(cls, data, "outlier.")
        try:
            return cls(**data)
        except ValueError as exc:
            text = str(field_error(exc))
            raise ValueError(text if text.startswith("outlier.") else f"outlier.{text}") from None


def parse_ttft_slo(value: object) -> float:
    """A ``ttft_slo_s`` setting: seconds > 0, or ``"off"`` / ``inf`` (returned as ``inf``)."""
    if isinstance(value, str) and value.strip().lower() == "off":
        return math.inf
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"ttft_slo_s={value!r} must be a number of seconds > 0 or 'off'") from None
    if not seconds > 0:  # NaN fails too
        raise ValueError(f"ttft_slo_s={value!r} must be a number of seconds > 0 or 'off'")
    return seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillEndpoint:
    """One prefill server. ``bootstrap_addr`` (Mooncake dialect only) is its bootstrap server,
    ``http://<host>:<bootstrap_port>`` by default; ``dp_size`` is learnt from its ``/query``.
    ``api_key_env``: environment variable holding the bearer token this server expects (none
    is sent otherwise). ``kv_lease_s``: how long this server holds a prefilled request's KV
    (vLLM NIXL ``kv_connector_extra_config.kv_lease_duration``); ``None`` takes
    :attr:`ProxyConfig.kv_lease_s`."""

    url: str
    bootstrap_addr: str | None = None
    api_key_env: str | None = None
    kv_lease_s: float | None = None

    def api_key(self) -> str | None:
        """The bearer token for this server, if one is configured."""
        return _env_secret(self.api_key_env)

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", _check_url(self.url, "prefill"))
        if self.kv_lease_s is not None and not (isinstance(self.kv_lease_s, (int, float))
                                                and 0 < self.kv_lease_s < math.inf):
            raise ValueError(f"{self.kv_lease_s=} must be a number of seconds > 0")
        if self.bootstrap_addr is not None:
            object.__setattr__(self, "bootstrap_addr", _check_url(self.bootstrap_addr, "bootstrap"))


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeReplica:
    """One DP decode replica g: its own server (``dp_rank=None``) or rank ``dp_rank`` of a DP
    server addressed with the ``X-data-parallel-rank`` header. ``slots`` is B_g (vLLM
    ``max_num_seqs``); ``None`` takes :attr:`ProxyConfig.slots`. ``api_key_env`` as for
    :class:`PrefillEndpoint`. ``kv_budget``: the replica's KV cache in tokens (vLLM
    num_gpu_blocks × block_size, SGLang max_total_num_tokens): BR-0 and BR-H never plan a load
    above it (docs/replicas.md); an engine that reports its cache size (``engine_state``)
    replaces it; ``None``: unbounded until an engine reports one. ``kv_block_size``: the tokens
    of one KV block (vLLM ``--block-size``, 16 by default; 1 for SGLang's token pool): the engine
    allocates whole blocks per request, so up to ``kv_block_size − 1`` tokens of each running
    request's last block are held but unused, and the tick plans against
    ``kv_budget − slots·(kv_block_size − 1)``."""

    url: str
    dp_rank: int | None = None
    slots: int | None = None
    api_key_env: str | None = None
    kv_budget: int | None = None
    kv_block_size: int = 16

    def api_key(self) -> str | None:
        """The bearer token for this server, if one is configured."""
        return _env_secret(self.api_key_env)

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", _check_url(self.url, "decode"))
        if self.dp_rank is not None and self.dp_rank < 0:
            raise ValueError(f"{self.dp_rank=} must be >= 0")
        if self.slots is not None and self.slots < 1:
            raise ValueError(f"{self.slots=} must be >= 1")
        if self.kv_budget is not None and self.kv_budget < 1:
            raise ValueError(f"{self.kv_budget=} must be a number of tokens >= 1")
        if self.kv_block_size < 1:
            raise ValueError(f"{self.kv_block_size=} must be a number of tokens >= 1")

    @property
    def label(self) -> str:
        """``url`` or ``url#rank``: how metrics and status name the replica."""
        return self.url if self.dp_rank is None else f"{self.url}#{self.dp_rank}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyConfig:
    """The BalanceRoute proxy.

    ``kv_dialect``: how KV moves from prefill to decode — ``"nixl"`` (decode gets the
    ``kv_transfer_params`` prefill returned: vLLM's NixlConnector and vllm-ascend's
    MooncakeConnector/LLMDataDist), ``"mooncake"`` (vLLM's MooncakeConnector: the proxy sends
    ``transfer_id`` to both sides and gives decode ``remote_bootstrap_addr`` and the prefill
    DP rank's ``remote_engine_id`` from the bootstrap server's ``/query``), ``"sglang"``
    (SGLang's bootstrap room: both legs get ``bootstrap_host``/``bootstrap_port``/``bootstrap_room``,
    the prefill leg is held open until decode is placed; ``kv_lease_s``: SGLang's
    ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT``; see :mod:`.kv_sglang`) or ``"none"``
    (colocated replicas, no prefill stage; s_i is estimated and corrected from decode's usage).

    Pool and leases: at most ``pool_capacity`` accepted requests wait for a decode slot
    (prefilling or pooled) — beyond that, 429. The KV lease is one rule
    (:class:`~balanceroute.core.lease.LeaseRule`, the simulator's too), per prefill server
    (:meth:`lease_rule`): its KV is held ``kv_lease_s`` after prefill answered (the server's own
    ``kv_lease_s`` if set); a pooled request is never forwarded to decode after
    ``kv_lease_s − lease_transfer_s`` (the transfer's worst case, at most ``lease_margin_s``):
    it is prefilled again, up to ``max_reprefills`` times, then answered 503
    ``kv_lease_expired``. The policy's ``deadline_s`` defaults to ``kv_lease_s −
    lease_margin_s`` (the shortest lease's) so such requests are dispatched first.
    The tick runs on every pool arrival (a prefilled request, a retry put back) and slot release,
    and every ``tick_interval_s`` while a request is pooled; with an empty pool no timer is armed.
    ``health_interval_s`` (0: no probes) also keeps the event-loop lag sampled; with probes off it
    is sampled only while a request is in flight, so an idle proxy arms no periodic timer (with
    ``engine_state`` off).

    Secure defaults: no credential goes upstream unless an upstream names its ``api_key_env``
    (``upstream_api_key_env`` names one for every upstream that has none); ``/status`` and
    ``/admin/*`` answer only when ``admin_token_env`` is set (and then need that token);
    clients need ``Authorization: Bearer <client_api_key>`` on ``/v1/*`` when a client key is
    set (``client_api_key_file``, a file holding it; the variable ``client_api_key_env``; or
    ``client_api_key`` itself, which ``serve --api-key`` shows in the process list); ``/metrics`` labels
    replicas by index, with URLs only when ``metrics_urls`` is set.

    ``http_server``: ``"native"`` (the package's own HTTP/1.1 server, whose streamed
    completions relay each decode chunk straight from the upstream connection to the client's,
    no coroutine per chunk) or ``"uvicorn"`` (the relay as a coroutine per stream).

    Deadlines (docs/operator.md): a prefill attempt may take ``prefill_timeout_s +
    prefill_timeout_per_token_s · s_i`` before it is retried on another instance; a decode
    attempt ``decode_first_token_timeout_s`` to its first token before it is retried elsewhere;
    after that a stream that sends nothing for ``decode_read_timeout_s`` ends with an error
    event. Each timeout counts as that server's failure. Clients: the request line and headers
    must arrive within ``header_timeout_s``, the body within ``body_timeout_s``; a client that
    reads nothing for ``write_stall_timeout_s`` while its response waits is disconnected (the
    upstream request aborted). On SIGTERM in-flight requests get ``drain_timeout_s`` to finish.

    ``engine_state``: read the decode engines' own per-rank state — ``"vllm"`` (``/metrics``,
    per ``engine`` label), ``"sglang"`` (``/v1/loads``) or ``"off"`` (the proxy's ledger only) —
    every ``engine_poll_interval_s``; the policy then sees load that did not come through this
    proxy (other clients, a second proxy, load from before a restart). A report is trusted for
    three poll intervals. See docs/engine-state.md.

    ``speed_fit``: fit each decode replica's step time online from the inter-token intervals
    the proxy relays (``serving/speed_fit.py``) and let the policy decide on step time (BR-0,
    BR-H); off, the policy balances tokens. Not yet reliable for lock-stepped DP ranks in
    closed loop (docs/replicas.md).

    ``outlier``: ejection of failing replicas and prefill instances (:class:`OutlierConfig`).
    ``max_model_len``: when set, ``max_tokens`` above it is a 400 at the edge. ``ttft_slo_s``:
    passed to the policy as its ``ttft_slo_s`` parameter when set; ``"off"`` (or ``inf``) switches
    the policy's urgency term off (the hard ``deadline_s`` alone); unset keeps the policy's default.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    kv_dialect: KvDialect = "nixl"
    prefill: tuple[PrefillEndpoint, ...] = ()
    decode: tuple[DecodeReplica, ...] = ()
    slots: int = 64
    policy: str = "br0"
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    prefill_balance: PrefillBalance = "round_robin"
    bootstrap_port: int = 8998
    pool_capacity: int = 256
    kv_lease_s: float = 30.0
    lease_margin_s: float = 5.0
    lease_transfer_s: float = 2.0
    max_reprefills: int = 1
    tick_interval_s: float = 0.05
    max_attempts: int = 3
    connect_timeout_s: float = 5.0
    prefill_timeout_s: float = 30.0
    prefill_timeout_per_token_s: float = 5e-4
    decode_first_token_timeout_s: float = 30.0
    decode_read_timeout_s: float = 30.0
    drain_timeout_s: float = 25.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    write_stall_timeout_s: float = 30.0
    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    max_body_bytes: int = MAX_BODY_BYTES
    retry_after_s: int = 1
    admin_token_env: str | None = None
    upstream_api_key_env: str | None = None
    client_api_key_env: str | None = None
    client_api_key: str | None = field(default=None, repr=False)
    client_api_key_file: str | None = None
    metrics_urls: bool = False
    outlier: OutlierConfig = field(default_factory=OutlierConfig)
    max_model_len: int | None = None
    ttft_slo_s: float | None = None
    served_models: tuple[str, ...] = ()
    log_level: str = "info"
    log_format: LogFormat = "text"
    log_upstream: bool = False
    http_server: HttpServer = "native"
    engine_state: EngineState = "off"
    engine_poll_interval_s: float = 0.5
    speed_fit: bool = False

    def __post_init__(self) -> None:
        if self.kv_dialect not in ("nixl", "mooncake", "sglang", "none"):
            raise ValueError(f"{self.kv_dialect=} must be 'nixl', 'mooncake', 'sglang' or 'none'")
        if self.prefill_balance not in ("round_robin", "least_loaded"):
            raise ValueError(f"{self.prefill_balance=} must be 'round_robin' or 'least_loaded'")
        if not self.decode:
            raise ValueError("decode must list at least one replica (config key decode, or serve --decode URL)")
        if self.kv_dialect != "none" and not self.prefill:
            raise ValueError(f"kv_dialect={self.kv_dialect!r} needs at least one prefill instance")
        keys = [(d.url, d.dp_rank) for d in self.decode]
        if len(set(keys)) != len(keys):
            raise ValueError("decode lists the same replica (url, dp_rank) twice")
        if len({p.url for p in self.prefill}) != len(self.prefill):
            raise ValueError("prefill lists the same url twice")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"{self.port=} must be in 0..65535")
        if self.slots < 1:
            raise ValueError(f"{self.slots=} must be >= 1")
        if self.pool_capacity < 1:
            raise ValueError(f"{self.pool_capacity=} must be >= 1")
        if not self.kv_lease_s > 0:
            raise ValueError(f"{self.kv_lease_s=} must be > 0")
        if not 0 <= self.lease_margin_s < self.kv_lease_s:
            raise ValueError(f"{self.kv_lease_s=} must be > lease_margin_s={self.lease_margin_s} >= 0")
        if not 0 <= self.lease_transfer_s < math.inf:
            raise ValueError(f"{self.lease_transfer_s=} must be >= 0 seconds")
        if self.max_reprefills < 0:
            raise ValueError(f"{self.max_reprefills=} must be >= 0")
        for p in self.prefill:
            if p.kv_lease_s is not None and not self.lease_margin_s < p.kv_lease_s:
                raise ValueError(f"prefill {p.url}: kv_lease_s={p.kv_lease_s!r} must be > "
                                 f"lease_margin_s={self.lease_margin_s!r}")
        if not self.tick_interval_s > 0:
            raise ValueError(f"{self.tick_interval_s=} must be > 0")
        if self.max_attempts < 1:
            raise ValueError(f"{self.max_attempts=} must be >= 1")
        for name in ("connect_timeout_s", "prefill_timeout_s", "decode_read_timeout_s",
                     "health_timeout_s", "decode_first_token_timeout_s", "header_timeout_s",
                     "body_timeout_s", "write_stall_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be > 0")
        for name in ("prefill_timeout_per_token_s", "drain_timeout_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 0")
        if self.health_interval_s < 0 or math.isnan(self.health_interval_s):
            raise ValueError(f"{self.health_interval_s=} must be >= 0 (0 disables probing)")
        if self.max_body_bytes < 1024:
            raise ValueError(f"{self.max_body_bytes=} must be >= 1024")
        if self.retry_after_s < 0:
            raise ValueError(f"{self.retry_after_s=} must be >= 0")
        if not 1 <= self.bootstrap_port <= 65535:
            raise ValueError(f"{self.bootstrap_port=} must be in 1..65535")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"{self.max_model_len=} must be >= 1")
        if self.ttft_slo_s is not None:
            object.__setattr__(self, "ttft_slo_s", parse_ttft_slo(self.ttft_slo_s))
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ValueError(f"{self.log_level=} must be debug, info, warning or error")
        if self.log_format not in ("text", "json"):
            raise ValueError(f"{self.log_format=} must be 'text' or 'json'")
        if self.http_server not in ("native", "uvicorn"):
            raise ValueError(f"{self.http_server=} must be 'native' or 'uvicorn'")
        if self.engine_state not in ("off", "vllm", "sglang"):
            raise ValueError(f"{self.engine_state=} must be 'off', 'vllm' or 'sglang'")
        if not (isinstance(self.engine_poll_interval_s, (int, float)) and 0 < self.engine_poll_interval_s < math.inf):
            raise ValueError(f"{self.engine_poll_interval_s=} must be > 0 seconds")
        if self.upstream_api_key_env:  # the fleet-wide default for upstreams without their own
            object.__setattr__(self, "prefill", tuple(
                p if p.api_key_env else replace(p, api_key_env=self.upstream_api_key_env) for p in self.prefill))
            object.__setattr__(self, "decode", tuple(
                d if d.api_key_env else replace(d, api_key_env=self.upstream_api_key_env) for d in self.decode))

    @property
    def num_replicas(self) -> int:
        """G."""
        return len(self.decode)

    def replica_slots(self) -> list[int]:
        """B_g for every replica."""
        return [d.slots if d.slots is not None else self.slots for d in self.decode]

    def bootstrap_addr(self, index: int) -> str:
        """The Mooncake bootstrap server of prefill instance ``index``."""
        p = self.prefill[index]
        if p.bootstrap_addr is not None:
            return p.bootstrap_addr
        host = urlsplit(p.url).hostname or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.bootstrap_port}"

    def lease_rule(self, index: int | None = None) -> LeaseRule:
        """The KV lease of prefill server ``index`` (``None``: the fleet default ``kv_lease_s``)
        as the one :class:`~balanceroute.core.lease.LeaseRule`: forward by ``lease −
        min(lease_transfer_s, lease_margin_s)``, placed first from ``lease − lease_margin_s``."""
        from balanceroute.core.lease import LeaseRule

        lease = self.kv_lease_s
        if index is not None and self.prefill[index].kv_lease_s is not None:
            lease = float(self.prefill[index].kv_lease_s)
        margin = min(self.lease_transfer_s, self.lease_margin_s)
        return LeaseRule(lease_s=lease, margin_s=margin, priority_s=self.lease_margin_s - margin,
                         max_reprefills=self.max_reprefills)

    def policy_lease(self) -> LeaseRule:
        """The rule with the shortest lease over the prefill servers: its ``deadline_s`` is the
        policy's pool deadline (one number for the whole pool)."""
        rules = [self.lease_rule(i) for i in range(len(self.prefill))] or [self.lease_rule()]
        return min(rules, key=lambda r: r.deadline_s)

    def admin_token(self) -> str | None:
        """The admin token (from the environment variable ``admin_token_env``), if any."""
        return _env_secret(self.admin_token_env)

    def client_key(self) -> str | None:
        """The key clients must present on ``/v1/*``, if client auth is on."""
        if self.client_api_key:
            return self.client_api_key
        if self.client_api_key_file:
            return read_secret_file(self.client_api_key_file, "client_api_key_file")
        return _env_secret(self.client_api_key_env)

    def policy_parameters(self) -> dict[str, Any]:
        """``policy_params`` plus ``ttft_slo_s`` when it is set."""
        params = dict(self.policy_params)
        if self.ttft_slo_s is not None:  # inf: "off", which the policies spell None
            params["ttft_slo_s"] = None if math.isinf(self.ttft_slo_s) else self.ttft_slo_s
        return params

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ProxyConfig:
        """Build from a parsed config file; unknown keys and values of the wrong type are an
        error naming the key."""
        _reject_unknown(cls, data, "config key")
        _check_types(cls, data)
        values = dict(data)
        if "prefill" in values:
            values["prefill"] = tuple(_prefill_entry(p, i) for i, p in enumerate(_as_list(values["prefill"], "prefill")))
        if "decode" in values:
            values["decode"] = tuple(
                d for i, entry in enumerate(_as_list(values["decode"], "decode")) for d in _decode_entries(entry, i)
            )
        if "served_models" in values:
            values["served_models"] = tuple(_as_list(values["served_models"], "served_models"))
        if "policy_params" in values and not isinstance(values["policy_params"], Mapping):
            raise ValueError("policy_params must be a table/object")
        if "outlier" in values:
            if not isinstance(values["outlier"], Mapping):
                raise ValueError("outlier must be a table/object")
            values["outlier"] = OutlierConfig.from_mapping(values["outlier"])
        try:
            return cls(**values)
        except TypeError as exc:
            raise ValueError(f"config: {exc}") from None
        except ValueError as exc:
            raise field_error(exc) from None


def _as_list(value: Any, what: str) -> list:
    if isinstance(value, (str, Mapping)):
        return [value]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} must be a list")
    return list(value)


def _prefill_entry(entry: Any, index: int = 0) -> PrefillEndpoint:
    where = f"prefill[{index}]: "
    if isinstance(entry, str):
        return PrefillEndpoint(url=entry)
    if not isinstance(entry, Mapping):
        raise ValueError(f"prefill entry {entry!r} must be a URL or a table")
    _reject_unknown(PrefillEndpoint, entry, f"prefill[{index}] key")
    _check_types(PrefillEndpoint, entry, where)
    try:
        return PrefillEndpoint(**entry)
    except TypeError as exc:
        raise ValueError(f"prefill entry {dict(entry)!r}: {exc}") from None
    except ValueError as exc:
        raise field_error(exc, where) from None


def _decode_entries(entry: Any, index: int = 0) -> list[DecodeReplica]:
    where = f"decode[{index}]: "
    if isinstance(entry, str):
        return [DecodeReplica(url=entry)]
    if not isinstance(entry, Mapping):
        raise ValueError(f"decode entry {entry!r} must be a URL or a table")
    values = dict(entry)
    dp_size = values.pop("dp_size", None)
    start = values.pop("dp_rank_start", 0)
    _reject_unknown(DecodeReplica, values, f"decode[{index}] key")
    _check_types(DecodeReplica, values, where)
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise ValueError(f"{where}dp_rank_start={start!r} must be an integer >= 0")
    try:
        if dp_size is None:
            return [DecodeReplica(**values)]
        if not isinstance(dp_size, int) or isinstance(dp_size, bool) or dp_size < 1 or "dp_rank" in values:
            raise ValueError(f"dp_size={dp_size!r} must be an integer >= 1, without dp_rank")
        return [DecodeReplica(dp_rank=start + r, **values) for r in range(dp_size)]
    except TypeError as exc:
        raise ValueError(f"decode entry {dict(entry)!r}: {exc}") from None
    except ValueError as exc:
        raise field_error(exc, where) from None


def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """Parse a JSON (``.json``) or TOML (anything else) config file into a mapping."""
    text_path = os.fspath(path)
    try:
        with open(text_path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ValueError(f"--config {text_path}: cannot read it ({exc.strerror or exc})") from None
    if text_path.endswith(".json"):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{text_path}: invalid JSON: {exc}") from None
    else:
        try:
            data = tomllib.loads(raw.decode())
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{text_path}: invalid TOML: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{text_path}: the top level must be a table/object")
    return data
