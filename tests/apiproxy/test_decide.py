"""The pure request decision: every route's rules, and properties over arbitrary input."""

from __future__ import annotations

import hmac
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bounded_query.broker.apiproxy import (
    ROUTES,
    Armed,
    Disarmed,
    Forward,
    Refuse,
    RequestHead,
    decide,
    encode_json,
    parse_config,
)
from bounded_query.broker.apiproxy._limits import MAX_REQUEST_BYTES
from bounded_query.broker.protocol import strict_parse_json
from tests.apiproxy.helpers import CREDENTIAL, config_doc

PORT = 8080
PH = "P" * 43
INVOCATION = "e" * 32
MODELS = {"claude": "claude-x", "copilot": "gpt-x", "codex": "gpt-5-x", "gemini": "gemini-x"}


def _config(engine: str = "claude", **overrides):
    doc = config_doc(
        Path("/tmp/none"),
        "https://api.example.com",
        PORT,
        engine=engine,
        model=MODELS[engine],
        maxModelTokens=1000,
        **overrides,
    )
    return parse_config(doc)


ARMED = Armed(INVOCATION, PH, 0, 3, frozenset())


def _head(engine: str, *, target: bytes | None = None, credential: bytes | None = None, extra=()):
    route = ROUTES[engine]
    if target is None:
        target = route.path_for(MODELS[engine])
        query = sorted(q for q in route.queries if q is not None)
        if query and None not in route.queries:
            target += b"?" + query[0]
    if credential is None:
        credential = (b"Bearer " if route.credential_form == "bearer" else b"") + PH.encode()
    headers = [(b"Host", f"127.0.0.1:{PORT}".encode()), (route.credential_header, credential)]
    return RequestHead(b"POST", target, b"1.1", (*headers, *extra))


def _body(engine: str, **fields) -> bytes:
    doc: dict = {"model": MODELS[engine]} if engine != "gemini" else {}
    doc.update(fields)
    return json.dumps(doc).encode()


def _decide(engine, body, state=ARMED, **head):
    return decide(_head(engine, **head), body, state, _config(engine), CREDENTIAL)


@pytest.mark.parametrize("engine", sorted(ROUTES))
def test_each_route_forwards_its_own_call_with_the_real_credential(engine):
    result = _decide(engine, _body(engine))
    assert isinstance(result, Forward)
    headers = dict(result.headers)
    route = ROUTES[engine]
    expected = (b"Bearer " if route.credential_form == "bearer" else b"") + CREDENTIAL
    assert headers[route.credential_header] == expected
    assert headers[b"host"] == b"api.example.com"
    assert PH.encode() not in b"".join(v for _, v in result.headers) + result.body
    # The missing token field was added at the bound.
    doc: Any = strict_parse_json(result.body, max_bytes=1 << 20)
    node = doc
    *parents, last = route.max_tokens_fields[0].split(".")
    for name in parents:
        node = node[name]
    assert node[last] == 1000


def test_gemini_model_in_path_is_pinned():
    other = b"/v1beta/models/gemini-pro-expensive:streamGenerateContent?alt=sse"
    assert _decide("gemini", _body("gemini"), target=other) == Refuse(403, "model")
    no_sse = b"/v1beta/models/gemini-x:streamGenerateContent"
    assert _decide("gemini", _body("gemini"), target=no_sse) == Refuse(404, "query")
    nested = b"/v1beta/models/a/b:streamGenerateContent?alt=sse"
    assert _decide("gemini", _body("gemini"), target=nested) == Refuse(404, "path")


def test_gemini_hosted_tools_are_stripped_and_candidates_pinned():
    body = _body(
        "gemini",
        tools=[{"functionDeclarations": [{"name": "f"}]}, {"googleSearch": {}}, {"urlContext": {}}],
        generationConfig={"maxOutputTokens": 5000, "candidateCount": 1},
    )
    result = _decide("gemini", body)
    assert isinstance(result, Forward)
    doc = json.loads(result.body)
    assert doc["tools"] == [{"functionDeclarations": [{"name": "f"}]}]
    assert doc["generationConfig"]["maxOutputTokens"] == 1000
    assert (result.clamped, result.tools_stripped, result.requested_tokens) == (True, 2, 5000)
    four = _body("gemini", generationConfig={"candidateCount": 4})
    assert _decide("gemini", four) == Refuse(400, "choices")
    assert _decide("gemini", _body("gemini", cachedContent="c/1")) == Refuse(400, "provider-state")
    shape = _body("gemini", generationConfig=[1])
    assert _decide("gemini", shape) == Refuse(400, "body-shape")


def test_codex_responses_cannot_reach_stored_provider_state():
    for field, value in (
        ("previous_response_id", "resp_1"),
        ("conversation", "conv_1"),
        ("prompt", {"id": "pmpt_1"}),
        ("store", True),
        ("background", True),
    ):
        assert _decide("codex", _body("codex", **{field: value})) == Refuse(400, "provider-state")
    result = _decide(
        "codex",
        _body("codex", tools=[{"type": "function", "name": "shell"}, {"type": "web_search"}]),
    )
    assert isinstance(result, Forward)
    doc = json.loads(result.body)
    assert (doc["store"], doc["background"]) == (False, False)
    assert doc["tools"] == [{"type": "function", "name": "shell"}]
    forced = _body("codex", tool_choice={"type": "web_search_preview"})
    assert _decide("codex", forced) == Refuse(400, "tool-choice")


