"""Subcommands ``serve`` (the proxy), ``emulate`` (an emulated PD cluster) and ``loadgen``."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import re
import sys
from typing import Any

__all__ = ["API_KEY_ENV", "register", "secret_warnings", "serve_config"]

#: The environment variable holding the client key when no other is configured.
API_KEY_ENV = "BALANCEROUTE_API_KEY"


def _param(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip(), value


def _slow(text: str) -> tuple[int, float]:
    g, sep, factor = text.partition(":")
    try:
        return int(g), float(factor)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected REPLICA:FACTOR, e.g. 3:2.0") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``serve``, ``emulate`` and ``loadgen``."""
    p = subparsers.add_parser(
        "serve", help="run the BalanceRoute proxy in front of vLLM / vllm-ascend PD replicas",
        description="OpenAI-compatible proxy: prefill, pool, the policy's scheduling tick, decode. "
                    "Options override the config file (JSON, or TOML for other extensions).")
    p.add_argument("--config", help="config file (.json or .toml); see docs/serving.md")
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default 8000)")
    p.add_argument("--kv-dialect", choices=("nixl", "mooncake", "sglang", "none"),
                   help="nixl: decode gets prefill's kv_transfer_params (vLLM NIXL, vllm-ascend "
                        "Mooncake/LLMDataDist); mooncake: vLLM MooncakeConnector bootstrap; sglang: "
                        "SGLang bootstrap room (prefill held open until decode is placed); none: "
                        "no prefill stage (colocated replicas)")
    p.add_argument("--prefill", action="append", metavar="URL", help="a prefill server (repeat)")
    p.add_argument("--decode", action="append", metavar="URL",
                   help="a decode replica (repeat); with --dp-size each URL is a DP server")
    p.add_argument("--dp-size", type=int, help="expand every --decode URL into this many DP ranks "
                                               "(X-data-parallel-rank)")
    p.add_argument("--slots", type=int, help="slots per decode replica B (vLLM max_num_seqs; default 64)")
    p.add_argument("--policy", help="routing policy name (default br0)")
    p.add_argument("--policy-param", action="append", type=_param, metavar="KEY=VALUE",
                   help="policy parameter (value parsed as JSON when it can be), e.g. s_greedy=8")
    p.add_argument("--prefill-balance", choices=("round_robin", "least_loaded"))
    p.add_argument("--bootstrap-port", type=int, help="Mooncake bootstrap port on prefill hosts (8998)")
    p.add_argument("--pool-capacity", type=int, help="max requests waiting for decode (429 beyond)")
    p.add_argument("--kv-lease", type=float, dest="kv_lease_s", help="KV lease in seconds (30)")
    p.add_argument("--tick-interval", type=float, dest="tick_interval_s", help="periodic tick while a request is pooled (0.05 s)")
    p.add_argument("--max-attempts", type=int, help="upstream attempts before 502 (3)")
    p.add_argument("--health-interval", type=float, dest="health_interval_s",
                   help="health probe period in seconds; 0 disables (2)")
    p.add_argument("--engine-state", choices=("off", "vllm", "sglang"),
                   help="read the decode engines' per-rank load (vllm: /metrics, sglang: /v1/loads) "
                        "so load that bypassed this proxy counts (default off)")
    p.add_argument("--engine-poll-interval", type=float, dest="engine_poll_interval_s", metavar="SECONDS",
                   help="engine-state polling period (0.5; a report is trusted for three periods)")
    p.add_argument("--admin-token-env", metavar="VAR",
                   help="enable /status and /admin, protected by the token in this environment variable "
                        "(off without it)")
    p.add_argument("--api-key-file", dest="client_api_key_file", metavar="FILE",
                   help="clients must send 'Authorization: Bearer KEY' on /v1/*, KEY being this "
                        f"file's first line; or set the environment variable {API_KEY_ENV}")
    p.add_argument("--api-key-env", dest="client_api_key_env", metavar="VAR",
                   help="as --api-key-file, with the key read from this environment variable")
    p.add_argument("--api-key", dest="client_api_key", metavar="KEY",
                   help="as --api-key-file, with the key itself (visible to every local user in "
                        "the process list: prefer --api-key-file or " + API_KEY_ENV + ")")
    p.add_argument("--upstream-api-key-env", metavar="VAR",
                   help="send the bearer token in this environment variable to every upstream "
                        "(none is sent by default; per upstream: api_key_env in the config)")
    p.add_argument("--params", action="append", default=[], metavar="FILE",
                   help="policy parameters from a `balanceroute tune --write-params` file (a "
                        "brh-survival file serves brh-survival, which learns its forecast from "
                        "finished requests; another brh-<predictor> file applies to brh, without "
                        "a predictor); --policy-param overrides single keys")
    p.add_argument("--ttft-slo", dest="ttft_slo_s", metavar="SECONDS|off",
                   help="soft first-token deadline passed to the policy as ttft_slo_s (policies "
                        "that take it; br0/brh default 4 s); 'off' leaves only the KV-lease deadline")
    p.add_argument("--max-model-len", type=int, help="reject max_tokens above this with 400")
    p.add_argument("--metrics-urls", action="store_true", default=None,
                   help="label /metrics replicas with their URLs (index only by default)")
    p.add_argument("--served-model", action="append", dest="served_models", metavar="NAME",
                   help="model names for /v1/models when no decode server answers")
    p.add_argument("--http-server", choices=("native", "uvicorn"),
                   help="native (default): the package's HTTP/1.1 server, streams relayed chunk by "
                        "chunk from the upstream socket to the client's without a coroutine per "
                        "chunk; uvicorn: uvicorn (uvloop + httptools), a coroutine per stream")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                   help="info (default) logs one access line per request")
    p.add_argument("--log-format", choices=("text", "json"),
                   help="text (default) or json: one JSON object per line (docs/operator.md)")
    p.add_argument("--log-upstream", action="store_true", default=None,
                   help="also log the upstream HTTP client's own lines (httpx/httpcore; noisy at "
                        "debug); or set BALANCEROUTE_LOG_UPSTREAM=1")
    t = p.add_argument_group("deadlines and limits (seconds; docs/operator.md)")
    t.add_argument("--drain-timeout", type=float, metavar="SECONDS", dest="drain_timeout_s",
                   help="on SIGTERM, how long in-flight requests may finish before they are ended "
                        "with an error (25)")
    t.add_argument("--prefill-timeout", type=float, metavar="SECONDS", dest="prefill_timeout_s",
                   help="a prefill attempt's deadline, plus --prefill-timeout-per-token per prompt "
                        "token, before it is retried on another instance (30)")
    t.add_argument("--prefill-timeout-per-token", type=float, metavar="SECONDS", dest="prefill_timeout_per_token_s",
                   help="added to --prefill-timeout per prompt token (0.0005)")
    t.add_argument("--first-token-timeout", type=float, metavar="SECONDS", dest="decode_first_token_timeout_s",
                   help="a decode attempt's deadline for its first token before it is retried on "
                        "another replica (30)")
    t.add_argument("--stall-timeout", type=float, metavar="SECONDS", dest="decode_read_timeout_s",
                   help="a decode stream silent this long after its first token ends with an error "
                        "event (30)")
    t.add_argument("--header-timeout", type=float, metavar="SECONDS", dest="header_timeout_s",
                   help="a client's request line and headers must arrive within this (10)")
    t.add_argument("--body-timeout", type=float, metavar="SECONDS", dest="body_timeout_s",
                   help="a client's request body must arrive within this (60)")
    t.add_argument("--write-stall-timeout", type=float, metavar="SECONDS", dest="write_stall_timeout_s",
                   help="a client that reads nothing this long while its response waits is "
                        "disconnected and its upstream request aborted (30)")
    p.set_defaults(handler=_serve, flag_names={a.dest: a.option_strings[0] for a in p._actions
                                               if a.option_strings and a.dest != "help"})

    e = subparsers.add_parser(
        "emulate", help="run an emulated PD cluster (prefill + G lock-step DP decode replicas)",
        description="Emulated vLLM prefill and decode servers: tau = b + a*M per step, scaled by "
                    "--time-scale; /metrics with vLLM names, /get_load, /stats, /fault.")
    e.add_argument("--replicas", "-G", type=int, default=8, help="decode replicas G (default 8)")
    e.add_argument("--slots", "-B", type=int, default=64, help="slots per replica (default 64)")
    e.add_argument("--prefill", type=int, default=1, help="prefill instances (default 1)")
    e.add_argument("--prefill-dp", type=int, default=1, help="DP ranks per prefill instance (Mooncake /query)")
    e.add_argument("--layout", choices=("ports", "dp"), default="ports",
                   help="ports: one server per replica; dp: one server, replicas as DP ranks")
    e.add_argument("--host", default="127.0.0.1")
    e.add_argument("--port", type=int, default=9000,
                   help="first port: prefill servers, then decode (0: any free ports)")
    e.add_argument("--time-scale", type=float, default=1.0,
                   help="wall seconds per emulated second (0.1 = 10x faster)")
    e.add_argument("--step-model", default="", help="tau = b + max_g(a*L_g + c*n_g), e.g. b=0.03,a=2e-7")
    e.add_argument("--prefill-time", default="", help="prefill seconds = b + a*s, e.g. b=0.02,a=2e-5")
    e.add_argument("--model", default="balanceroute-emulator", help="served model name")
    e.add_argument("--output-workload", metavar="SPEC",
                   help="draw output lengths from this workload when requests lack ignore_eos")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--kv-lease", type=float, default=30.0, help="prefill KV hold in seconds")
    e.add_argument("--kv-capacity", type=int, default=1_000_000, metavar="TOKENS",
                   help="KV budget of each decode replica in tokens (whole blocks of 16; default "
                        "1,000,000): past it a replica queues, then preempts its newest request, "
                        "which recomputes its KV, as vLLM does")
    e.add_argument("--stamp-chunks", action="store_true", help="add emulator_ts to streamed chunks")
    e.add_argument("--prefill-fail-rate", type=float, default=0.0)
    e.add_argument("--decode-fail-rate", type=float, default=0.0)
    e.add_argument("--stream-break-rate", type=float, default=0.0)
    e.add_argument("--poison-word", metavar="WORD",
                   help="every decode replica answers 500 to prompts containing WORD (a poison request)")
    e.add_argument("--kill-replica", type=int, action="append", default=[], metavar="G")
    e.add_argument("--slow-replica", type=_slow, action="append", default=[], metavar="G:FACTOR")
    e.add_argument("--write-proxy-config", metavar="FILE",
                   help="write a proxy config (JSON) for this emulator once it is up")
    e.add_argument("--kv-dialect", choices=("nixl", "mooncake", "sglang", "none"), default="nixl",
                   help="dialect of the written proxy config")
    e.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="warning")
    e.set_defaults(handler=_emulate)

    g = subparsers.add_parser(
        "loadgen", help="replay a workload against an OpenAI endpoint and report TTFT/TPOT/throughput",
        description="Open loop (trace arrival times, scaled) or closed loop (N clients); each request "
                    "asks for exactly o_i tokens (max_tokens + ignore_eos).")
    g.add_argument("--url", required=True, help="base URL of the endpoint (the proxy, or a peer router)")
    g.add_argument("--api", choices=("completions", "chat"), default="completions")
    g.add_argument("--model", default="balanceroute-emulator")
    g.add_argument("--workload", default="servegen-r1", help="bundled name or trace file")
    g.add_argument("--requests", type=int, default=1000)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--max-output", type=int, help="keep requests with output <= this")
    g.add_argument("--clip-prompt", type=int, help="cap prompt lengths at this")
    g.add_argument("--clip-output", type=int, help="cap output lengths at this")
    g.add_argument("--mode", choices=("closed", "open"), default="closed")
    g.add_argument("--concurrency", type=int, default=64, help="closed loop: concurrent clients")
    g.add_argument("--rate-scale", type=float, default=1.0, help="open loop: arrival rate multiplier")
    g.add_argument("--prompt-style", choices=("ids", "words"), default=None,
                   help="ids: token-id prompts (completions); words: text (default for chat)")
    g.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    g.add_argument("--time-limit", type=float, help="stop sending after this many seconds")
    g.add_argument("--emulator-stats", metavar="URL",
                   help="an emulator's /stats URL: reset before, read after (imbalance, throughput)")
    g.add_argument("--json", action="store_true", help="print the summary as JSON")
    g.set_defaults(handler=_loadgen)


