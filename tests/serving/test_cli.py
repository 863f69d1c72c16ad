"""The ``serve``/``emulate``/``loadgen`` subcommands: parsing, user errors, a real loadgen run."""

from __future__ import annotations

import json

import pytest

from balanceroute.cli import build_parser, main
from balanceroute.params import write_params
from balanceroute.serving.cli import serve_config

from .conftest import running_emulator


def one_line_error(err: str) -> str:
    """The message of a user error as ``main`` prints it: exactly one ``balanceroute: error:``
    line on stderr (no traceback, no other output). An unexpected exception would propagate out
    of ``main`` in-process, failing the test by itself."""
    assert err.startswith("balanceroute: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    return err.removeprefix("balanceroute: error: ")


def test_subcommands_are_registered() -> None:
    parser = build_parser()
    args = parser.parse_args(["serve", "--decode", "http://a:1", "--dp-size", "8", "--kv-dialect", "none",
                              "--policy-param", "s_greedy=4", "--policy-param", "name=x"])
    assert args.dp_size == 8 and dict(args.policy_param) == {"s_greedy": 4, "name": "x"}
    args = parser.parse_args(["emulate", "-G", "4", "--slow-replica", "2:3.5", "--kill-replica", "1"])
    assert args.slow_replica == [(2, 3.5)] and args.kill_replica == [1]
    assert parser.parse_args(["loadgen", "--url", "http://x"]).handler.__name__ == "_loadgen"


@pytest.mark.parametrize("argv, message", [
    (["serve", "--decode", "ftp://nope", "--kv-dialect", "none"], "http"),
    (["serve", "--decode", "http://a:1"], "prefill"),
    (["serve", "--kv-dialect", "none", "--decode", "http://a:1", "--policy", "nope"], "unknown policy"),
    (["serve", "--config", "/nonexistent/proxy.toml"], "No such file"),
    (["loadgen", "--url", "http://127.0.0.1:1", "--requests", "0"], "--requests"),
])
def test_user_errors_exit_2_without_traceback(argv, message, capsys) -> None:
    assert main(argv) == 2
    assert message in one_line_error(capsys.readouterr().err)


def test_loadgen_against_the_emulator(capsys) -> None:
    with running_emulator(num_replicas=2, num_prefill=0, layout="dp") as emu:
        code = main(["loadgen", "--url", emu.decode_urls[0], "--requests", "12", "--clip-output", "6",
                     "--clip-prompt", "64", "--concurrency", "4", "--emulator-stats",
                     emu.decode_urls[0] + "/stats", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"] == 12 and out["errors"] == 0
    assert out["completion_tokens"] == out["emulator"]["generated_tokens"] > 0
    assert out["ttft_s_p50"] > 0 and out["emulator"]["steps"] > 0


def test_serve_security_and_slo_flags_parse() -> None:
    args = build_parser().parse_args([
        "serve", "--kv-dialect", "none", "--decode", "http://a:1", "--api-key", "k", "--ttft-slo", "2.5",
        "--admin-token-env", "ADMIN", "--upstream-api-key-env", "UP", "--max-model-len", "4096", "--metrics-urls"])
    assert (args.client_api_key, args.ttft_slo_s, args.upstream_api_key_env) == ("k", "2.5", "UP")  # parsed (seconds or "off") by ProxyConfig
    assert args.max_model_len == 4096 and args.metrics_urls is True
    assert build_parser().parse_args(["emulate", "--poison-word", "BAD"]).poison_word == "BAD"


@pytest.mark.parametrize("argv, message", [
    (["serve", "--kv-dialect", "none", "--decode", "http://a:1", "--ttft-slo", "-1"], "--ttft-slo="),
    (["serve", "--kv-dialect", "none", "--decode", "http://a:1", "--admin-token-env", "BR_UNSET_VAR_X"],
     "--admin-token-env="),
])
def test_bad_serve_security_settings_exit_2(argv, message, capsys) -> None:
    assert main(argv) == 2
    assert message in one_line_error(capsys.readouterr().err)


def test_serve_takes_a_tune_params_file(tmp_path, capsys) -> None:
    path = tmp_path / "brh.json"
    write_params(path, "brh-survival", {"horizon": 40, "gamma": 0.95, "beta": 32.0, "s_greedy": 4},
                 {"command": "tune"})
    base = ["serve", "--kv-dialect", "none", "--decode", "http://a:1", "--params", str(path)]
    config = serve_config(build_parser().parse_args(base))
    # a brh-survival file runs as brh-survival (its forecast learnt from finished requests);
    # --policy-param wins
    assert config.policy == "brh-survival" and dict(config.policy_params) == {
        "horizon": 40, "gamma": 0.95, "beta": 32.0, "s_greedy": 4}
    config = serve_config(build_parser().parse_args([*base, "--policy-param", "s_greedy=8"]))
    assert config.policy_params["s_greedy"] == 8
    assert main([*base, "--policy", "br0"]) == 2
    assert "is for 'brh-survival', but the proxy runs 'br0'" in one_line_error(capsys.readouterr().err)
    # another brh-<predictor> file runs as brh (the proxy cannot fit that predictor)
    write_params(path, "brh-exact", {"horizon": 40}, {"command": "tune"})
    config = serve_config(build_parser().parse_args(base))
    assert config.policy == "brh" and dict(config.policy_params) == {"horizon": 40}
