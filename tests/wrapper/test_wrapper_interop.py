"""Byte compatibility with the reference sh + curl wrapper (issue #3 item 7).

The reference wrapper sends its request with ``curl --unix-socket``. Both
clients talk to the same recorded-bytes server for the same inputs; every
header that carries meaning must be identical, and both captures must parse,
through a real h11 server connection, into the same protocol ``Request``.
Finally, whatever canonical body the protocol can produce, the wrapper passes
through unchanged.
"""

from __future__ import annotations

import base64
import shutil
import subprocess

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bounded_query.broker import protocol
from bounded_query.wrapper import bounded_query_cli as wrapper
from tests.wrapper.fakes import (
    ERROR_LINE,
    Reply,
    http_reply,
    recorded_server,
    run_wrapper,
    split_request,
    wrapper_commands,
)

CURL = shutil.which("curl")
needs_curl = pytest.mark.skipif(CURL is None, reason="curl is not installed")

#: Headers whose value the broker reads or that frame the request.
MEANINGFUL = (
    b"host",
    b"x-awf-query-version",
    b"x-awf-repo",
    b"x-awf-schema-b64",
    b"content-length",
)

INPUTS = [
    ("octo/alpha", '{"type":"boolean"}', b"print('yes')\n"),
    (
        "Octo-Org/my.repo_name-2",
        '{"type":"enum","values":["\u00e9t\u00e9","\u20ac>?","~~~"]}',
        "import json\nprint(json.dumps('\u00e9'))\n".encode(),
    ),
    ("a/b", '{"type":"integer","minimum":0,"maximum":9}', b"#" * (64 * 1024)),
]


def curl_request(socket_path: str, repo: str, schema: str, script: bytes) -> None:
    """Send what the reference wrapper sends (its curl invocation, verbatim flags)."""
    b64 = base64.urlsafe_b64encode(schema.encode()).rstrip(b"=").decode()
    assert CURL is not None
    subprocess.run(
        [
            CURL,
            "-sS",
            "--unix-socket",
            socket_path,
            "-X",
            "POST",
            "-H",
            "X-AWF-Query-Version: 2",
            "-H",
            f"X-AWF-Repo: {repo}",
            "-H",
            f"X-AWF-Schema-B64: {b64}",
            "--data-binary",
            "@-",
            "http://localhost/query",
        ],
        input=script,
        capture_output=True,
        timeout=30,
        check=True,
    )


def h11_parse(raw: bytes) -> tuple[h11.Request, bytes]:
    """Parse captured bytes as the broker's h11 server side would."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    request = conn.next_event()
    assert isinstance(request, h11.Request)
    body = b""
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Data):
            body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            return request, body
        else:
            raise AssertionError(f"unexpected h11 event {event!r}")


def meaningful(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(n.lower(), v) for n, v in headers if n.lower() in MEANINGFUL]


@needs_curl
@pytest.mark.parametrize("kind", sorted(wrapper_commands()))
@pytest.mark.parametrize(("repo", "schema", "script"), INPUTS, ids=["ascii", "utf8", "64kib"])
def test_wrapper_sends_what_curl_sends(kind, repo, schema, script):
    reply = Reply([http_reply(b'{"status":"error"}')])
    with recorded_server(reply) as server:
        curl_request(server.path, repo, schema, script)
        outcome = run_wrapper(
            wrapper_commands()[kind],
            ["--repo", repo, "--schema", schema],
            script=script,
            socket_path=server.path,
        )
    assert outcome.stdout == ERROR_LINE
    reference, ours = server.requests
    ref_line, ref_headers, ref_body = split_request(reference)
    our_line, our_headers, our_body = split_request(ours)
    assert our_line == ref_line == b"POST /query HTTP/1.1"
    # Same names (including their case), same values, same relative order.
    assert meaningful(our_headers) == meaningful(ref_headers)
    assert [n for n, _ in our_headers if n.lower().startswith(b"x-awf-")] == [
        b"X-AWF-Query-Version",
        b"X-AWF-Repo",
        b"X-AWF-Schema-B64",
    ]
    assert our_body == ref_body == script
    # No header the reference does not send could change the broker's view:
    # the extra ones are the inert Content-Type and Connection: close.
    ref_names = {n.lower() for n, _ in ref_headers}
    extra = {n.lower() for n, _ in our_headers} - ref_names
    assert extra <= {b"content-type", b"connection"}

    # Both parse, through h11 and the protocol's own framing, to one Request.
    parsed = []
    for raw in (reference, ours):
        request, body = h11_parse(raw)
        assert request.method == b"POST"
        assert request.target == b"/query"
        protocol.check_request_line(request.method, request.target)
        parsed.append(protocol.parse_frame(list(request.headers), body))
    assert parsed[0] == parsed[1]
    assert parsed[0].private_repo == repo
    assert parsed[0].script == script.decode()


def test_schema_encoding_matches_the_protocol():
    for schema in ['{"type":"boolean"}', "\u00e9\u20ac", "~~~", "~~~~", "~~~~~", "x" * 4096]:
        raw = schema.encode()
        assert wrapper.encode_schema(raw) == protocol.encode_schema_header(raw)
        assert protocol.decode_schema_header(wrapper.encode_schema(raw)) == raw


# ---------------------------------------------------------------------------
# Every body the protocol can produce passes the wrapper's canonical check


def _canonical(value: object) -> str:
    """Serialize with the protocol's own string escaping (the broker's output form)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return protocol.json_string(value)
    if isinstance(value, list):
        return "[" + ",".join(_canonical(v) for v in value) + "]"
    assert isinstance(value, dict)
    return (
        "{"
        + ",".join(protocol.json_string(k) + ":" + _canonical(v) for k, v in value.items())
        + "}"
    )


SAFE = 2**53 - 1
values = st.recursive(
    st.none() | st.booleans() | st.integers(-SAFE, SAFE) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(values)
def test_protocol_canonical_bodies_pass_through(value):
    body = protocol.ok_body(_canonical(value))
    assert wrapper.canonical_body(body) == body


@settings(max_examples=300, deadline=None)
@given(values, st.data())
def test_raw_line_breaks_and_tabs_are_refused_anywhere(value, data):
    """Outside strings they are non-canonical whitespace; inside, invalid JSON."""
    body = protocol.ok_body(_canonical(value))
    position = data.draw(st.integers(0, len(body)))
    char = data.draw(st.sampled_from([b"\n", b"\r", b"\t"]))
    mutated = body[:position] + char + body[position:]
    with pytest.raises(ValueError, match=r"."):
        wrapper.canonical_body(mutated)


def test_canonical_error_body_is_the_protocol_constant():
    assert wrapper.CANONICAL_ERROR == protocol.CANONICAL_ERROR_BODY
    assert wrapper.canonical_body(protocol.CANONICAL_ERROR_BODY) == protocol.CANONICAL_ERROR_BODY