def serve_config(args: argparse.Namespace):
    """The :class:`~.config.ProxyConfig` that ``serve``'s flags (and ``--config``) describe."""
    from .config import ProxyConfig, load_config_file

    mapping: dict[str, Any] = load_config_file(args.config) if args.config else {}
    for key in ("host", "port", "kv_dialect", "slots", "policy", "prefill_balance", "bootstrap_port",
                "pool_capacity", "kv_lease_s", "tick_interval_s", "max_attempts", "health_interval_s",
                "admin_token_env", "client_api_key", "client_api_key_env", "upstream_api_key_env",
                "ttft_slo_s", "max_model_len", "metrics_urls", "log_level", "http_server",
                "client_api_key_file", "log_format", "log_upstream",
                "engine_state", "engine_poll_interval_s",
                "drain_timeout_s", "prefill_timeout_s", "prefill_timeout_per_token_s",
                "decode_first_token_timeout_s", "decode_read_timeout_s", "header_timeout_s",
                "body_timeout_s", "write_stall_timeout_s"):
        value = getattr(args, key)
        if value is not None:
            mapping[key] = value
    if args.served_models:
        mapping["served_models"] = args.served_models
    if args.params:
        _apply_params_file(mapping, args.params)
    if args.policy_param:
        mapping["policy_params"] = {**mapping.get("policy_params", {}), **dict(args.policy_param)}
    if args.prefill:
        mapping["prefill"] = args.prefill
    if args.dp_size is not None and args.dp_size < 1:
        raise ValueError(f"--dp-size={args.dp_size} must be >= 1")
    if args.decode:
        mapping["decode"] = [{"url": u, "dp_size": args.dp_size} if args.dp_size else {"url": u}
                             for u in args.decode]
    elif args.dp_size:
        raise ValueError("--dp-size needs --decode URL")
    if not mapping.get("decode"):
        raise ValueError("serve needs its decode replicas: --config FILE (a [[decode]] table), or "
                         "--decode URL (repeat; with --prefill URL, or --kv-dialect none); see "
                         "docs/serving.md")
    if not any(mapping.get(k) for k in ("client_api_key", "client_api_key_file", "client_api_key_env")) \
            and os.environ.get(API_KEY_ENV):
        mapping["client_api_key_env"] = API_KEY_ENV
    try:
        return ProxyConfig.from_mapping(mapping)
    except ValueError as exc:
        raise _named(exc, args) from None


