"""What an operator and a client see of the proxy: no upstream internals in client errors, the
model list without vLLM's paths, one access line per request (text or JSON), the client's
X-Request-Id, the client key from a file or the environment, one-line config errors."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from balanceroute.cli import build_parser, main
from balanceroute.serving.cli import API_KEY_ENV, secret_warnings, serve_config
from balanceroute.serving.logs import client_request_id, configure_logging, log_access
from balanceroute.serving.protocol import redact

from .conftest import (
    ByteStream,
    assert_drained,
    chunk,
    mock_proxy,
    pd_config,
    prefill_reply,
    running_emulator,
    sse_stream,
    wait_until,
)
from .test_cli import one_line_error

pytestmark = pytest.mark.anyio

SECRETS = ("127.0.0.1:43779", "gpu-17.prod.internal", "/models/secret-llama", "10.0.0.1", "d0:8000", "d1:8000",
           "p0:8000", "p1:8000", "engine exploded")
LEAKY_BODY = {"error": {"message": "internal: node gpu-17.prod.internal, /models/secret-llama engine exploded"}}


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def _decode(request: httpx.Request) -> bool:
    return request.url.host.startswith("d")


async def test_no_upstream_address_or_body_reaches_a_client(caplog: pytest.LogCaptureFixture) -> None:
    """Every way an upstream fails — prefill 5xx, decode refused, decode 5xx, an error event
    mid-stream, a 4xx naming a path — the client gets a fixed OpenAI-style message; the log
    has the address and the body, with the request id."""

    async def prefill_500(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json=LEAKY_BODY)

    async def decode_refused(request: httpx.Request) -> httpx.Response:
        if not _decode(request):
            return prefill_reply()
        raise httpx.ConnectError("connect to 127.0.0.1:43779 failed: [Errno 111] Connection refused")

    async def decode_500(request: httpx.Request) -> httpx.Response:
        return prefill_reply() if not _decode(request) else httpx.Response(500, json=LEAKY_BODY)

    async def mid_stream(request: httpx.Request) -> httpx.Response:
        if not _decode(request):
            return prefill_reply()

        async def body():
            yield chunk(" t0", 1)
            yield b"data: " + json.dumps(LEAKY_BODY).encode() + b"\n\n"

        return httpx.Response(200, stream=ByteStream(body()), headers={"content-type": "text/event-stream"})

    async def rejects(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "bad prompt for /models/secret-llama on gpu-17.prod.internal",
                                                   "type": "BadRequestError"}})

    seen: list[tuple[int, str]] = []
    with caplog.at_level(logging.INFO, logger="balanceroute"):
        for handler, stream in ((prefill_500, False), (decode_refused, False), (decode_500, True),
                                (mid_stream, True), (mid_stream, False), (rejects, False)):
            async with mock_proxy(pd_config(max_attempts=2), handler) as (client, proxy):
                resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": stream},
                                         headers={"X-Request-Id": f"case-{len(seen)}"})
                seen.append((resp.status_code, resp.text))
                assert_drained(proxy)
    statuses = [s for s, _ in seen]
    assert statuses == [502, 502, 502, 200, 502, 400], seen
    for status, text in seen:
        assert not _leaks(text), (status, text)
        if status != 200:
            err = json.loads(text)["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["type"]
    assert json.loads(seen[0][1])["error"]["message"] == "prefill failed after 2 attempt(s) (HTTP 500)"
    assert json.loads(seen[2][1])["error"]["code"] == "decode_failed"
    assert '"upstream decode failed mid-stream' in seen[3][1] and seen[3][1].endswith("data: [DONE]\n\n")
    assert "<redacted>" in json.loads(seen[5][1])["error"]["message"]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for k, secret in enumerate(("engine exploded", "127.0.0.1:43779", "engine exploded", "engine exploded",
                                "engine exploded", "secret-llama")):
        lines = [line for line in logged.splitlines() if line.startswith(f"case-{k}-") and secret in line]
        assert lines, (k, secret, logged)


async def test_the_model_list_shows_served_names_only() -> None:
    vllm_models = {"object": "list", "data": [{
        "id": "llama-3-8b", "object": "model", "created": 1700000000, "owned_by": "vllm",
        "root": "/models/secret-llama", "parent": None, "max_model_len": 8192,
        "permission": [{"id": "modelperm-1", "organization": "*"}]}]}

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=vllm_models)

    async with mock_proxy(pd_config(), handler) as (client, _):
        resp = await client.get("/v1/models")
    assert resp.status_code == 200
    assert resp.json() == {"object": "list", "data": [
        {"id": "llama-3-8b", "object": "model", "created": 1700000000, "owned_by": "vllm"}]}
    assert "secret" not in resp.text and "root" not in resp.text


async def test_one_access_line_per_request_with_the_clients_request_id(caplog: pytest.LogCaptureFixture) -> None:
    upstream_ids: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        upstream_ids.append(request.headers["x-request-id"])
        if not _decode(request):
            return prefill_reply(prompt=7)
        return httpx.Response(200, content=b"".join(sse_stream(4, prompt=7)),
                              headers={"content-type": "text/event-stream"})

    with caplog.at_level(logging.INFO, logger="balanceroute.access"):
        async with mock_proxy(pd_config(), handler) as (client, proxy):
            ok = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4, "stream": True},
                                   headers={"X-Request-Id": "job 42/<b>\"x\""})
            mine = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
            bad = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": -1},
                                    headers={"X-Request-Id": "bad-1"})
            assert_drained(proxy)
    assert ok.status_code == 200 and mine.status_code == 200 and bad.status_code == 400
    assert ok.headers["x-request-id"] == "job42/bx" and bad.headers["x-request-id"] == "bad-1"
    assert mine.headers["x-request-id"].startswith("br-")
    # upstream: the client's id with a unique suffix, the same on prefill and decode
    assert upstream_ids[0] == upstream_ids[1] and upstream_ids[0].startswith("job42/bx-")
    lines = [r for r in caplog.records if r.name == "balanceroute.access"]
    assert [r.levelname for r in lines] == ["INFO"] * 3
    first, second, third = (r.access for r in lines)  # type: ignore[attr-defined]
    assert first["request_id"] == "job42/bx" and first["upstream_id"] == upstream_ids[0]
    assert first["endpoint"] == "completions" and first["stream"] is True and first["outcome"] == "ok"
    assert first["status"] == 200 and first["replica"] in (0, 1) and first["prompt_tokens"] == 7
    assert first["output_tokens"] == 4 and first["pool_wait_s"] >= 0 and 0 < first["ttft_s"] <= first["duration_s"]
    assert second["request_id"] == mine.headers["x-request-id"] and second["upstream_id"] is None
    assert third["request_id"] == "bad-1" and third["status"] == 400 and third["outcome"] == "bad_request"
    text = lines[0].getMessage()
    assert text.startswith("request_id=job42/bx endpoint=completions stream=true status=200 outcome=ok replica=")
    assert " prompt_tokens=7 output_tokens=4 pool_wait_s=" in text and " ttft_s=" in text


def test_request_ids_are_sanitised() -> None:
    assert client_request_id("abc\r\nSet-Cookie: x") == "abcSet-Cookie:x"
    assert client_request_id("é ☃") is None and client_request_id(None) is None
    assert client_request_id("a" * 500) == "a" * 128
    assert client_request_id("trace-1:span/2@x.y+z=~_") == "trace-1:span/2@x.y+z=~_"


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, {n: logging.getLogger(n).level for n in ("httpx", "httpcore")})
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in saved[0]:
        root.addHandler(h)
    root.setLevel(saved[1])
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


def test_json_logs_are_one_object_per_line_and_the_http_client_stays_quiet(restore_logging, monkeypatch) -> None:
    monkeypatch.delenv("BALANCEROUTE_LOG_UPSTREAM", raising=False)
    out = io.StringIO()
    configure_logging("debug", "json", stream=out)
    log_access(request_id="r-1", endpoint="chat", stream=False, status=200, outcome="ok", replica=3,
               prompt_tokens=10, output_tokens=5, pool_wait_s=0.0123456, ttft_s=0.2, duration_s=0.5)
    logging.getLogger("httpx").debug("HTTP Request: GET http://d0:8000/health")  # noise
    logging.getLogger("httpcore.connection").debug("connect_tcp.started")  # noise
    logging.getLogger("balanceroute.serving.proxy").warning("two\nlines")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("balanceroute.serving.proxy").exception("failed")
    lines = out.getvalue().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 3, lines
    access = records[0]
    assert access["logger"] == "balanceroute.access" and access["level"] == "info"
    assert access["request_id"] == "r-1" and access["replica"] == 3 and access["pool_wait_s"] == 0.0123
    assert access["ts"].endswith("Z") and access["upstream_id"] is None
    assert records[1]["message"] == "two\nlines" and "RuntimeError: boom" in records[2]["exc"]

    out = io.StringIO()
    configure_logging("debug", "text", upstream_debug=True, stream=out)
    logging.getLogger("httpx").debug("HTTP Request: GET http://d0:8000/health")
    assert "HTTP Request" in out.getvalue()
    monkeypatch.setenv("BALANCEROUTE_LOG_UPSTREAM", "1")
    configure_logging("info", "text", stream=out)
    assert logging.getLogger("httpx").level == logging.NOTSET


def _serve_args(*argv: str):
    return build_parser().parse_args(["serve", "--kv-dialect", "none", "--decode", "http://a:1", *argv])


def test_the_client_key_comes_from_a_file_or_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    key = tmp_path / "client.key"
    key.write_text("s3cret-from-file\n")
    key.chmod(0o600)
    args = _serve_args("--api-key-file", str(key))
    assert serve_config(args).client_key() == "s3cret-from-file" and secret_warnings(args) == []
    monkeypatch.setenv(API_KEY_ENV, "s3cret-from-env")
    args = _serve_args()
    assert serve_config(args).client_key() == "s3cret-from-env" and secret_warnings(args) == []
    args = _serve_args("--api-key", "on-the-command-line")
    config = serve_config(args)
    assert config.client_key() == "on-the-command-line"
    assert "--api-key-file" in secret_warnings(args)[0] and "on-the-command-line" not in repr(config)
    key.chmod(0o644)
    assert "open to every user" in secret_warnings(_serve_args("--api-key-file", str(key)))[0]
    key.chmod(0o640)  # a group (Kubernetes' fsGroup) may read it
    assert secret_warnings(_serve_args("--api-key-file", str(key))) == []


async def test_a_key_file_guards_the_api(tmp_path) -> None:
    key = tmp_path / "client.key"
    key.write_text("k-123\n")

    async def handler(request: httpx.Request) -> httpx.Response:
        if not _decode(request):
            return prefill_reply()
        return httpx.Response(200, content=b"".join(sse_stream(2)), headers={"content-type": "text/event-stream"})

    async with mock_proxy(pd_config(client_api_key_file=str(key)), handler) as (client, proxy):
        denied = await client.post("/v1/completions", json={"prompt": "x"})
        allowed = await client.post("/v1/completions", json={"prompt": "x"}, headers={"Authorization": "Bearer k-123"})
        assert_drained(proxy)
    assert denied.status_code == 401 and allowed.status_code == 200


@pytest.mark.parametrize("toml, argv, message", [
    ('kv_dialect = "none"\n[[decode]]\nurl = "http://a:1"\nslots = "many"\n', [],
     "proxy.toml: decode[0]: slots='many' must be an integer"),
    ('kv_dialect = "none"\nslots = 0\n[[decode]]\nurl = "http://a:1"\n', [], "proxy.toml: slots=0 must be >= 1"),
    ('kv_dialect = "none"\n[[decode]]\nurl = "http://a:1"\n', ["--slots", "0"], "--slots=0 must be >= 1"),
    ('kv_dialect = "none"\n[[decode]]\nurl = "http://a:1"\nslot = 3\n', [], "unknown decode[0] key(s) slot"),
    ('kv_dialect = "none"\nhealth_interval_s = "often"\n[[decode]]\nurl = "http://a:1"\n', [],
     "health_interval_s='often' must be a number"),
    ('kv_dialect = "none"\n[outlier]\nconsecutive_failures = "five"\n[[decode]]\nurl = "http://a:1"\n', [],
     "outlier.consecutive_failures='five' must be an integer"),
    ('kv_dialect = "none"\n[[decode]]\nurl = "http://a:1"\n', ["--kv-lease", "1"], "--kv-lease=1.0 must be >"),
    ('kv_dialect = "none"\n[[decode]]\nurl = "http://a:1"\n', ["--dp-size", "0", "--decode", "http://b:1"],
     "--dp-size=0 must be >= 1"),
    ('kv_dialect = "none"\n[[decode]]\nurl = "http://a:1"\n', ["--api-key-file", "/nonexistent/key"],
     "client_api_key_file /nonexistent/key: cannot read it"),
])
def test_config_errors_are_one_line_naming_the_key_or_flag(tmp_path, capsys, toml, argv, message) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(toml)
    assert main(["serve", "--config", str(path), *argv]) == 2
    assert message in one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize("argv, message", [
    (["serve"], "--config FILE"),
    (["serve", "--prefill", "http://p:1"], "--decode URL"),
    (["serve", "--config", "/"], "--config /: cannot read it"),
])
def test_serve_without_upstreams_points_at_config_and_decode(capsys, argv, message) -> None:
    assert main(argv) == 2
    assert message in one_line_error(capsys.readouterr().err)


def test_redaction_keeps_the_useful_part() -> None:
    assert redact("This model's maximum context length is 2048 tokens. However, you requested 3000 "
                  "tokens (e.g. 1.5x).") == ("This model's maximum context length is 2048 tokens. However, "
                                             "you requested 3000 tokens (e.g. 1.5x).")
    assert redact("see http://10.1.2.3:8000/x, [::1]:80, gpu-1.dc.internal:9, host-a:8000 and /srv/m/x") == (
        "see <redacted> <redacted>, <redacted>, <redacted> and <redacted>")


@pytest.mark.parametrize("http_server", ["native", "uvicorn"])
def test_serve_writes_json_lines_and_keeps_the_key_off_the_command_line(tmp_path, http_server: str) -> None:
    """The real command: every stderr line one JSON object (start-up, access lines, drain),
    the key file's key nowhere in /proc/<pid>/cmdline, the access line with the client's id."""
    key = tmp_path / "client.key"
    key.write_text("k-e2e-secret\n")
    key.chmod(0o600)
    with running_emulator(num_replicas=2, slots=4, num_prefill=1) as emu:
        config = tmp_path / "proxy.json"
        config.write_text(json.dumps({"port": 0, "upstream_api_key_env": None, "health_interval_s": 0.5,
                                      **emu.proxy_mapping("nixl")}))
        proc = subprocess.Popen([sys.executable, "-m", "balanceroute.cli", "serve", "--config", str(config),
                                 "--log-format", "json", "--api-key-file", str(key), "--http-server", http_server],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        lines: list[str] = []
        urls: list[str] = []
        started = threading.Event()

        def pump() -> None:
            for line in proc.stderr:  # type: ignore[union-attr]
                lines.append(line)
                m = re.search(r"balanceroute serve: (http://[0-9.:]+)", line)
                if m:
                    urls.append(m.group(1))
                    started.set()
            started.set()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            assert started.wait(180) and urls, "".join(lines[-20:])
            url = urls[0]
            wait_until(lambda: httpx.get(url + "/health").status_code == 200, timeout=60, what="ready")
            with open(f"/proc/{proc.pid}/cmdline", "rb") as fh:
                assert b"k-e2e-secret" not in fh.read()
            ok = httpx.post(url + "/v1/completions", timeout=60, json={
                "prompt": "a b c", "max_tokens": 4, "ignore_eos": True, "stream": True},
                headers={"Authorization": "Bearer k-e2e-secret", "X-Request-Id": "e2e-1"})
            denied = httpx.post(url + "/v1/completions", timeout=60, json={"prompt": "a"})
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
            reader.join(10)
    assert ok.status_code == 200 and ok.text.endswith("data: [DONE]\n\n") and denied.status_code == 401
    assert code == 0
    records = [json.loads(line) for line in lines]  # raises on any line that is not JSON
    assert len(records) >= 4 and all({"ts", "level", "logger", "message"} <= set(r) for r in records)
    access = [r for r in records if r["logger"] == "balanceroute.access"]
    mine = [r for r in access if r["request_id"] == "e2e-1"]
    assert len(mine) == 1 and mine[0]["outcome"] == "ok" and mine[0]["status"] == 200
    assert mine[0]["replica"] in (0, 1) and mine[0]["output_tokens"] == 4 and mine[0]["ttft_s"] > 0
    assert any(r["status"] == 401 and r["outcome"] == "unauthorized" for r in access)
    assert not any(r["logger"].startswith(("httpx", "httpcore")) for r in records)
    assert "k-e2e-secret" not in "".join(lines)
