"""The bounded-agent request frame (spec 15.3; broker/protocol/_agent_request.py).

Every refusal is a RequestError (the caller's fault); the named controls of
15.3 are refused by name, with their own message, even though the
unknown-header rule would refuse them too.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bounded_query.broker.protocol import (
    FORBIDDEN_CONTROL_HEADERS,
    AgentRequest,
    RequestError,
    charge,
    encode_schema_header,
    parse_agent_frame,
    parse_agent_request,
    policy,
)
from tests.protocol.strategies import valid_schema_objs

SCHEMA = b'{"type": "enum", "values": ["yes", "no", "caf\xc3\xa9"]}'
LIMIT = 64

# The message of a named control (the explicit rule, not the generic one).
CONTROL = "trusted control"


def headers(
    *,
    version: bytes = b"1",
    repo: bytes = b"octo/private",
    schema: bytes = SCHEMA,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> list[tuple[bytes, bytes]]:
    return [
        (b"host", b"localhost"),
        (b"X-AWF-Agent-Version", version),
        (b"X-AWF-Repo", repo),
        (b"X-AWF-Schema-B64", encode_schema_header(schema)),
        (b"content-type", b"text/plain"),
        *(extra or []),
    ]


def parse(hdrs: list[tuple[bytes, bytes]], body: bytes = b"Is it?") -> AgentRequest:
    return parse_agent_frame(hdrs, body, max_task_bytes=LIMIT)


def refused(hdrs: list[tuple[bytes, bytes]], body: bytes = b"Is it?") -> str:
    with pytest.raises(RequestError) as caught:
        parse(hdrs, body)
    return str(caught.value)


def test_a_valid_frame_selects_exactly_repo_schema_and_task() -> None:
    task = "Does src/net give up after a timeout?\n\tanswer ✓".encode()
    request = parse_agent_frame(headers(), task, max_task_bytes=len(task))
    assert request.private_repo == "octo/private"
    assert request.task == task.decode()
    # The schema text is exactly what the caller sent (the enclave's schema.json).
    assert request.schema_text.encode() == SCHEMA
    assert charge(request.schema) == 1 + 2 + 3


def test_header_names_match_any_case() -> None:
    hdrs = [(name.upper(), value) for name, value in headers()]
    assert parse(hdrs).private_repo == "octo/private"


@pytest.mark.parametrize("control", FORBIDDEN_CONTROL_HEADERS)
@pytest.mark.parametrize("spelling", [str.lower, str.upper, str.title])
def test_each_named_control_is_refused_by_name(control: str, spelling: object) -> None:
    assert callable(spelling)
    name = spelling(control).encode()
    assert CONTROL in refused(headers(extra=[(name, b"anything")]))
    # Also first, before the accepted headers, and with an empty value.
    assert CONTROL in refused([(name, b""), *headers()])


@pytest.mark.parametrize(
    "name", [b"x-awf-timeout-s", b"x-awf-image-ref", b"x-awf-proxy-url", b"x-awf-network-mode"]
)
def test_variants_of_named_controls_are_refused_by_name(name: bytes) -> None:
    assert CONTROL in refused(headers(extra=[(name, b"1")]))


def test_the_named_controls_cover_the_spec_list() -> None:
    # spec 15.3: image, command, executable, mount, path, environment, endpoint,
    # network, proxy, credential, timeout, resource limit, runtime, tool definition.
    assert FORBIDDEN_CONTROL_HEADERS == (
        "x-awf-image",
        "x-awf-command",
        "x-awf-executable",
        "x-awf-mount",
        "x-awf-path",
        "x-awf-environment",
        "x-awf-endpoint",
        "x-awf-network",
        "x-awf-proxy",
        "x-awf-credential",
        "x-awf-timeout",
        "x-awf-resource-limit",
        "x-awf-runtime",
        "x-awf-tool-definition",
    )
    assert len(policy.AGENT_FORBIDDEN_CONTROLS) == len(FORBIDDEN_CONTROL_HEADERS)


@pytest.mark.parametrize(
    "name",
    [
        b"x-awf-model",
        b"x-awf-query-version",  # a query frame is not an agent frame
        b"x-awf-engine",
        b"x-awf-tools",
        b"x-awf-",
        b"X-Awf-Max-Output-Bytes",
    ],
)
def test_unknown_awf_headers_are_refused(name: bytes) -> None:
    message = refused(headers(extra=[(name, b"2")]))
    assert message == "headers: unknown X-AWF-* header"


def test_other_headers_are_ignored() -> None:
    hdrs = headers(extra=[(b"x-image", b"evil"), (b"authorization", b"Bearer x")])
    assert parse(hdrs).task == "Is it?"


@pytest.mark.parametrize("name", [b"x-awf-agent-version", b"x-awf-repo", b"x-awf-schema-b64"])
def test_duplicates_and_missing_headers_are_refused(name: bytes) -> None:
    hdrs = headers()
    value = next(v for n, v in hdrs if n.lower() == name)
    assert "duplicate" in refused([*hdrs, (name.upper(), value)])
    assert "missing" in refused([(n, v) for n, v in hdrs if n.lower() != name])


@pytest.mark.parametrize("version", [b"2", b"01", b" 1", b"1 ", b"", b"1.0", b"\xff"])
def test_wrong_versions_are_refused(version: bytes) -> None:
    assert "x-awf-agent-version" in refused(headers(version=version))


@pytest.mark.parametrize(
    "repo", [b"", b"octo", b"octo/private\n", b"../etc", b"octo/..", b"\xc3\xa9/r", b"o/r/x"]
)
def test_bad_slugs_are_refused(repo: bytes) -> None:
    assert "x-awf-repo" in refused(headers(repo=repo))


def test_the_task_is_bounded_in_bytes_by_the_run_bound() -> None:
    assert parse(headers(), b"x" * LIMIT).task == "x" * LIMIT
    assert "larger than 64 bytes" in refused(headers(), b"x" * (LIMIT + 1))
    # Counted in UTF-8 bytes, not characters: 22 three-byte characters are 66 bytes.
    assert "larger" in refused(headers(), "✓".encode() * 22)
    assert parse(headers(), "✓".encode() * 21).task == "✓" * 21


def test_an_empty_task_is_refused() -> None:
    assert "empty" in refused(headers(), b"")


@pytest.mark.parametrize(
    "body",
    [b"\xff", b"ok \xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"a\x80b"],
)
def test_a_task_that_is_not_utf8_is_refused(body: bytes) -> None:
    assert "UTF-8" in refused(headers(), body)


@pytest.mark.parametrize(
    "schema",
    [
        b'{"type": "string"}',  # not finite
        b'{"type": "boolean", "type": "enum"}',  # duplicate key
        b'{"type": "boolean"} x',  # trailing garbage
        b"",
        b'{"type": "integer", "minimum": 1.0, "maximum": 2}',
    ],
)
def test_an_invalid_schema_is_refused(schema: bytes) -> None:
    refused(headers(schema=schema))


def test_a_non_canonical_schema_header_is_refused() -> None:
    hdrs = headers()
    padded = [(n, v + b"==" if n == b"X-AWF-Schema-B64" else v) for n, v in hdrs]
    assert "base64url" in refused(padded)


@pytest.mark.parametrize("bound", [0, -1, policy.ENCLAVE_MAX_TASK_BYTES + 1])
def test_an_out_of_range_bound_is_a_local_error(bound: int) -> None:
    with pytest.raises(ValueError, match="max_task_bytes") as caught:
        parse_agent_frame(headers(), b"x", max_task_bytes=bound)
    assert not isinstance(caught.value, RequestError)


def test_every_prefix_of_a_task_is_accepted_or_refused_as_ours() -> None:
    task = "répondre ✓ 😀".encode()
    outcomes = []
    for i in range(len(task) + 1):
        try:
            parse(headers(), task[:i])
        except RequestError:
            outcomes.append(False)
        else:
            outcomes.append(True)
    # Exactly the prefixes that end on a character boundary (and are non-empty).
    boundaries = {len(task[:i].decode(errors="ignore").encode()) for i in range(len(task) + 1)}
    assert outcomes == [i in boundaries and i > 0 for i in range(len(task) + 1)]


@given(schema=valid_schema_objs(), task=st.text(min_size=1, max_size=LIMIT // 4))
def test_valid_frames_round_trip_schema_and_task(schema: object, task: str) -> None:
    raw = json.dumps(schema, ensure_ascii=False).encode()
    try:
        task_bytes = task.encode()
    except UnicodeEncodeError:
        return  # lone surrogates cannot be sent as UTF-8
    if len(raw) > 4096:
        return
    request = parse_agent_frame(headers(schema=raw), task_bytes, max_task_bytes=LIMIT)
    assert request.task == task
    assert request.schema_text.encode() == raw


header_names = st.sampled_from(
    [
        b"x-awf-agent-version",
        b"x-awf-repo",
        b"x-awf-schema-b64",
        b"x-awf-image",
        b"x-awf-query-version",
        b"host",
        b"X-AWF-REPO",
    ]
)


@given(
    hdrs=st.lists(st.tuples(header_names, st.binary(max_size=40)), max_size=6),
    body=st.binary(max_size=80),
)
def test_nothing_but_our_own_error(hdrs: list[tuple[bytes, bytes]], body: bytes) -> None:
    try:
        request = parse(hdrs, body)
    except RequestError:
        return
    # Accepted only as exactly the three headers, once each, and the body verbatim.
    awf = sorted(n.lower() for n, _ in hdrs if n.lower().startswith(b"x-awf-"))
    assert awf == [b"x-awf-agent-version", b"x-awf-repo", b"x-awf-schema-b64"]
    assert request.task.encode() == body


# -- the object form (spec 15.3's table: privateRepo, schema, task) -------------------


def _obj(**extra: object) -> dict[str, object]:
    return {
        "privateRepo": "octo/private",
        "schema": {"type": "enum", "values": ["yes", "no"]},
        "task": "Is it?",
        **extra,
    }


def _obj_refused(obj: object) -> str:
    with pytest.raises(RequestError) as caught:
        parse_agent_request(obj, max_task_bytes=LIMIT)
    return str(caught.value)


def test_the_object_form_builds_the_same_request() -> None:
    request = parse_agent_request(_obj(), max_task_bytes=LIMIT)
    assert request.private_repo == "octo/private"
    assert request.task == "Is it?"
    assert request.schema_text == '{"type":"enum","values":["yes","no"]}'
    wire = parse(headers(schema=request.schema_text.encode()), b"Is it?")
    assert wire == request


@pytest.mark.parametrize("control", policy.AGENT_FORBIDDEN_CONTROLS)
@pytest.mark.parametrize("spelling", [str, str.lower, str.upper])
def test_each_named_control_key_is_refused_by_name(control: str, spelling: object) -> None:
    assert callable(spelling)
    assert CONTROL in _obj_refused(_obj(**{spelling(control): "x"}))


@pytest.mark.parametrize(
    "obj",
    [
        _obj(model="opus"),
        _obj(script="print(1)"),
        {"privateRepo": "octo/private", "task": "x"},
        {k: v for k, v in _obj().items() if k != "task"},
        [],
        "task",
    ],
)
def test_the_object_form_refuses_unknown_and_missing_keys(obj: object) -> None:
    assert CONTROL not in _obj_refused(obj)


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("privateRepo", "octo", "request.privateRepo"),
        ("privateRepo", 7, "request.privateRepo"),
        ("task", "", "request.task"),
        ("task", b"bytes", "request.task"),
        ("task", "x" * (LIMIT + 1), "request.task"),
        ("task", "✓" * 22, "request.task"),
        ("task", "\ud800", "request.task"),
        ("schema", {"type": "string"}, "schema"),
        ("schema", '{"type":"boolean"}', "schema"),
    ],
)
def test_the_object_form_locates_bad_values(field: str, value: object, where: str) -> None:
    assert _obj_refused(_obj(**{field: value})).startswith(where)