def secret_warnings(args: argparse.Namespace) -> list[str]:
    """What ``serve`` warns about its client key: given on the command line (every local user
    can read ``/proc/<pid>/cmdline``), or in a file other users can read."""
    out = []
    if args.client_api_key is not None:
        out.append("--api-key shows the client key to every local user (/proc/<pid>/cmdline, ps); use "
                   f"--api-key-file FILE or the environment variable {API_KEY_ENV} instead")
    path = args.client_api_key_file
    if path:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            mode = 0
        if mode & 0o006:
            out.append(f"--api-key-file {path} is open to every user (mode {mode & 0o777:o}); "
                       f"chmod 600 it")
    return out


def _named(exc: ValueError, args: argparse.Namespace) -> ValueError:
    """A config error naming the flag that set the value (``--slots=0 must be >= 1``) when a
    flag did, else the config key (with the config file's name)."""
    flags = getattr(args, "flag_names", {})
    given = {k: f for k, f in flags.items() if getattr(args, k, None) is not None}
    text = str(exc)
    for key, flag in given.items():
        text = re.sub(rf"^(?:self\.)?{re.escape(key)}=", f"{flag}=", text)
    text = text.replace("self.", "")
    if args.config and text == str(exc).replace("self.", "") and not text.startswith("--"):
        text = f"{args.config}: {text}"
    return ValueError(text)


