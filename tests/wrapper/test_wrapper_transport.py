"""The wrapper against a recorded-bytes broker (spec 14.8, issue #3 items 6-7).

Every test runs the wrapper as a real subprocess, both as the file the harness
copies into the agent's wrapper directory and as the installed console
script. The fake server captures the exact request bytes and plays back
canned (often hostile) responses.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import time

import pytest

from tests.wrapper.fakes import (
    DEADLINE_ENV,
    ERROR_LINE,
    Reply,
    http_reply,
    recorded_server,
    run_wrapper,
    split_request,
    wrapper_commands,
)

BOOLEAN = '{"type":"boolean"}'
ARGS = ["--repo", "octo/alpha", "--schema", BOOLEAN]
SHORT_DEADLINE = {DEADLINE_ENV: "0.6"}


@pytest.fixture(params=sorted(wrapper_commands()))
def cmd(request: pytest.FixtureRequest) -> list[str]:
    return wrapper_commands()[request.param]


def assert_error(outcome) -> None:
    assert outcome.stdout == ERROR_LINE
    assert outcome.stderr == b""
    assert outcome.returncode == 0


# ---------------------------------------------------------------------------
# Exact request framing


def test_request_bytes_exact(cmd):
    with recorded_server(Reply([http_reply(b'{"status":"error"}')])) as server:
        outcome = run_wrapper(cmd, ARGS, script=b"print(1)\n", socket_path=server.path)
    assert_error(outcome)
    assert server.requests == [
        b"POST /query HTTP/1.1\r\n"
        b"Host: localhost\r\n"
        b"X-AWF-Query-Version: 2\r\n"
        b"X-AWF-Repo: octo/alpha\r\n"
        b"X-AWF-Schema-B64: eyJ0eXBlIjoiYm9vbGVhbiJ9\r\n"
        b"Content-Type: application/octet-stream\r\n"
        b"Content-Length: 9\r\n"
        b"Connection: close\r\n"
        b"\r\n"
        b"print(1)\n"
    ]


@pytest.mark.parametrize(
    "schema",
    [
        # Exercises '-' and '_' in base64url and every padding length.
        '{"type":"enum","values":["\u00e9t\u00e9","\u20ac>?"]}',
        '{"type":"const","value":"~~~"}',
        '{"type":"const","value":"~~~~"}',
        '{"type":"const","value":"~~~~~"}',
        "x" * 4096,  # the size limit itself is allowed; the broker judges it
    ],
)
def test_schema_header_is_unpadded_base64url_of_raw_bytes(cmd, schema):
    with recorded_server(Reply([http_reply(b'{"status":"error"}')])) as server:
        outcome = run_wrapper(cmd, ["--schema", schema, "--repo", "a/b"], socket_path=server.path)
    assert_error(outcome)
    _line, headers, _body = split_request(server.requests[0])
    value = dict(headers)[b"X-AWF-Schema-B64"]
    assert b"=" not in value
    assert b"+" not in value
    assert b"/" not in value
    padded = value + b"=" * (-len(value) % 4)
    assert base64.urlsafe_b64decode(padded) == schema.encode("utf-8")


def test_script_bytes_are_sent_unmodified(cmd):
    script = b"\x00\r\n\xff\xfe# not UTF-8, CRLF, NUL \r\n" + bytes(range(256))
    with recorded_server(Reply([http_reply(b'{"status":"error"}')])) as server:
        outcome = run_wrapper(cmd, ARGS, script=script, socket_path=server.path)
    assert_error(outcome)
    _line, headers, body = split_request(server.requests[0])
    assert body == script
    assert dict(headers)[b"Content-Length"] == str(len(script)).encode()


def test_script_of_exactly_64_kib_is_sent(cmd):
    script = b"#" * (64 * 1024)
    reply = http_reply(b'{"status":"ok","result":true}')
    with recorded_server(Reply([reply])) as server:
        outcome = run_wrapper(cmd, ARGS, script=script, socket_path=server.path)
    assert outcome.stdout == b'{"status":"ok","result":true}\n'
    assert split_request(server.requests[0])[2] == script


# ---------------------------------------------------------------------------
# Canonical bodies pass through byte for byte

OK_BODIES = [
    b'{"status":"error"}',
    b'{"status":"ok","result":true}',
    b'{"status":"ok","result":null}',
    b'{"status":"ok","result":-9007199254740991}',
    b'{"status":"ok","result":[]}',
    b'{"status":"ok","result":{}}',
    b'{"status":"ok","result":{"tag":"hit","value":[1,2,{"b":false,"a":"x"}]}}',
    '{"status":"ok","result":"\u00e9\u20ac\U0001f600\x7f\u0085"}'.encode(),
    b'{"status":"ok","result":"q\\"b\\\\n\\n\\t\\r\\b\\f\\u0000\\u001f"}',
]


@pytest.mark.parametrize("body", OK_BODIES)
def test_canonical_bodies_pass_through(cmd, body):
    with recorded_server(Reply([http_reply(body)])) as server:
        outcome = run_wrapper(cmd, ARGS, socket_path=server.path)
    assert outcome.stdout == body + b"\n"
    assert outcome.stderr == b""
    assert outcome.returncode == 0


ONE = b'{"status":"ok","result":1}'


@pytest.mark.parametrize(
    "reply",
    [
        # One byte per send: the reader must reassemble.
        Reply([bytes([b]) for b in http_reply(ONE)]),
        # No Content-Length: the body ends when the connection closes.
        Reply([b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + ONE]),
        # Framed by Content-Length while the server keeps the connection open.
        Reply([http_reply(ONE)], hang=True),
        # HTTP/1.0, mixed-case names, no reason phrase, repeated equal lengths.
        Reply([b"HTTP/1.0 200\r\nContent-LENGTH: 26\r\ncontent-length: 26\r\n\r\n" + ONE]),
    ],
    ids=["byte-by-byte", "close-delimited", "framed-then-hang", "http10-mixed"],
)
def test_acceptable_framings(cmd, reply):
    with recorded_server(reply) as server:
        outcome = run_wrapper(cmd, ARGS, socket_path=server.path, env=SHORT_DEADLINE)
    assert outcome.stdout == ONE + b"\n"
    assert outcome.stderr == b""
    assert outcome.returncode == 0


# ---------------------------------------------------------------------------
# Odd and hostile responses all become the canonical error

OK = b'{"status":"ok","result":true}'

HOSTILE = {
    "status-500": Reply([http_reply(OK, status=b"500 Internal Server Error")]),
    "status-204": Reply([http_reply(OK, status=b"204 No Content")]),
    "status-100-first": Reply([b"HTTP/1.1 100 Continue\r\n\r\n" + http_reply(OK)]),
    "http-2": Reply([http_reply(OK).replace(b"HTTP/1.1", b"HTTP/2.0", 1)]),
    "garbage-status": Reply([b"hello world\r\n\r\n" + OK]),
    "chunked": Reply(
        [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1d\r\n" + OK + b"\r\n0\r\n\r\n"]
    ),
    # A transfer coding wins over Content-Length (RFC 9112): refuse, never guess.
    "chunked-with-length": Reply([http_reply(OK, extra=b"transfer-encoding: chunked\r\n")]),
    "identity-coding": Reply([http_reply(OK, extra=b"Transfer-Encoding: identity\r\n")]),
    "header-without-colon": Reply([http_reply(OK, extra=b"bogus\r\n")]),
    "folded-header": Reply([http_reply(OK, extra=b"x-a: 1\r\n  folded\r\n")]),
    "bare-lf-in-header": Reply([http_reply(OK, extra=b"x-a: 1\nx-b: 2\r\n")]),
    "conflicting-lengths": Reply([http_reply(OK, extra=b"content-length: 5\r\n")]),
    "negative-length": Reply([b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n" + OK]),
    "plus-length": Reply([b"HTTP/1.1 200 OK\r\ncontent-length: +29\r\n\r\n" + OK]),
    "huge-length": Reply([b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999\r\n\r\n" + OK]),
    "extra-bytes-after-body": Reply([http_reply(OK) + b"\n"]),
    "truncated-body": Reply([http_reply(OK)[:-3]]),
    "closed-mid-head": Reply([b"HTTP/1.1 200 OK\r\ncontent-le"]),
    "closed-before-reply": Reply([]),
    "closed-without-reading": Reply([], read_request=False),
    "head-only-no-body": Reply([b"HTTP/1.1 200 OK\r\n\r\n"]),
    "huge-head": Reply([b"HTTP/1.1 200 OK\r\n" + b"x-pad: " + b"a" * 40000 + b"\r\n\r\n" + OK]),
    "huge-framed-body": Reply(
        [http_reply(b'{"status":"ok","result":"' + b"a" * 2_000_000 + b'"}')]
    ),
    "huge-close-delimited-body": Reply(
        [b'HTTP/1.1 200 OK\r\n\r\n{"status":"ok","result":"' + b"a" * 2_000_000 + b'"}']
    ),
    "extra-key-error": Reply([http_reply(b'{"status":"error","reason":"x"}')]),
    "extra-key-ok": Reply([http_reply(b'{"status":"ok","result":true,"x":1}')]),
    "result-first": Reply([http_reply(b'{"result":true,"status":"ok"}')]),
    "missing-result": Reply([http_reply(b'{"status":"ok"}')]),
    "other-status": Reply([http_reply(b'{"status":"maybe","result":true}')]),
    "duplicate-status": Reply([http_reply(b'{"status":"ok","status":"ok","result":1}')]),
    "two-lines": Reply([http_reply(b'{"status":"error"}\n{"status":"ok","result":true}')]),
    "trailing-newline": Reply([http_reply(OK + b"\n")]),
    "leading-space": Reply([http_reply(b" " + OK)]),
    "inner-whitespace": Reply([http_reply(b'{"status": "ok", "result": true}')]),
    "not-json": Reply([http_reply(b"hello")]),
    "empty-body": Reply([http_reply(b"")]),
    "json-array": Reply([http_reply(b'[{"status":"error"}]')]),
    "float-result": Reply([http_reply(b'{"status":"ok","result":1.0}')]),
    "exponent-result": Reply([http_reply(b'{"status":"ok","result":1e3}')]),
    "negative-zero": Reply([http_reply(b'{"status":"ok","result":-0}')]),
    "nan-result": Reply([http_reply(b'{"status":"ok","result":NaN}')]),
    "duplicate-key-in-result": Reply([http_reply(b'{"status":"ok","result":{"a":1,"a":1}}')]),
    "lone-surrogate": Reply([http_reply(b'{"status":"ok","result":"\\ud800"}')]),
    "needless-escape": Reply([http_reply(b'{"status":"ok","result":"\\u0041"}')]),
    "escaped-slash": Reply([http_reply(b'{"status":"ok","result":"a\\/b"}')]),
    "uppercase-hex-escape": Reply([http_reply(b'{"status":"ok","result":"\\u001F"}')]),
    "raw-control-char": Reply([http_reply(b'{"status":"ok","result":"a\tb"}')]),
    "raw-newline-in-string": Reply([http_reply(b'{"status":"ok","result":"a\nb"}')]),
    "invalid-utf8": Reply([http_reply(b'{"status":"ok","result":"\xff"}')]),
    "overlong-utf8": Reply([http_reply(b'{"status":"ok","result":"\xc0\xaf"}')]),
    "deep-nesting": Reply([http_reply(OK[:-5] + b"[" * 5000 + b"]" * 5000 + b"}")]),
    "huge-integer": Reply([http_reply(b'{"status":"ok","result":' + b"9" * 5000 + b"}")]),
    "trailing-garbage": Reply([http_reply(b'{"status":"ok","result":true}}')]),
    "nul-in-body": Reply([http_reply(b'{"status":"error"}\x00')]),
}


@pytest.mark.parametrize("reply", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_responses_become_the_canonical_error(cmd, reply):
    with recorded_server(reply) as server:
        outcome = run_wrapper(cmd, ARGS, socket_path=server.path, env=SHORT_DEADLINE)
    assert_error(outcome)
    if reply.read_request:
        assert len(server.requests) == 1


# ---------------------------------------------------------------------------
# Deadlines: a hanging or trickling broker cannot hold the agent


@pytest.mark.parametrize(
    "reply",
    [
        Reply(hang=True),
        Reply([b"HTTP/1.1 200 OK\r\n"], hang=True),
        Reply([b"HTTP/1.1 200 OK\r\ncontent-length: 29\r\n\r\n{"], hang=True),
        Reply([b'HTTP/1.1 200 OK\r\n\r\n{"status":"error"}'], hang=True),  # never closes
        # One byte every 50 ms: each read is quick, the total is not.
        Reply([bytes([b]) for b in http_reply(OK)], pause=0.05),
    ],
    ids=["silent", "head-then-hang", "partial-body-then-hang", "unframed-open", "trickle"],
)
def test_deadline_bounds_the_whole_exchange(cmd, reply):
    with recorded_server(reply) as server:
        outcome = run_wrapper(cmd, ARGS, socket_path=server.path, env=SHORT_DEADLINE)
    assert_error(outcome)
    # The patched deadline is 0.6 s. A per-read timeout would let the trickle
    # (about 80 bytes, 50 ms apart) complete as an ok answer after ~4 s.
    assert outcome.elapsed < 4.0


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "abc", "99999"])
def test_test_deadline_variable_can_only_shorten(cmd, value):
    # Nonsense or longer values fall back to the real deadline: the prompt
    # answer still arrives (an immediate deadline would print the error).
    with recorded_server(Reply([http_reply(OK)])) as server:
        outcome = run_wrapper(cmd, ARGS, socket_path=server.path, env={DEADLINE_ENV: value})
    assert outcome.stdout == OK + b"\n"


# ---------------------------------------------------------------------------
# Transport failures


def test_missing_socket_variable(cmd):
    assert_error(run_wrapper(cmd, ARGS, socket_path=None))


def test_empty_socket_variable(cmd):
    assert_error(run_wrapper(cmd, ARGS, socket_path=""))


def test_socket_path_does_not_exist(cmd, tmp_path):
    assert_error(run_wrapper(cmd, ARGS, socket_path=str(tmp_path / "nothing.sock")))


def test_socket_path_is_a_regular_file(cmd, tmp_path):
    path = tmp_path / "file"
    path.write_bytes(b"")
    assert_error(run_wrapper(cmd, ARGS, socket_path=str(path)))


def test_socket_path_too_long(cmd):
    assert_error(run_wrapper(cmd, ARGS, socket_path="/tmp/" + "x" * 300))


def test_sigint_while_waiting_still_prints_one_line(cmd, tmp_path):
    script = tmp_path / "query.py"
    script.write_bytes(b"print(1)\n")
    with recorded_server(Reply(hang=True)) as server, script.open("rb") as stdin:
        env = {k: v for k, v in os.environ.items() if k != DEADLINE_ENV}
        env["AWF_BOUNDED_QUERY_SOCKET"] = server.path
        proc = subprocess.Popen(
            [*cmd, *ARGS], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        # Wait until the request reached the broker, then interrupt.
        for _ in range(400):
            if server.requests:
                break
            time.sleep(0.025)
        assert server.requests
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=20)
    assert stdout == ERROR_LINE
    assert stderr == b""
    assert proc.returncode == 0


def test_closed_stdout_is_silent(cmd):
    with recorded_server(Reply([http_reply(OK)])) as server:
        env = {**os.environ, "AWF_BOUNDED_QUERY_SOCKET": server.path}
        proc = subprocess.run(
            ["sh", "-c", 'exec "$@" >&-', "sh", *cmd, *ARGS],
            input=b"print(1)\n",
            capture_output=True,
            env=env,
            timeout=30,
            check=False,
        )
    assert proc.stderr == b""
    assert proc.returncode == 0
