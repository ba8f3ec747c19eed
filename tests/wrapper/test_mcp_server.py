"""``bounded-query-mcp`` on its own: the era table, the framing, hostile input.

The protocol core (``Session``, ``LineReader``) is driven in-process with
fakes; everything about stdio (what reaches stdout and stderr, oversize
lines, concurrency, EOF) runs the real file as a real process against a
recorded fake broker socket.
"""

from __future__ import annotations

import ast
import json
import sys
import time
from typing import Any

import jsonschema
import pytest

from bounded_query.broker import protocol
from bounded_query.wrapper import bounded_query_cost as cost_tool
from bounded_query.wrapper import bounded_query_mcp as mcp
from tests.conftest import require_python38
from tests.wrapper.fakes import (
    DEADLINE_ENV,
    Reply,
    http_reply,
    recorded_server,
    silent_listener,
    was_contacted,
)
from tests.wrapper.mcp_fixtures import (
    BOOLEAN,
    INITIALIZED,
    MCP_FILE,
    MODERN,
    SKILL_TEXT,
    call,
    envelope,
    initialize,
    raw_server,
    request,
    server_env,
    skill_file,
    wrapper_dir,
)

OK = b'{"status":"ok","result":true}'
QUESTION = {"repo": "octo/alpha", "schema": BOOLEAN, "script": "print(1)\n"}


def fake_session(answer: str = OK.decode()) -> mcp.Session:
    def query(repo: str, schema: bytes, script: bytes) -> str:
        return answer

    return mcp.Session(query, mcp.real_cost, lambda: SKILL_TEXT)


def ready(session: mcp.Session) -> mcp.Session:
    """``session`` after the handshake."""
    assert "result" in answer(session, initialize(0))
    return session


def answer(session: mcp.Session, line: bytes):
    out = session.handle_line(line.rstrip(b"\n"))
    if isinstance(out, mcp.Deferred):
        out = out.finish(out.work())
    assert out is None or isinstance(out, bytes)
    return None if out is None else json.loads(out)


def code(reply) -> int | None:
    return reply["error"]["code"] if reply is not None and "error" in reply else None


# ---------------------------------------------------------------------------
# The era table, every (state, input) pair

PLAIN_LIST = request(1, "tools/list")
MODERN_LIST = request(1, "tools/list", {"_meta": envelope()})
BAD_VERSION = request(
    1,
    "tools/list",
    {"_meta": envelope(**{"io.modelcontextprotocol/protocolVersion": "2099-01-01"})},
)
HALF_ENVELOPE = request(
    1, "tools/list", {"_meta": {"io.modelcontextprotocol/protocolVersion": MODERN}}
)
DISCOVER = request(1, "server/discover", {"_meta": envelope()})
PLAIN_DISCOVER = request(1, "server/discover")
PING = request(1, "ping")
INPUTS = {
    "initialize": initialize(1),
    "enveloped": MODERN_LIST,
    "discover": DISCOVER,
    "bad-version": BAD_VERSION,
    "half-envelope": HALF_ENVELOPE,
    "plain-discover": PLAIN_DISCOVER,
    "plain": PLAIN_LIST,
    "ping": PING,
}
# state -> input -> (error code or None, state after)
TABLE = {
    mcp.NEW: {
        "initialize": (None, mcp.LEGACY),
        "enveloped": (None, mcp.MODERN),
        "discover": (None, mcp.MODERN),
        "bad-version": (-32022, mcp.NEW),
        "half-envelope": (-32602, mcp.NEW),
        "plain-discover": (-32602, mcp.NEW),
        "plain": (-32600, mcp.NEW),
        "ping": (None, mcp.NEW),
    },
    mcp.LEGACY: {
        "initialize": (-32600, mcp.LEGACY),
        "enveloped": (-32600, mcp.LEGACY),
        "discover": (-32600, mcp.LEGACY),
        "bad-version": (-32600, mcp.LEGACY),
        "half-envelope": (-32600, mcp.LEGACY),
        "plain-discover": (-32600, mcp.LEGACY),
        "plain": (None, mcp.LEGACY),
        "ping": (None, mcp.LEGACY),
    },
    mcp.MODERN: {
        "initialize": (-32022, mcp.MODERN),
        "enveloped": (None, mcp.MODERN),
        "discover": (None, mcp.MODERN),
        "bad-version": (-32022, mcp.MODERN),
        "half-envelope": (-32602, mcp.MODERN),
        "plain-discover": (-32602, mcp.MODERN),
        "plain": (-32602, mcp.MODERN),
        "ping": (None, mcp.MODERN),
    },
}
OPENERS = {mcp.NEW: [], mcp.LEGACY: [initialize(0)], mcp.MODERN: [DISCOVER]}


