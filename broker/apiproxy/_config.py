"""The API proxy's trusted configuration: one JSON file, one codec (spec 15.2, 15.6).

Theory of operation: the trusted harness writes the configuration (engine,
model, model bounds, where to listen, which upstream, where usage records
go); nothing an enclave sends can change any of it. :func:`parse_config`
takes the decoded JSON value and returns a frozen, validated
:class:`ProxyConfig`; :func:`encode_config` is its inverse (the harness's
writer and the tests use it); :func:`load_config` is the thin file shell.
The provider credential is *not* in this file: it is a separate 0400 file
(``credential.py``) so the configuration can be logged and copied freely.

Every error is a :class:`ConfigError` (an operator fault): the proxy
refuses to start.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bounded_query.broker.apiproxy._limits import (
    DEFAULT_RESPONSE_TIMEOUT_S,
    MAX_RESPONSE_TIMEOUT_S,
)
from bounded_query.broker.apiproxy._routes import MODEL_IN_PATH, Route, route_for
from bounded_query.broker.protocol.policy import (
    AGENT_ENGINES,
    AGENT_MODEL_PATTERN,
    DEFAULT_MAX_MODEL_REQUESTS,
    DEFAULT_MAX_MODEL_TOKENS,
    MAX_MODEL_REQUESTS,
    MAX_MODEL_TOKENS,
    MIN_MODEL_REQUESTS,
    MIN_MODEL_TOKENS,
)

__all__ = [
    "CONFIG_VERSION",
    "ConfigError",
    "ProxyConfig",
    "Upstream",
    "encode_config",
    "load_config",
    "parse_config",
    "parse_upstream_url",
]

CONFIG_VERSION = 1
#: A configuration file is small; a larger one is not ours.
MAX_CONFIG_FILE_BYTES = 64 * 1024

#: Model names as providers spell them (``claude-sonnet-4-5``, ``gpt-4o-mini``,
#: ``ft:gpt-4o-mini:org::id``, ``gemini-2.5-flash``); never a ``/``.
_MODEL = re.compile(AGENT_MODEL_PATTERN)
#: A DNS name or IPv4 literal (lower case), or a bracketed IPv6 literal.
_HOST = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?|\[[0-9a-f:.]{2,45}\]")
_BASE_PATH = re.compile(r"(?:/[A-Za-z0-9._~-]+)*")
_CLIENT_HOST = re.compile(
    r"(?:[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?|\[[0-9a-f:.]{2,45}\])(?::[0-9]{1,5})?"
)

_KEYS = frozenset(
    {
        "version",
        "engine",
        "model",
        "maxModelRequests",
        "maxModelTokens",
        "listen",
        "clientHosts",
        "controlSocket",
        "upstream",
        "usageDir",
        "responseTimeout",
    }
)
_LISTEN_KEYS = frozenset({"host", "port"})
_UPSTREAM_KEYS = frozenset({"url", "allowInsecure"})
_DEFAULT_PORTS = {"https": 443, "http": 80}


class ConfigError(ValueError):
    """The proxy's trusted configuration is missing or malformed (operator fault)."""


@dataclass(frozen=True, slots=True)
class Upstream:
    """The provider base URL, parsed: ``scheme://host[:port]base_path``."""

    scheme: str
    host: str
    port: int
    base_path: str

    @property
    def authority(self) -> str:
        """The ``Host`` header value (the port only when it is not the scheme's)."""
        if self.port == _DEFAULT_PORTS[self.scheme]:
            return self.host
        return f"{self.host}:{self.port}"

    def url(self, target: bytes) -> str:
        """The absolute URL of ``target`` (a route's path and query) at this upstream."""
        return f"{self.scheme}://{self.authority}{self.base_path}{target.decode('ascii')}"


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """Validated API-proxy configuration."""

    engine: str
    model: str
    max_model_requests: int
    max_model_tokens: int
    listen_host: str
    listen_port: int
    client_hosts: frozenset[str]
    control_socket: Path
    upstream: Upstream
    allow_insecure: bool
    usage_dir: Path
    response_timeout_s: float

    @property
    def route(self) -> Route:
        """The engine's one allowed model call."""
        return route_for(self.engine)

    @property
    def usage_path(self) -> Path:
        """``usage.jsonl`` under the usage directory."""
        return self.usage_dir / "usage.jsonl"


def _int(obj: Mapping[str, object], key: str, default: int, low: int, high: int) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{key}: expected an integer in [{low}, {high}]")
    return value


def _object(value: object, what: str, keys: frozenset[str]) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise ConfigError(f"{what}: expected an object")
    unknown = sorted(set(value) - keys)
    if unknown:
        raise ConfigError(f"{what}: unknown keys {unknown}")
    return value


def _absolute(value: object, what: str) -> Path:
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value:
        raise ConfigError(f"{what}: expected an absolute path")
    return Path(value)


