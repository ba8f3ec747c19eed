"""The configuration codec, the upstream URL rule and the credential file (operator faults)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bounded_query.broker.apiproxy import ConfigError, encode_config, load_config, parse_config
from bounded_query.broker.apiproxy._config import parse_upstream_url
from bounded_query.broker.apiproxy.credential import (
    CredentialError,
    check_credential,
    read_credential,
)
from bounded_query.broker.protocol.policy import (
    DEFAULT_MAX_MODEL_REQUESTS,
    DEFAULT_MAX_MODEL_TOKENS,
    MAX_MODEL_REQUESTS,
    MAX_MODEL_TOKENS,
)
from tests.apiproxy.helpers import config_doc


def _doc(**overrides):
    return config_doc(Path("/srv/p"), "https://api.anthropic.com", 8080, **overrides)


def test_a_configuration_round_trips_and_defaults_come_from_policy():
    config = parse_config(_doc())
    assert parse_config(encode_config(config)) == config
    doc = _doc()
    del doc["maxModelRequests"], doc["maxModelTokens"]
    config = parse_config(doc)
    assert (config.max_model_requests, config.max_model_tokens) == (
        DEFAULT_MAX_MODEL_REQUESTS,
        DEFAULT_MAX_MODEL_TOKENS,
    )
    assert config.usage_path == Path("/srv/p/usage/usage.jsonl")


@pytest.mark.parametrize(
    "overrides",
    [
        {"version": 2},
        {"engine": "gpt"},
        {"model": ""},
        {"model": "a/b"},
        {"model": "m\n"},
        {"engine": "gemini", "model": "gemini:x"},
        {"maxModelRequests": 0},
        {"maxModelRequests": MAX_MODEL_REQUESTS + 1},
        {"maxModelTokens": MAX_MODEL_TOKENS + 1},
        {"maxModelTokens": True},
        {"listen": {"host": "", "port": 1}},
        {"listen": {"host": "0.0.0.0", "port": 70000}},
        {"listen": {"host": "0.0.0.0", "port": 1, "x": 1}},
        {"clientHosts": []},
        {"clientHosts": ["Upper:1"]},
        {"clientHosts": ["h:1 "]},
        {"controlSocket": "relative.sock"},
        {"usageDir": 3},
        {"responseTimeout": 0},
        {"responseTimeout": 541},
        {"upstream": {"url": "http://api.anthropic.com"}},
        {"upstream": {"url": "https://api.anthropic.com", "allowInsecure": "yes"}},
        {"unknown": 1},
    ],
)
def test_bad_configurations_are_refused(overrides):
    with pytest.raises(ConfigError):
        parse_config(_doc(**overrides))


@pytest.mark.parametrize(
    ("url", "insecure", "authority", "base"),
    [
        ("https://api.anthropic.com", False, "api.anthropic.com", ""),
        ("https://api.example.com:8443/openai", False, "api.example.com:8443", "/openai"),
        ("https://api.example.com:443", False, "api.example.com", ""),
        ("http://127.0.0.1:9000/v", True, "127.0.0.1:9000", "/v"),
        ("https://[::1]:9443", False, "[::1]:9443", ""),
    ],
)
def test_upstream_urls(url, insecure, authority, base):
    upstream = parse_upstream_url(url, allow_insecure=insecure)
    assert (upstream.authority, upstream.base_path) == (authority, base)
    assert upstream.url(b"/v1/messages?beta=true").endswith(f"{base}/v1/messages?beta=true")


@pytest.mark.parametrize(
    "url",
    [
        "ftp://x",
        "https://user:pw@api.example.com",
        "https://api.example.com/",
        "https://api.example.com/a/../b",
        "https://api.example.com/%2e",
        "https://api.example.com?x=1",
        "https://api.example.com#f",
        "https://API.example.com",
        "https://api.example.com:0",
        "https://api.example.com:99999",
        "https://api.example.com:x",
        "https://[::1",
        "https://",
        "http://127.0.0.1",
    ],
)
def test_bad_upstream_urls(url):
    with pytest.raises(ConfigError):
        parse_upstream_url(url, allow_insecure=False)


def test_load_config_reads_a_file(tmp_path):
    path = tmp_path / "proxy.json"
    path.write_text(json.dumps(_doc()))
    assert load_config(path).engine == "claude"
    path.write_text("{")
    with pytest.raises(ConfigError, match="not JSON"):
        load_config(path)
    with pytest.raises(ConfigError):
        load_config(tmp_path / "missing.json")


def _credential_file(tmp_path, content: bytes, mode: int) -> Path:
    path = tmp_path / "key"
    path.write_bytes(content)
    os.chmod(path, mode)
    return path


def test_a_0400_credential_file_is_read_once_with_its_newline_removed(tmp_path):
    assert read_credential(_credential_file(tmp_path, b"sk-abc\n", 0o400)) == b"sk-abc"
    assert read_credential(_credential_file(tmp_path, b"sk-abc\r\n", 0o600)) == b"sk-abc"


@pytest.mark.parametrize("mode", [0o404, 0o440, 0o644, 0o606, 0o420])
def test_a_credential_file_others_can_read_is_refused(tmp_path, mode):
    with pytest.raises(CredentialError, match="mode") as raised:
        read_credential(_credential_file(tmp_path, b"sk-secret-value", mode))
    assert "sk-secret-value" not in str(raised.value)


def test_a_credential_symlink_or_directory_is_refused(tmp_path):
    real = _credential_file(tmp_path, b"sk-abc", 0o400)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(CredentialError):
        read_credential(link)
    with pytest.raises(CredentialError, match="regular"):
        read_credential(tmp_path)


@pytest.mark.parametrize("raw", [b"", b"\n", b"sk abc", b"sk-\x00", b"sk-\xc3\xa9", b"a" * 4097])
def test_credential_content_must_fit_a_header_unchanged(raw):
    with pytest.raises(CredentialError):
        check_credential(raw)
