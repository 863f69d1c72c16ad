"""Config files, request checks, upstream bodies, SSE framing and token estimates."""

from __future__ import annotations

import json

import pytest

from balanceroute.serving.config import ProxyConfig, load_config_file
from balanceroute.serving.protocol import (
    ApiError,
    approx_prompt_tokens,
    decode_body,
    prefill_body,
    validate_request,
    words_prompt_tokens,
)
from balanceroute.serving.proxy import build_policy

TOML = """
kv_dialect = "nixl"
policy = "br0"
slots = 40
[policy_params]
s_greedy = 6
[[prefill]]
url = "http://10.0.0.1:7100"
[[prefill]]
url = "http://10.0.0.2:7100"
[[decode]]
url = "http://10.0.0.3:7100"
dp_size = 4
[[decode]]
url = "http://10.0.0.4:7100"
slots = 8
"""


def test_toml_and_json_config_files(tmp_path) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(TOML)
    config = ProxyConfig.from_mapping(load_config_file(path))
    assert config.num_replicas == 5
    assert [d.dp_rank for d in config.decode] == [0, 1, 2, 3, None]
    assert config.replica_slots() == [40, 40, 40, 40, 8]
    assert config.policy_params == {"s_greedy": 6}
    policy = build_policy(config)
    assert policy.s_greedy == 6 and policy.deadline_s == pytest.approx(25.0)  # lease 30 − margin 5
    jpath = tmp_path / "proxy.json"
    jpath.write_text(json.dumps({"kv_dialect": "none", "decode": ["http://a:1", "http://b:1"]}))
    assert ProxyConfig.from_mapping(load_config_file(jpath)).num_replicas == 2


@pytest.mark.parametrize("mapping, message", [
    ({"decode": []}, "at least one replica"),
    ({"decode": ["http://a:1"]}, "needs at least one prefill"),
    ({"kv_dialect": "none", "decode": ["ftp://a"]}, "http"),
    ({"kv_dialect": "none", "decode": ["http://a:1", "http://a:1"]}, "twice"),
    ({"kv_dialect": "none", "decode": ["http://a:1"], "bogus": 1}, "unknown config key"),
    ({"kv_dialect": "none", "decode": ["http://a:1"], "kv_lease_s": 0}, "kv_lease_s"),
    ({"kv_dialect": "carrier-pigeon", "decode": ["http://a:1"]}, "kv_dialect"),
    ({"kv_dialect": "none", "decode": [{"url": "http://a:1", "dp_size": 0}]}, "dp_size"),
])
def test_bad_configs_are_value_errors(mapping, message) -> None:
    with pytest.raises(ValueError, match=message):
        ProxyConfig.from_mapping(mapping)


def test_unknown_policy_lists_the_valid_ones() -> None:
    config = ProxyConfig.from_mapping({"kv_dialect": "none", "decode": ["http://a:1"], "policy": "nope"})
    with pytest.raises(ValueError, match="br0"):
        build_policy(config)


def test_validate_request_reads_stream_options() -> None:
    req = validate_request({"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}, chat=False)
    assert req.stream and req.include_usage and not req.continuous_usage and req.path == "/v1/completions"
    req = validate_request({"messages": [{"role": "user", "content": "x"}]}, chat=True)
    assert not req.stream and not req.include_usage and req.path == "/v1/chat/completions"
    with pytest.raises(ApiError) as err:
        validate_request({"prompt": ["a", "b"]}, chat=False)
    assert err.value.status == 400 and err.value.body["error"]["param"] == "prompt"


def test_prefill_and_decode_bodies() -> None:
    client = {"model": "m", "prompt": "x", "max_tokens": 9, "stream": True, "min_tokens": 3,
              "stream_options": {"include_usage": False}, "kv_transfer_params": {"evil": 1}}
    pre = prefill_body(client, {"do_remote_decode": True})
    assert pre == {"model": "m", "prompt": "x", "max_tokens": 1, "stream": False,
                   "kv_transfer_params": {"do_remote_decode": True}}
    dec = decode_body(client, {"remote_engine_id": "e"})
    assert dec["kv_transfer_params"] == {"remote_engine_id": "e"} and dec["min_tokens"] == 3
    assert dec["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert "kv_transfer_params" not in decode_body(client, None)
    assert client["max_tokens"] == 9 and client["stream"] is True  # the client's body is untouched


def test_token_estimates() -> None:
    assert words_prompt_tokens({"prompt": "one two  three"}) == 3
    assert words_prompt_tokens({"prompt": [5] * 17}) == 17
    assert words_prompt_tokens({"messages": [{"role": "user", "content": "a b"},
                                             {"role": "system", "content": [{"type": "text", "text": "c"}]}]}) == 3 + 8
    assert approx_prompt_tokens({"prompt": "x" * 40}) == 10
    assert approx_prompt_tokens({"prompt": [[1, 2, 3]]}) == 3