@pytest.mark.parametrize("state", sorted(TABLE))
@pytest.mark.parametrize("name", sorted(INPUTS))
def test_era_table(state, name):
    session = fake_session()
    for line in OPENERS[state]:
        assert code(answer(session, line)) is None
    assert session.era == state
    want_code, want_state = TABLE[state][name]
    reply = answer(session, INPUTS[name])
    assert reply["id"] == 1
    assert code(reply) == want_code, reply
    assert session.era == want_state
    if want_code is None:
        assert ("resultType" in reply["result"]) == (want_state == mcp.MODERN)


@pytest.mark.parametrize(
    ("offered", "agreed"),
    [
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        ("2024-11-05", "2025-11-25"),
        (MODERN, "2025-11-25"),
        ("garbage", "2025-11-25"),
    ],
)
def test_handshake_negotiates_a_served_revision(offered, agreed):
    reply = answer(fake_session(), initialize(7, offered))
    assert reply["result"]["protocolVersion"] == agreed
    assert reply["result"]["serverInfo"]["name"] == "bounded-query"
    assert set(reply["result"]["capabilities"]) == {"tools", "resources"}


def test_unsupported_version_names_what_is_served():
    reply = answer(fake_session(), BAD_VERSION)
    assert reply["error"]["data"] == {"supported": [MODERN], "requested": "2099-01-01"}
    session = fake_session()
    answer(session, DISCOVER)
    reply = answer(session, initialize(3, "2025-06-18"))
    assert reply["error"]["data"] == {"supported": [MODERN], "requested": "2025-06-18"}


def test_discover_advertises_the_stateless_revision():
    result = answer(fake_session(), DISCOVER)["result"]
    assert result["supportedVersions"] == [MODERN]
    assert result["resultType"] == "complete"
    assert result["cacheScope"] == "public"
    assert result["ttlMs"] >= 0
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "bounded-query"
    assert set(result["capabilities"]) == {"tools", "resources"}


def test_notifications_and_responses_are_never_answered():
    session = fake_session()
    for line in (
        INITIALIZED,
        b'{"jsonrpc":"2.0","method":"no/such/notification","params":{}}',
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}',
        b'{"jsonrpc":"2.0","id":5,"result":{}}',
        b'{"jsonrpc":"2.0","id":5,"error":{"code":1,"message":"x"}}',
        b"",
        b"   \r",
    ):
        assert answer(session, line) is None
    assert session.era == mcp.NEW


# ---------------------------------------------------------------------------
# Framing


def test_line_reader_whole_and_bytewise_agree():
    data = b'{"a":1}\n\n{"b":2}\r\n' + b"x" * 50 + b"\n" + b"tail"
    whole = mcp.LineReader(limit=40)
    got_whole = whole.feed(data) + whole.finish()
    bytewise = mcp.LineReader(limit=40)
    got_bytes = [line for i in range(len(data)) for line in bytewise.feed(data[i : i + 1])]
    got_bytes += bytewise.finish()
    assert got_whole == got_bytes == [b'{"a":1}', b"", b'{"b":2}\r', None, b"tail"]


def test_line_reader_discards_an_oversize_line_without_buffering_it():
    reader = mcp.LineReader(limit=10)
    assert reader.feed(b"y" * 11) == [None]
    for _ in range(100):
        assert reader.feed(b"y" * 1000) == []
        assert len(reader._buffer) == 0
    assert reader.feed(b"y\nok\n") == [b"ok"]
    assert reader.finish() == []


# ---------------------------------------------------------------------------
# Hostile input to the real process: only JSON-RPC errors, never a crash

