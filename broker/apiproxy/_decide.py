"""The request decision: forward a rewritten request, or refuse it (spec 15.2, 15.6, 15.10).

Theory of operation: :func:`decide` is a pure function of the request as
received (head and body), the arming state, the configuration and the real
credential. It returns :class:`Forward` (exactly what goes upstream) or
:class:`Refuse` (a 4xx status and a category for the usage record; the
client only ever sees one fixed body per status). Nothing reaches the
upstream unless every check passes. The checks, cheapest and least
informative first:

1. **Request form**: the origin form (``/path``), never an absolute URL,
   an authority (CONNECT) or ``*``; HTTP/1.1; exactly one ``Host``, one of
   the configured names the enclave reaches the proxy by.
2. **Forbidden headers**: ``Proxy-Authorization``, ``Forwarded``, ``Via``,
   ``X-Forwarded-*``, method overrides and the like are refused, not
   dropped: they are an attempt to steer a proxy.
3. **Route**: the engine's one (method, path, query), byte for byte. No
   decoding and no normalization: ``/v1/./messages``, ``/v1/%6Dessages``,
   ``//v1/messages`` are simply other paths.
4. **Credential**: refused while disarmed; else the route's credential
   header must appear once and carry the placeholder, compared with
   :func:`hmac.compare_digest` (constant time in the placeholder's content).
   A placeholder of an earlier invocation is just a wrong one.
5. **Request count**: ``maxModelRequests`` forwarded per invocation.
6. **Body**: strict JSON (the protocol's parser: duplicate keys, NaN,
   invalid UTF-8 and lone surrogates refused), an object, at most
   :data:`MAX_REQUEST_BYTES`.
7. **Model pin**: the configured model, exactly. Another model is refused,
   not rewritten: an engine that asks for another model is misconfigured,
   and a silent rewrite would hide that (and change what it gets back).
8. **Token clamp**: each completion-token field present must be a positive
   integer and becomes ``min(value, maxModelTokens)``; without one, the
   route's first field is added with ``maxModelTokens``. A choice count
   other than 1 is refused (it multiplies the bound).
9. **Provider state**: fields that name stored provider state are refused;
   store flags must be false and are set to false when absent.
10. **Hosted tools** (web search, URL fetch, code execution, MCP connectors)
    run at the provider, so they reach the internet around the enclave's
    network: they are **stripped** from the tool list, not refused, because
    engines add some by default and still work without them (a refusal
    would end the invocation for no gain). A ``tool_choice`` that forces a
    hosted kind is refused.

The forwarded body is the canonical re-serialization of the parsed value
(so the provider parses exactly what we checked: no parser differential),
the forwarded headers are the route's allow-list (everything else, hop-by-hop
headers and the placeholder included, is dropped), plus the real credential
in the route's form, the upstream ``Host``, ``Content-Type`` and
``Accept-Encoding: identity``.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

from bounded_query.broker.apiproxy._arming import Armed, ArmingState
from bounded_query.broker.apiproxy._config import ProxyConfig
from bounded_query.broker.apiproxy._limits import (
    MAX_BODY_DEPTH,
    MAX_FORWARDED_HEADER_BYTES,
    MAX_REQUEST_BYTES,
)
from bounded_query.broker.apiproxy._routes import CREDENTIAL_BEARER, MODEL_IN_PATH, Route
from bounded_query.broker.protocol import JSONError, NumberToken, json_string, strict_parse_json

__all__ = [
    "FORBIDDEN_HEADERS",
    "FORBIDDEN_HEADER_PREFIXES",
    "Forward",
    "Refuse",
    "RequestHead",
    "decide",
    "encode_json",
]

#: Headers that try to steer a proxy or smuggle identity: refused outright.
FORBIDDEN_HEADERS = frozenset(
    {
        b"proxy-authorization",
        b"proxy-authenticate",
        b"proxy-connection",
        b"forwarded",
        b"via",
        b"x-real-ip",
        b"x-client-ip",
        b"true-client-ip",
        b"x-original-url",
        b"x-rewrite-url",
        b"x-http-method-override",
        b"x-http-method",
        b"x-method-override",
    }
)
#: Header name prefixes refused the same way.
FORBIDDEN_HEADER_PREFIXES = (b"x-forwarded-", b"proxy-")

_BEARER = b"Bearer "


@dataclass(frozen=True, slots=True)
class RequestHead:
    """A request head as received (header names in any case, values as sent)."""

    method: bytes
    target: bytes
    http_version: bytes
    headers: tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True, slots=True)
class Forward:
    """Send exactly this upstream (``target``: the route's path and query)."""

    target: bytes
    headers: tuple[tuple[bytes, bytes], ...] = field(repr=False)
    body: bytes = field(repr=False)
    requested_tokens: int | None
    clamped: bool
    tools_stripped: int


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer ``status`` (a 4xx) with the fixed body; ``category`` is for the operator."""

    status: int
    category: str

    def __post_init__(self) -> None:
        if not 400 <= self.status <= 499:
            raise ValueError("a refusal is a 4xx")


Decision = Forward | Refuse


class _Refused(Exception):
    def __init__(self, status: int, category: str) -> None:
        super().__init__(category)
        self.refusal = Refuse(status, category)


def encode_json(value: object) -> bytes:
    """Serialize a value of :func:`strict_parse_json` back to compact JSON bytes.

    Number tokens keep their text; strings use the protocol's one escaping.
    """
    parts: list[str] = []
    _emit(value, parts)
    return "".join(parts).encode("utf-8")


def _emit(value: object, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, str):
        out.append(json_string(value))
    elif isinstance(value, NumberToken):
        out.append(value.text)
    elif isinstance(value, list):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _emit(item, out)
        out.append("]")
    elif isinstance(value, dict):
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            if i:
                out.append(",")
            out.append(json_string(key))
            out.append(":")
            _emit(item, out)
        out.append("}")
    else:  # pragma: no cover - strict_parse_json builds nothing else
        raise TypeError(f"not a JSON value: {type(value).__name__}")


def _check_form(head: RequestHead, config: ProxyConfig) -> dict[bytes, list[bytes]]:
    """Steps 1-2; returns the headers by lowercased name."""
    if not head.target.startswith(b"/") or head.method == b"CONNECT":
        raise _Refused(400, "target-form")
    if head.http_version != b"1.1":
        raise _Refused(400, "http-version")
    by_name: dict[bytes, list[bytes]] = {}
    for name, value in head.headers:
        by_name.setdefault(name.lower(), []).append(value)
    for name in by_name:
        if name in FORBIDDEN_HEADERS or name.startswith(FORBIDDEN_HEADER_PREFIXES):
            raise _Refused(400, "forbidden-header")
    hosts = by_name.get(b"host", [])
    if len(hosts) != 1:
        raise _Refused(400, "host")
    try:
        host = hosts[0].decode("ascii").lower()
    except UnicodeDecodeError:
        raise _Refused(400, "host") from None
    if host not in config.client_hosts:
        raise _Refused(421, "host")
    return by_name


def _check_route(head: RequestHead, route: Route, model: str) -> None:
    """Step 3."""
    path, qmark, query = head.target.partition(b"?")
    expected = route.path_for(model)
    if path != expected:
        if route.model_field == MODEL_IN_PATH:
            prefix, _, suffix = route.path.partition(b"{model}")
            inner = path[len(prefix) : len(path) - len(suffix)]
            if (
                path.startswith(prefix)
                and path.endswith(suffix)
                and len(path) > len(prefix) + len(suffix)
                and b"/" not in inner
            ):
                raise _Refused(403, "model")
        raise _Refused(404, "path")
    if (query if qmark else None) not in route.queries:
        raise _Refused(404, "query")
    if head.method != route.method:
        raise _Refused(405, "method")


def _check_credential(by_name: dict[bytes, list[bytes]], route: Route, state: ArmingState) -> Armed:
    """Steps 4-5."""
    if not isinstance(state, Armed):
        raise _Refused(403, "disarmed")
    values = by_name.get(route.credential_header, [])
    if not values:
        raise _Refused(401, "no-credential")
    if len(values) > 1:
        raise _Refused(400, "duplicate-credential")
    sent = values[0]
    if route.credential_form == CREDENTIAL_BEARER:
        if not sent.startswith(_BEARER):
            raise _Refused(401, "wrong-credential")
        sent = sent[len(_BEARER) :]
    if not hmac.compare_digest(sent, state.placeholder.encode("ascii")):
        raise _Refused(401, "wrong-credential")
    if state.used >= state.max_requests:
        raise _Refused(403, "request-cap")
    return state


def _parent(body: dict[str, object], dotted: str, create: bool) -> tuple[dict[str, object], str]:
    """The object holding the last segment of ``dotted`` (created when asked)."""
    *parents, last = dotted.split(".")
    node = body
    for name in parents:
        child = node.get(name)
        if child is None and create:
            child = {}
            node[name] = child
        if not isinstance(child, dict):
            if child is None:
                return {}, last
            raise _Refused(400, "body-shape")
        node = child
    return node, last


def _clamp_tokens(body: dict[str, object], route: Route, limit: int) -> tuple[int | None, bool]:
    """Step 8 (tokens): the largest requested value and whether any was lowered."""
    requested: int | None = None
    clamped = False
    present = False
    for dotted in route.max_tokens_fields:
        node, last = _parent(body, dotted, create=False)
        if last not in node:
            continue
        present = True
        value = node[last]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _Refused(400, "max-tokens")
        requested = value if requested is None else max(requested, value)
        if value > limit:
            node[last] = limit
            clamped = True
    if not present:
        node, last = _parent(body, route.max_tokens_fields[0], create=True)
        node[last] = limit
    return requested, clamped


def _check_fields(body: dict[str, object], route: Route) -> None:
    """Steps 8 (choices) and 9."""
    if route.choices_field is not None:
        node, last = _parent(body, route.choices_field, create=False)
        if last in node:
            count = node[last]
            if isinstance(count, bool) or count != 1:
                raise _Refused(400, "choices")
    for name in route.refused_fields:
        if name in body:
            raise _Refused(400, "provider-state")
    for name in route.pinned_false_fields:
        if body.get(name, False) is not False:
            raise _Refused(400, "provider-state")
        body[name] = False


def _strip_tools(body: dict[str, object], route: Route) -> int:
    """Step 10: drop hosted tools (and stripped fields); return how many were dropped."""
    stripped = 0
    for name in route.stripped_fields:
        if name in body:
            del body[name]
            stripped += 1
    if route.tools_field in body:
        tools = body[route.tools_field]
        if not isinstance(tools, list):
            raise _Refused(400, "tools")
        kept: list[object] = []
        for tool in tools:
            if not isinstance(tool, dict):
                raise _Refused(400, "tools")
            if route.tool_kind_key is None:
                kind = next(iter(tool)) if len(tool) == 1 else None
            else:
                raw = tool.get(route.tool_kind_key, "")
                kind = raw if isinstance(raw, str) else None
            if kind in route.client_tool_kinds:
                kept.append(tool)
            else:
                stripped += 1
        if kept:
            body[route.tools_field] = kept
        else:
            del body[route.tools_field]
    if route.tool_choice_field is not None and route.tool_choice_field in body:
        choice = body[route.tool_choice_field]
        if isinstance(choice, dict):
            kind = choice.get("type")
            if kind not in route.tool_choice_kinds:
                raise _Refused(400, "tool-choice")
        elif isinstance(choice, str):
            if choice not in route.tool_choice_kinds:
                raise _Refused(400, "tool-choice")
        else:
            raise _Refused(400, "tool-choice")
    return stripped


def _forward_headers(
    by_name: dict[bytes, list[bytes]], route: Route, config: ProxyConfig, credential: bytes
) -> tuple[tuple[bytes, bytes], ...]:
    out: list[tuple[bytes, bytes]] = [(b"host", config.upstream.authority.encode("ascii"))]
    for name in sorted(route.forward_headers):
        values = by_name.get(name, [])
        if len(values) > 1:
            raise _Refused(400, "duplicate-header")
        if values:
            if len(values[0]) > MAX_FORWARDED_HEADER_BYTES:
                raise _Refused(400, "header-too-large")
            out.append((name, values[0]))
    out.append((b"content-type", b"application/json"))
    out.append((b"accept-encoding", b"identity"))
    if route.credential_form == CREDENTIAL_BEARER:
        out.append((route.credential_header, _BEARER + credential))
    else:
        out.append((route.credential_header, credential))
    return tuple(out)


def decide(
    head: RequestHead,
    body: bytes,
    state: ArmingState,
    config: ProxyConfig,
    credential: bytes,
) -> Decision:
    """Forward or refuse one request (pure; see the module docstring for the order).

    ``credential`` is the real provider credential (header-safe bytes); it
    appears only in :attr:`Forward.headers`.

    Returns:
        :class:`Forward` with the rewritten target, headers and body, or
        :class:`Refuse` with a 4xx status and a category.
    """
    route = config.route
    try:
        by_name = _check_form(head, config)
        _check_route(head, route, config.model)
        _check_credential(by_name, route, state)
        if len(body) > MAX_REQUEST_BYTES:
            raise _Refused(413, "body-too-large")
        try:
            doc = strict_parse_json(body, max_bytes=MAX_REQUEST_BYTES, max_depth=MAX_BODY_DEPTH)
        except JSONError:
            raise _Refused(400, "json") from None
        if not isinstance(doc, dict):
            raise _Refused(400, "json")
        if route.model_field != MODEL_IN_PATH and doc.get(route.model_field) != config.model:
            raise _Refused(403, "model")
        requested, clamped = _clamp_tokens(doc, route, config.max_model_tokens)
        _check_fields(doc, route)
        stripped = _strip_tools(doc, route)
        headers = _forward_headers(by_name, route, config, credential)
    except _Refused as refused:
        return refused.refusal
    return Forward(
        target=head.target,
        headers=headers,
        body=encode_json(doc),
        requested_tokens=requested,
        clamped=clamped,
        tools_stripped=stripped,
    )