def _serve(args: argparse.Namespace) -> int:
    from .logs import configure_logging
    from .routes import create_proxy_app
    from .runner import bind_socket, run_foreground, server_options, url_of

    config = serve_config(args)
    configure_logging(config.log_level, config.log_format, upstream_debug=config.log_upstream or None)
    for warning in secret_warnings(args):
        logging.getLogger("balanceroute.serving").warning("%s", warning)
    app = create_proxy_app(config)
    try:
        sock = bind_socket(config.host, config.port)
    except (OSError, ValueError) as exc:  # in use, not allowed, no such address: name the flags
        raise ValueError(f"--host {config.host} --port {config.port}: {getattr(exc, 'strerror', None) or exc}") from None

    def started() -> None:
        # What import and warm-up built lives as long as the process: keep it out of the cyclic
        # collector, whose full passes over it (60-130 ms on a busy 2-core box) stalled every
        # open stream at once (vLLM's server freezes its start-up heap the same way).
        gc.collect()
        gc.freeze()
        line = (f"balanceroute serve: {url_of(sock)}  policy={config.policy}  G={config.num_replicas}  "
                f"dialect={config.kv_dialect}  prefill={len(config.prefill)}")
        if config.log_format == "json":  # every stderr line one JSON object
            logging.getLogger("balanceroute.serving").warning("%s", line)
        else:
            print(line, file=sys.stderr, flush=True)

    run_foreground([(app, sock)], started=started, log_level=config.log_level,
                   drain=lambda: app.state.proxy.drain(config.drain_timeout_s), **server_options(config))
    return 0