HOSTILE = [
    (b"not json", -32700, None),
    (b"\xff\xfe{}", -32700, None),
    (b"{" * 50_000, -32700, None),
    (b"[" * 200_000 + b"]" * 200_000, -32700, None),
    (b'{"jsonrpc":"2.0","id":1,"method":"ping","x":NaN}', -32700, None),
    # A number token too long to be an integer id (kept as text, never int()-ed).
    (b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"ping"}', -32600, None),
    (b"[]", -32600, None),
    (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', -32600, None),
    (b"1", -32600, None),
    (b"null", -32600, None),
    (b'"ping"', -32600, None),
    (b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', -32600, None),
    (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', -32600, None),
    (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', -32600, None),
    (b'{"jsonrpc":"2.0","id":{},"method":"ping"}', -32600, None),
    (b'{"jsonrpc":"1.0","id":11,"method":"ping"}', -32600, 11),
    (b'{"id":12,"method":"ping"}', -32600, 12),
    (b'{"jsonrpc":"2.0","id":13,"method":7}', -32600, 13),
    (b'{"jsonrpc":"2.0","id":14}', -32600, 14),
    (b'{"jsonrpc":"2.0","id":"s","method":"ping","params":[1]}', -32602, "s"),
    (b'{"jsonrpc":"2.0","id":15,"method":"no/such/method"}', -32601, 15),
    (b'{"jsonrpc":"2.0","id":16,"method":"prompts/list"}', -32601, 16),
    (
        b'{"jsonrpc":"2.0","id":17,"method":"resources/read","params":{"uri":"file:///etc/passwd"}}',
        -32602,
        17,
    ),
    (b'{"jsonrpc":"2.0","id":18,"method":"resources/read","params":{}}', -32602, 18),
]

# The tool name is Any: one case sends a number where a name belongs.
ARGS_CASES: list[tuple[Any, object]] = [
    ("bounded_query", {**QUESTION, "repo": 5}),
    ("bounded_query", {**QUESTION, "extra": "x"}),
    ("bounded_query", {"repo": "octo/alpha", "schema": BOOLEAN}),
    ("bounded_query", [QUESTION["repo"], BOOLEAN, "print(1)"]),
    ("bounded_query", "repo=octo/alpha"),
    ("bounded_query", None),
    ("bounded_query", {**QUESTION, "script": ""}),
    ("bounded_query", {**QUESTION, "script": "x" * (64 * 1024 + 1)}),
    ("bounded_query", {**QUESTION, "schema": "x" * 4097}),
    ("bounded_query", {**QUESTION, "schema": ["type", "boolean"]}),
    ("bounded_query", {**QUESTION, "schema": None}),
    ("bounded_query", {**QUESTION, "script": ["print(1)"]}),
    ("bounded_query_cost", {"schema": BOOLEAN, "repo": "octo/alpha"}),
    ("bounded_query_cost", {"schema": 1}),
    ("bounded_query_cost", {"schema": True}),
    ("bounded_query_cost", {"schema": ""}),
    ("bounded_query_cost", {"schema": "\ud800"}),
    ("bounded_query_cost", {}),
    ("no_such_tool", {}),
    (7, {}),
]


def test_hostile_lines_get_json_rpc_errors_and_the_server_goes_on():
    with silent_listener() as (path, sock), raw_server(env=server_env(path, None)) as server:
        assert "result" in server.ask(initialize(0))
        server.send(INITIALIZED)
        for line, want, want_id in HOSTILE:
            reply = server.ask(line + b"\n")
            assert reply == {"jsonrpc": "2.0", "id": want_id, "error": reply["error"]}, line[:80]
            assert reply["error"]["code"] == want, (line[:80], reply)
            assert set(reply["error"]) <= {"code", "message", "data"}
        for index, (name, arguments) in enumerate(ARGS_CASES):
            reply = server.ask(call(100 + index, name, arguments))
            assert reply["id"] == 100 + index
            assert reply["error"]["code"] == -32602, (name, arguments, reply)
        assert server.ask(request(999, "ping")) == {"jsonrpc": "2.0", "id": 999, "result": {}}
        lines, stderr, status = server.close()
        assert not was_contacted(sock), "no argument error may reach the broker"
    assert (stderr, status) == (b"", 0)
    assert len(lines) == 1 + len(HOSTILE) + len(ARGS_CASES) + 1


def test_arguments_the_wrapper_refuses_are_the_canonical_error_without_the_broker():
    """Type-correct but implausible values take the CLI's local path: canonical error."""
    cases = [
        {**QUESTION, "repo": "no-slash"},
        {**QUESTION, "repo": "a/b c"},
        {**QUESTION, "repo": "a/b\nX-AWF-Repo: c/d"},
        {**QUESTION, "schema": "\ud800"},
        {**QUESTION, "script": "\udcff"},
        {**QUESTION, "script": "\u00e9" * 40_000},  # 80,000 UTF-8 bytes > 64 KiB
    ]
    with silent_listener() as (path, sock), raw_server(env=server_env(path, None)) as server:
        server.ask(initialize(0))
        for index, arguments in enumerate(cases):
            reply = server.ask(call(index + 1, "bounded_query", arguments))
            assert reply["result"]["structuredContent"] == {"status": "error"}, arguments
            assert reply["result"]["isError"] is False
        server.close()
        assert not was_contacted(sock)


def test_a_huge_line_is_refused_once_and_the_next_line_is_served():
    with raw_server() as server:
        server.ask(initialize(0))
        server.send(b'{"jsonrpc":"2.0","id":1,"method":"ping","pad":"' + b"A" * (3 << 20))
        server.send(b'"}\n' + request(2, "ping"))
        lines = server.lines(3)
        lines, stderr, status = server.close()
    replies = [json.loads(line) for line in lines[1:]]
    assert replies[0] == {"jsonrpc": "2.0", "id": None, "error": replies[0]["error"]}
    assert replies[0]["error"]["code"] == -32600
    assert replies[1] == {"jsonrpc": "2.0", "id": 2, "result": {}}
    assert (len(replies), stderr, status) == (2, b"", 0)


def test_a_big_legitimate_call_fits_the_line_limit():
    """The largest legal script, escaped byte for byte, is under MAX_LINE_BYTES."""
    script = "\x01" * (64 * 1024)
    line = call(1, "bounded_query", {**QUESTION, "script": script, "schema": "\x01" * 4096})
    assert len(line) < mcp.MAX_LINE_BYTES
    with (
        recorded_server(Reply([http_reply(OK)])) as broker,
        raw_server(env=server_env(broker.path, None)) as server,
    ):
        server.ask(initialize(0))
        reply = server.ask(call(1, "bounded_query", {**QUESTION, "script": script}))
        server.close()
    assert reply["result"]["structuredContent"] == {"status": "ok", "result": True}
    assert broker.requests[0].endswith(script.encode())


# ---------------------------------------------------------------------------
# Concurrency and shutdown


def test_concurrent_calls_each_get_their_own_answer_and_ping_stays_live():
    """A hanging broker: pings are answered at once, calls past the in-flight cap
    get the canonical error at once, every call is answered exactly once."""
    calls = mcp.MAX_IN_FLIGHT + 4
    env = {**server_env(None, None), DEADLINE_ENV: "3"}
    with recorded_server(Reply(hang=True)) as broker:
        env["AWF_BOUNDED_QUERY_SOCKET"] = broker.path
        with raw_server(env=env) as server:
            server.ask(initialize(0))
            started = time.monotonic()
            server.send(b"".join(call(f"c{i}", "bounded_query", QUESTION) for i in range(calls)))
            server.send(request("p", "ping"))
            early = [json.loads(x) for x in server.lines(1 + 4 + 1)[1:]]
            elapsed_early = time.monotonic() - started
            lines, stderr, status = server.close()
    assert elapsed_early < 3.0, "the ping and the over-cap refusals must not wait"
    assert {"jsonrpc": "2.0", "id": "p", "result": {}} in early
    assert len({r["id"] for r in early if r["id"] != "p"}) == 4
    replies = [json.loads(x) for x in lines[1:]]
    by_id = {}
    for reply in replies:
        assert reply["id"] not in by_id, "answered twice"
        by_id[reply["id"]] = reply
    assert set(by_id) == {f"c{i}" for i in range(calls)} | {"p"}
    for i in range(calls):
        assert by_id[f"c{i}"]["result"]["structuredContent"] == {"status": "error"}
    assert (stderr, status) == (b"", 0)


def test_concurrent_ok_answers_are_matched_to_their_ids():
    with (
        recorded_server(Reply([http_reply(OK)])) as broker,
        raw_server(env=server_env(broker.path, None)) as server,
    ):
        server.ask(initialize(0))
        server.send(b"".join(call(i, "bounded_query", QUESTION) for i in range(1, 11)))
        server.lines(11)
        lines, stderr, status = server.close()
    replies = sorted((json.loads(x) for x in lines[1:]), key=lambda r: r["id"])
    assert [r["id"] for r in replies] == list(range(1, 11))
    assert all(r["result"]["content"][0]["text"] == OK.decode() for r in replies)
    assert len(broker.requests) == 10
    assert (stderr, status) == (b"", 0)


def test_eof_answers_the_call_in_flight_then_exits_zero():
    env = {**server_env(None, None), DEADLINE_ENV: "1"}
    with recorded_server(Reply(hang=True)) as broker:
        env["AWF_BOUNDED_QUERY_SOCKET"] = broker.path
        with raw_server(env=env) as server:
            server.send(initialize(0) + call(1, "bounded_query", QUESTION))
            lines, stderr, status = server.close()
    assert json.loads(lines[-1])["result"]["structuredContent"] == {"status": "error"}
    assert (len(lines), stderr, status) == (2, b"", 0)


def test_a_last_line_without_newline_is_served_at_eof():
    with raw_server() as server:
        server.send(request(1, "ping").rstrip(b"\n"))
        lines, stderr, status = server.close()
    assert [json.loads(x) for x in lines] == [{"jsonrpc": "2.0", "id": 1, "result": {}}]
    assert (stderr, status) == (b"", 0)


# ---------------------------------------------------------------------------
# The fixed tool list, the output schemas, the descriptions


def tools_listed(env, modern: bool):
    with raw_server(env=env) as server:
        if modern:
            return server.ask(request(1, "tools/list", {"_meta": envelope()}))["result"]
        server.ask(initialize(0))
        return server.ask(request(1, "tools/list"))["result"]


def test_the_tool_list_is_the_same_for_every_run(tmp_path):
    envs = [
        server_env(None, None),
        {
            **server_env("/tmp/x/broker.sock", skill_file(tmp_path)),
            "AWF_BOUNDED_QUERY_REPOS": "acme/secret-plans,octo/alpha",
        },
    ]
    lists = [tools_listed(env, modern)["tools"] for env in envs for modern in (False, True)]
    assert all(tools == lists[0] for tools in lists)
    text = json.dumps(lists[0])
    for word in ("secret-plans", "acme", "octo/alpha", "/tmp/x", str(tmp_path)):
        assert word not in text
    for tool in lists[0]:
        schema = tool["inputSchema"]
        assert schema["type"] == "object"
        assert schema["additionalProperties"] is False
        assert sorted(schema["required"]) == sorted(schema["properties"])
        jsonschema.Draft202012Validator.check_schema(schema)
        jsonschema.Draft202012Validator.check_schema(tool["outputSchema"])


def output_schema(name: str):
    return next(t["outputSchema"] for t in mcp.TOOLS if t["name"] == name)


@pytest.mark.parametrize(
    "body", [b'{"status":"error"}', OK, b'{"status":"ok","result":{"tag":"a","value":null}}']
)
def test_query_structured_content_matches_its_output_schema(body):
    result = answer(ready(fake_session(body.decode())), call(1, "bounded_query", QUESTION))
    result = result["result"]
    jsonschema.validate(result["structuredContent"], output_schema("bounded_query"))
    assert result["content"] == [{"type": "text", "text": body.decode()}]
    assert result["isError"] is False


@pytest.mark.parametrize(
    "schema",
    [
        BOOLEAN,
        '{"type":"nope"}',
        "[",
        '{"type":"array","items":{"type":"integer","minimum":0,'
        '"maximum":9007199254740991},"length":64}',
        "x" * 4096,
    ],
    ids=["boolean", "unknown-type", "not-json", "saturated", "oversize-text"],
)
def test_cost_is_the_cost_tools_own_report(schema):
    reply = answer(ready(fake_session()), call(1, "bounded_query_cost", {"schema": schema}))
    result = reply["result"]
    jsonschema.validate(result["structuredContent"], output_schema("bounded_query_cost"))
    want = cost_tool.render(cost_tool.assess(schema.encode(), protocol), protocol, True)
    assert result["content"][0]["text"] == want.rstrip("\n")
    assert result["structuredContent"] == json.loads(want)
    assert result["isError"] is False


def test_descriptions_state_the_protocols_numbers():
    assert mcp.MAX_SCHEMA_BYTES == protocol.MAX_SCHEMA_BYTES
    assert mcp.MAX_SCRIPT_BYTES == protocol.MAX_SCRIPT_BYTES
    assert mcp.MAX_REPO_CHARS == protocol.MAX_SLUG_CHARS
    status, timing = protocol.RESULT_STATUS_BIT_COST, protocol.TIMING_BUCKET_BITS
    assert (
        f"{status} status bit + ceil(log2(cardinality of the schema)) + {timing} timing"
        in mcp.QUERY_DESCRIPTION
    )
    assert f"{status} status + ceil(log2(cardinality)) + {timing}" in mcp.COST_DESCRIPTION
    budgets = protocol.policy.METERED_BUDGETS
    assert (
        f"internal {budgets['internal']} bits, confidential {budgets['confidential']},"
        f" sealed {budgets['sealed']}"
    ) in mcp.COST_DESCRIPTION
    for kind in ("const", "boolean", "enum", "integer", "object", "tuple", "array", "union"):
        assert kind in mcp.QUERY_DESCRIPTION


def test_skill_resource_reads_the_file_and_fails_closed(tmp_path):
    path = skill_file(tmp_path)
    read = request(1, "resources/read", {"uri": mcp.SKILL_URI})
    with raw_server(env=server_env(None, path)) as server:
        server.ask(initialize(0))
        contents = server.ask(read)["result"]["contents"]
        assert contents == [{"uri": mcp.SKILL_URI, "mimeType": "text/markdown", "text": SKILL_TEXT}]
        path.write_bytes(b"\xff not utf-8")
        assert server.ask(read)["error"]["code"] == -32603
        path.unlink()
        assert server.ask(read)["error"]["code"] == -32603
        assert "result" in server.ask(request(2, "resources/list"))
        _, stderr, status = server.close()
    assert (stderr, status) == (b"", 0)


# ---------------------------------------------------------------------------
# The copied file: stdlib only, Python 3.8, nothing but protocol on stdout


def test_mcp_file_is_stdlib_only_python_3_8_without_relative_imports():
    text = MCP_FILE.read_text(encoding="utf-8")
    assert text.startswith('#!/bin/sh\n"""exec" python3 -I "$0" "$@"\n')
    tree = ast.parse(text, feature_version=(3, 8))
    names: set[str] = set()
    fallbacks: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0
            if node.module == "bounded_query.wrapper":
                fallbacks.update(alias.name for alias in node.names)
            else:
                names.add((node.module or "").split(".")[0])
    names.discard("__future__")
    assert names <= sys.stdlib_module_names, names - sys.stdlib_module_names
    # The one exception: without siblings (the installed console script) the
    # loaders import the installed wrapper modules, inside the functions.
    assert fallbacks == {"bounded_query_cli", "bounded_query_cost"}
    top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(getattr(n, "module", None) != "bounded_query.wrapper" for n in top_level)


def test_installed_copy_runs_isolated_from_the_wrapper_directory(tmp_path):
    bin_dir = wrapper_dir(tmp_path)
    copy = bin_dir / "bounded-query-mcp"
    assert copy.read_bytes() == MCP_FILE.read_bytes()
    assert copy.stat().st_mode & 0o777 == 0o555
    with recorded_server(Reply([http_reply(OK)])) as broker:
        env = {"PATH": "/usr/bin:/bin", "AWF_BOUNDED_QUERY_SOCKET": broker.path}
        command = [sys.executable, "-I", "-S", str(bin_dir / "bounded-query-mcp")]
        with raw_server(command, env) as server:
            server.ask(request(1, "server/discover", {"_meta": envelope()}))
            got = server.ask(call(2, "bounded_query", QUESTION, envelope()))
            cost = server.ask(call(3, "bounded_query_cost", {"schema": BOOLEAN}, envelope()))
            _, stderr, status = server.close()
    assert got["result"]["structuredContent"] == {"status": "ok", "result": True}
    assert got["result"]["resultType"] == "complete"
    assert cost["result"]["structuredContent"]["chargeBits"] == 5
    assert (stderr, status) == (b"", 0)


def test_runs_on_a_real_python_3_8(tmp_path):
    """The installed copy on the oldest promised agent Python: both tools work."""
    python38 = require_python38()
    bin_dir = wrapper_dir(tmp_path)
    with (
        recorded_server(Reply([http_reply(OK)])) as broker,
        raw_server(
            [python38, str(bin_dir / "bounded-query-mcp")], server_env(broker.path, None)
        ) as server,
    ):
        assert server.ask(initialize(0, "2025-06-18"))["result"]["protocolVersion"] == "2025-06-18"
        assert len(server.ask(request(1, "tools/list"))["result"]["tools"]) == 2
        got = server.ask(call(2, "bounded_query", QUESTION))
        assert got["result"]["structuredContent"] == {"status": "ok", "result": True}
        cost = server.ask(call(3, "bounded_query_cost", {"schema": BOOLEAN}))
        assert cost["result"]["structuredContent"]["chargeBits"] == 5
        as_object = server.ask(call(5, "bounded_query_cost", {"schema": json.loads(BOOLEAN)}))
        assert as_object["result"] == cost["result"]
        assert server.ask(request(4, "ping"))["result"] == {}
        _, stderr, status = server.close()
    assert (stderr, status) == (b"", 0)


def test_a_failing_query_is_still_answered_with_the_canonical_error():
    """The I/O layer in-process over pipes: a query that raises or returns garbage
    (a bug) still gets exactly one canonical-error answer."""
    import os
    import threading

    def query(repo: str, schema: bytes, script: bytes) -> str:
        if script == b"raise":
            raise RuntimeError("bug")
        return "not json" if script == b"garbage" else OK.decode()

    session = mcp.Session(query, mcp.real_cost, lambda: SKILL_TEXT)
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    server = threading.Thread(target=mcp.serve, args=(in_r, mcp.Writer(out_w), session))
    server.start()
    scripts = {1: "raise", 2: "garbage", 3: "print(1)"}
    os.write(
        in_w,
        initialize(0)
        + b"".join(
            call(i, "bounded_query", {**QUESTION, "script": text}) for i, text in scripts.items()
        ),
    )
    os.close(in_w)
    server.join(timeout=30)
    assert not server.is_alive()
    os.close(out_w)
    with os.fdopen(out_r, "rb") as out:
        replies = [json.loads(line) for line in out.read().splitlines()]
    os.close(in_r)
    by_id = {r["id"]: r["result"]["structuredContent"] for r in replies[1:]}
    assert by_id == {
        1: {"status": "error"},
        2: {"status": "error"},
        3: {"status": "ok", "result": True},
    }


def test_the_agents_python_environment_cannot_touch_the_stream(tmp_path):
    """Executed as installed, the server re-execs as ``python3 -I``: PYTHONINSPECT,
    PYTHONSTARTUP, PYTHONPATH (a shadowing json.py), PYTHONWARNINGS and the user
    site directory have no effect; stdout carries only the protocol."""
    bin_dir = wrapper_dir(tmp_path)
    evil = tmp_path / "evil"
    evil.mkdir()
    for name in ("json.py", "sitecustomize.py", "usercustomize.py", "startup.py"):
        (evil / name).write_text("import sys; sys.__stdout__.write('PWNED\\n')\n")
    env = {
        **server_env(None, None),
        "PYTHONINSPECT": "1",
        "PYTHONSTARTUP": str(evil / "startup.py"),
        "PYTHONPATH": str(evil),
        "PYTHONUSERBASE": str(evil),
        "PYTHONWARNINGS": "always",
        "PYTHONDEVMODE": "1",
        "PYTHONVERBOSE": "1",
    }
    with raw_server([str(bin_dir / "bounded-query-mcp")], env) as server:
        assert server.ask(initialize(0))["result"]["protocolVersion"] == "2025-11-25"
        assert server.ask(request(1, "ping"))["result"] == {}
        lines, stderr, status = server.close()
    assert len(lines) == 2
    assert all(json.loads(line)["jsonrpc"] == "2.0" for line in lines)
    assert (stderr, status) == (b"", 0)