def test_copilot_clamps_both_token_fields_and_refuses_several_choices():
    body = _body("copilot", max_tokens=5, max_completion_tokens=99999, n=1)
    result = _decide("copilot", body)
    assert isinstance(result, Forward)
    doc = json.loads(result.body)
    assert (doc["max_tokens"], doc["max_completion_tokens"]) == (5, 1000)
    assert result.requested_tokens == 99999
    assert _decide("copilot", _body("copilot", n=2)) == Refuse(400, "choices")
    assert _decide("copilot", _body("copilot", n=True)) == Refuse(400, "choices")
    assert _decide("copilot", _body("copilot", tool_choice=3)) == Refuse(400, "tool-choice")
    stripped = _decide("copilot", _body("copilot", web_search_options={}))
    assert isinstance(stripped, Forward)
    assert "web_search_options" not in json.loads(stripped.body)
    raw = _head("copilot", credential=PH.encode())  # the placeholder without "Bearer "
    assert decide(raw, _body("copilot"), ARMED, _config("copilot"), CREDENTIAL) == Refuse(
        401, "wrong-credential"
    )


def test_the_body_is_re_serialized_exactly_as_checked():
    body = (
        b'{"model":"claude-x","max_tokens":10,"temperature":0.70,"top_k":1e1,'
        b'"messages":[{"role":"user","content":"\\u00e9\\n\\"x\\" \xe2\x82\xac"}],'
        b'"big":123456789012345678901234567890}'
    )
    result = _decide("claude", body)
    assert isinstance(result, Forward)
    assert result.body == (
        b'{"model":"claude-x","max_tokens":10,"temperature":0.70,"top_k":1e1,'
        b'"messages":[{"role":"user","content":"\xc3\xa9\\n\\"x\\" \xe2\x82\xac"}],'
        b'"big":123456789012345678901234567890}'
    )


def test_the_placeholder_compare_is_constant_time(monkeypatch):
    calls = []
    real = hmac.compare_digest

    def recording(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    wrong = b"Q" + PH.encode()[1:]
    assert _decide("claude", _body("claude"), credential=wrong) == Refuse(401, "wrong-credential")
    assert calls == [(wrong, PH.encode())]


def test_a_disarmed_proxy_refuses_before_looking_at_the_credential():
    assert _decide("claude", _body("claude"), state=Disarmed()) == Refuse(403, "disarmed")


def test_an_exhausted_invocation_refuses():
    spent = Armed(INVOCATION, PH, 3, 3, frozenset())
    assert _decide("claude", _body("claude"), state=spent) == Refuse(403, "request-cap")


def test_an_oversize_body_is_refused_without_parsing():
    body = b" " * (MAX_REQUEST_BYTES + 1)
    assert _decide("claude", body) == Refuse(413, "body-too-large")


def test_an_overlong_forwarded_header_is_refused():
    extra = ((b"anthropic-beta", b"x" * 2000),)
    assert _decide("claude", _body("claude"), extra=extra) == Refuse(400, "header-too-large")
    twice = ((b"anthropic-beta", b"a"), (b"Anthropic-Beta", b"b"))
    assert _decide("claude", _body("claude"), extra=twice) == Refuse(400, "duplicate-header")


# --- properties --------------------------------------------------------------------------

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
_fields = st.dictionaries(
    st.sampled_from(
        ["max_tokens", "tools", "tool_choice", "mcp_servers", "stream", "system", "metadata", "x"]
    ),
    _json,
)


@settings(max_examples=150, deadline=None)
@given(fields=_fields)
def test_whatever_is_forwarded_respects_every_bound(fields):
    body = json.dumps({"model": "claude-x", **fields}).encode()
    result = _decide("claude", body)
    if isinstance(result, Refuse):
        assert 400 <= result.status <= 499
        return
    doc: Any = strict_parse_json(result.body, max_bytes=1 << 22, max_depth=64)
    assert doc["model"] == "claude-x"
    assert isinstance(doc["max_tokens"], int)
    assert 1 <= doc["max_tokens"] <= 1000
    assert "mcp_servers" not in doc
    for tool in doc.get("tools", []):
        assert tool.get("type", "") in ("", "custom")
    values = [v for n, v in result.headers if n == b"x-api-key"]
    assert values == [CREDENTIAL]


@settings(max_examples=150, deadline=None)
@given(sent=st.binary(max_size=80))
def test_no_credential_other_than_the_placeholder_is_ever_forwarded(sent):
    result = _decide("claude", _body("claude"), credential=sent)
    assert isinstance(result, Forward) is (sent == PH.encode())


@settings(max_examples=150, deadline=None)
@given(
    method=st.sampled_from([b"POST", b"GET", b"CONNECT", b"OPTIONS", b"post"]),
    target=st.binary(max_size=40).map(lambda b: b"/v1/messages" + b if b[:1] != b"?" else b),
    headers=st.lists(st.tuples(st.binary(min_size=1, max_size=12), st.binary(max_size=20))),
    body=st.binary(max_size=200),
)
def test_decide_never_raises_and_forwards_only_the_route(method, target, headers, body):
    head = RequestHead(method, target, b"1.1", tuple(headers))
    result = decide(head, body, ARMED, _config(), CREDENTIAL)
    assert isinstance(result, Forward | Refuse)
    if isinstance(result, Forward):
        assert method == b"POST"
        assert target in (b"/v1/messages", b"/v1/messages?beta=true")


@settings(max_examples=200, deadline=None)
@given(value=_json)
def test_encode_json_round_trips_through_the_strict_parser(value):
    raw = json.dumps(value).encode()
    parsed = strict_parse_json(raw, max_bytes=1 << 20, max_depth=64)
    assert strict_parse_json(encode_json(parsed), max_bytes=1 << 20, max_depth=64) == parsed