def _apply_params_file(mapping: dict[str, Any], paths: list[str]) -> None:
    """Merge one ``--params`` file into the proxy config ``mapping`` (policy and its params)."""
    from balanceroute.params import read_params

    files = read_params(paths)
    if len(files) != 1:
        raise ValueError("serve runs one policy: give one --params file")
    (named, params), = files.items()
    from balanceroute.catalogue import CATALOGUE

    online = named in CATALOGUE and CATALOGUE[named].online
    served = "brh" if named.startswith("brh-") and not online else named
    policy = mapping.get("policy") or served
    if policy != served:
        raise ValueError(f"--params {files.sources[named]} is for {named!r}, but the proxy runs "
                         f"{policy!r}")
    mapping["policy"] = policy
    mapping["policy_params"] = {**mapping.get("policy_params", {}), **params}


def _step_model(text: str):
    from balanceroute.core.dynamics import StepModel

    return StepModel.parse(text)


def _prefill_time(text: str) -> tuple[float, float]:
    values = {"b": 0.02, "a": 2e-5}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        if not sep or key.strip() not in values:
            raise ValueError(f"--prefill-time {part!r}: expected a=... or b=...")
        try:
            values[key.strip()] = float(raw)
        except ValueError:
            raise ValueError(f"--prefill-time {part!r}: {raw!r} is not a number") from None
    return values["b"], values["a"]


#: EmulatorConfig fields and the flags that set them (for error messages).
_EMULATOR_FLAGS = {"num_replicas": "--replicas", "num_prefill": "--prefill", "prefill_dp": "--prefill-dp",
                   "time_scale": "--time-scale", "kv_lease_s": "--kv-lease", "killed": "--kill-replica",
                   "slow": "--slow-replica", "prefill_fail_rate": "--prefill-fail-rate",
                   "decode_fail_rate": "--decode-fail-rate", "stream_break_rate": "--stream-break-rate",
                   "slots": "--slots", "poison_word": "--poison-word", "kv_capacity_tokens": "--kv-capacity"}