def parse_upstream_url(url: object, *, allow_insecure: bool) -> Upstream:
    """Parse ``https://HOST[:PORT][/BASEPATH]`` (``http://`` only with ``allow_insecure``).

    No user info, query, fragment, percent-escapes or trailing slash: the
    proxy appends the route's path itself.

    Raises:
        ConfigError: anything else.
    """
    if not isinstance(url, str):
        raise ConfigError("upstream.url: expected a string")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in _DEFAULT_PORTS:
        raise ConfigError("upstream.url: expected https://HOST[:PORT][/BASEPATH]")
    if scheme == "http" and not allow_insecure:
        raise ConfigError("upstream.url: http:// needs upstream.allowInsecure: true")
    slash = rest.find("/")
    authority, base_path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    dots = any(segment in (".", "..") for segment in base_path.split("/"))
    if base_path and (base_path.endswith("/") or dots or not _BASE_PATH.fullmatch(base_path)):
        raise ConfigError("upstream.url: malformed base path")
    host, port = authority, _DEFAULT_PORTS[scheme]
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise ConfigError("upstream.url: malformed host")
        host, tail = authority[: close + 1], authority[close + 1 :]
    else:
        host, colon, tail = authority.partition(":")
        tail = colon + tail
    if tail:
        digits = tail[1:]
        if not tail.startswith(":") or not digits.isascii() or not digits.isdigit():
            raise ConfigError("upstream.url: malformed port")
        if len(digits) > 5 or not 1 <= int(digits) <= 65535:
            raise ConfigError("upstream.url: port out of range")
        port = int(digits)
    if not _HOST.fullmatch(host):
        raise ConfigError("upstream.url: malformed host (lower case, no user info)")
    return Upstream(scheme, host, port, base_path)


def parse_config(obj: object) -> ProxyConfig:
    """Validate a decoded configuration document.

    Raises:
        ConfigError: a missing, unknown or malformed field.
    """
    doc = _object(obj, "config", _KEYS)
    if doc.get("version") != CONFIG_VERSION:
        raise ConfigError(f"version: expected {CONFIG_VERSION}")
    engine = doc.get("engine")
    if engine not in AGENT_ENGINES:
        raise ConfigError(f"engine: expected one of {list(AGENT_ENGINES)}")
    assert isinstance(engine, str)
    model = doc.get("model")
    if not isinstance(model, str) or not _MODEL.fullmatch(model):
        raise ConfigError("model: expected a model name (letters, digits, . _ : -)")
    if route_for(engine).model_field == MODEL_IN_PATH and ":" in model:
        raise ConfigError("model: a model in the request path cannot contain ':'")
    listen = _object(doc.get("listen"), "listen", _LISTEN_KEYS)
    listen_host = listen.get("host")
    if not isinstance(listen_host, str) or not listen_host:
        raise ConfigError("listen.host: expected an address")
    listen_port = _int(listen, "port", -1, 0, 65535)
    hosts = doc.get("clientHosts")
    if (
        not isinstance(hosts, list)
        or not hosts
        or not all(isinstance(h, str) and _CLIENT_HOST.fullmatch(h) for h in hosts)
    ):
        raise ConfigError("clientHosts: expected a non-empty list of host[:port] (lower case)")
    upstream_doc = _object(doc.get("upstream"), "upstream", _UPSTREAM_KEYS)
    insecure = upstream_doc.get("allowInsecure", False)
    if not isinstance(insecure, bool):
        raise ConfigError("upstream.allowInsecure: expected a boolean")
    timeout = doc.get("responseTimeout", DEFAULT_RESPONSE_TIMEOUT_S)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_RESPONSE_TIMEOUT_S
    ):
        raise ConfigError(f"responseTimeout: expected seconds in (0, {MAX_RESPONSE_TIMEOUT_S}]")
    return ProxyConfig(
        engine=engine,
        model=model,
        max_model_requests=_int(
            doc,
            "maxModelRequests",
            DEFAULT_MAX_MODEL_REQUESTS,
            MIN_MODEL_REQUESTS,
            MAX_MODEL_REQUESTS,
        ),
        max_model_tokens=_int(
            doc, "maxModelTokens", DEFAULT_MAX_MODEL_TOKENS, MIN_MODEL_TOKENS, MAX_MODEL_TOKENS
        ),
        listen_host=listen_host,
        listen_port=listen_port,
        client_hosts=frozenset(hosts),
        control_socket=_absolute(doc.get("controlSocket"), "controlSocket"),
        upstream=parse_upstream_url(upstream_doc.get("url"), allow_insecure=insecure),
        allow_insecure=insecure,
        usage_dir=_absolute(doc.get("usageDir"), "usageDir"),
        response_timeout_s=float(timeout),
    )


def encode_config(config: ProxyConfig) -> dict[str, object]:
    """The JSON document :func:`parse_config` turns back into ``config``."""
    up = config.upstream
    return {
        "version": CONFIG_VERSION,
        "engine": config.engine,
        "model": config.model,
        "maxModelRequests": config.max_model_requests,
        "maxModelTokens": config.max_model_tokens,
        "listen": {"host": config.listen_host, "port": config.listen_port},
        "clientHosts": sorted(config.client_hosts),
        "controlSocket": str(config.control_socket),
        "upstream": {
            "url": f"{up.scheme}://{up.host}:{up.port}{up.base_path}",
            "allowInsecure": config.allow_insecure,
        },
        "usageDir": str(config.usage_dir),
        "responseTimeout": config.response_timeout_s,
    }


def load_config(path: Path) -> ProxyConfig:
    """Read and validate the configuration file (blocking).

    Raises:
        ConfigError: unreadable, too large, not JSON, or invalid.
    """
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"config {path}: {exc.strerror}") from None
    if len(raw) > MAX_CONFIG_FILE_BYTES:
        raise ConfigError(f"config {path}: larger than {MAX_CONFIG_FILE_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"config {path}: not JSON ({exc})") from None
    return parse_config(doc)