def _emulate(args: argparse.Namespace) -> int:
    from balanceroute.cli_checks import flag_error, output_file

    from .emulator import EmulatedCluster, EmulatorConfig
    from .runner import emulator_apps, emulator_proxy_mapping, run_foreground

    output_file(args.write_proxy_config, "--write-proxy-config")
    lengths = None
    if args.output_workload:
        from balanceroute.core.workloads import load_workload

        lengths = load_workload(args.output_workload, seed=args.seed).output_len.astype("int64")
    prefill_b, prefill_a = _prefill_time(args.prefill_time)
    try:
        config = EmulatorConfig(
            num_replicas=args.replicas, slots=args.slots, num_prefill=args.prefill, prefill_dp=args.prefill_dp,
            layout=args.layout, step_model=_step_model(args.step_model), prefill_b=prefill_b,
            prefill_a=prefill_a, time_scale=args.time_scale, model=args.model, output_lengths=lengths,
            seed=args.seed, kv_lease_s=args.kv_lease, stamp_chunks=args.stamp_chunks,
            prefill_fail_rate=args.prefill_fail_rate, decode_fail_rate=args.decode_fail_rate,
            stream_break_rate=args.stream_break_rate, killed=tuple(args.kill_replica),
            slow=tuple(args.slow_replica), poison_word=args.poison_word,
            kv_capacity_tokens=args.kv_capacity,
        )
    except ValueError as exc:  # name the flag, not the field
        raise flag_error(exc, _EMULATOR_FLAGS) from None
    cluster = EmulatedCluster(config)
    try:
        apps, prefill_urls, decode_urls = emulator_apps(cluster, host=args.host, base_port=args.port)
    except (OSError, ValueError) as exc:  # name the flags
        raise ValueError(f"--host {args.host} --port {args.port}: {getattr(exc, 'strerror', None) or exc}") from None
    mapping = emulator_proxy_mapping(config, prefill_urls, decode_urls, kv_dialect=args.kv_dialect)

    async def on_start() -> None:
        cluster.start()

    def started() -> None:
        print(f"balanceroute emulate: G={config.num_replicas} B={config.slots} layout={config.layout} "
              f"time_scale={config.time_scale}", file=sys.stderr)
        for u in prefill_urls:
            print(f"  prefill {u}", file=sys.stderr)
        for u in decode_urls:
            print(f"  decode  {u}", file=sys.stderr)
        print(f"  stats   {(decode_urls or prefill_urls)[0]}/stats", file=sys.stderr, flush=True)
        if args.write_proxy_config:
            tmp = args.write_proxy_config + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(mapping, fh, indent=2)
            os.replace(tmp, args.write_proxy_config)

    run_foreground(apps, on_start=on_start, on_stop=cluster.stop, started=started, log_level=args.log_level)
    return 0


def _loadgen(args: argparse.Namespace) -> int:
    from balanceroute.core.workloads import load_workload

    from .loadgen import LoadgenConfig, run_load_sync

    if args.requests < 1:
        raise ValueError(f"--requests must be >= 1, got {args.requests}")
    workload = load_workload(args.workload, requests=args.requests, seed=args.seed,
                             max_output=args.max_output, clip_prompt=args.clip_prompt,
                             clip_output=args.clip_output)
    style = args.prompt_style or ("words" if args.api == "chat" else "ids")
    config = LoadgenConfig(url=args.url.rstrip("/"), api=args.api, model=args.model, mode=args.mode,
                           concurrency=args.concurrency, rate_scale=args.rate_scale, prompt_style=style,
                           timeout_s=args.timeout, time_limit_s=args.time_limit,
                           emulator_stats=args.emulator_stats)
    summary, _ = run_load_sync(workload, config)
    summary = {"workload": workload.name, **summary}
    if args.json:
        print(json.dumps(summary, indent=2, default=lambda v: None))
    else:
        for key, value in summary.items():
            if isinstance(value, float):
                value = "nan" if math.isnan(value) else f"{value:.4g}"
            print(f"{key:>24}: {value}")
    return 0 if summary["ok"] else 1
