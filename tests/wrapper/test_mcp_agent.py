"""``bounded_agent`` in ``bounded-query-mcp`` (spec 15.8), from the client's side.

The server is always a real process: the verbatim copy in the agent ingress's
wrapper directory (``install_agent_wrapper_dir``, with ``bounded-agent`` and
its ``bounded-agent.json`` beside it) or in the query ingress's. The clients:
a raw line driver, the official Python SDK (both eras) and the MCP Inspector
(CLI mode, ``--strict``). The fake agent broker holds every request to the
strict frame reader.

Checked: the tool and its skill resource are listed exactly while
``AWF_BOUNDED_AGENT_SOCKET`` is set, and absent (not callable, not readable)
otherwise; the object schema goes as compact UTF-8 JSON, byte-identical to
the CLI's frame of that text; the results are the canonical bodies; the
task limit of the ingress and the local refusals are the CLI's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.types import TextContent, TextResourceContents

from bounded_query.broker.protocol import policy
from bounded_query.harness.staging.outputs import install_agent_wrapper_dir
from bounded_query.wrapper import bounded_query_cli as cli
from bounded_query.wrapper import bounded_query_mcp as mcp_server
from tests.conftest import require_python38
from tests.wrapper.agent_frame import parse_agent_frame
from tests.wrapper.fakes import (
    DEADLINE_ENV,
    Reply,
    http_reply,
    recorded_server,
    silent_listener,
    was_contacted,
)
from tests.wrapper.mcp_fixtures import (
    INITIALIZED,
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
from tests.wrapper.test_mcp_clients import client as node_client
from tests.wrapper.test_mcp_clients import run as run_client

AGENT_SKILL_TEXT = "---\nname: bounded-agent\n---\n\n# Bounded agents \u2014 test skill\n"
OK = b'{"status":"ok","result":{"validated":true,"risk":"\xc3\xa9"}}'
SCHEMA: dict[str, Any] = {
    "type": "object",
    "fields": {
        "validated": {"type": "boolean"},
        "risk": {"type": "enum", "values": ["low", "\u00e9"]},
    },
}
SCHEMA_BYTES = json.dumps(SCHEMA, ensure_ascii=False, separators=(",", ":")).encode()
TASK = "Review the upload handler.\nvalidated: is every field checked? risk: low or \u00e9.\n"
LIMIT = 200
NAMES = ["bounded_query", "bounded_query_cost"]


def agent_dir(base: Path) -> Path:
    target = base / "agent-bin"
    target.mkdir()
    install_agent_wrapper_dir(target, LIMIT)
    return target


def agent_skill(base: Path) -> Path:
    path = base / "AGENT-SKILL.md"
    path.write_text(AGENT_SKILL_TEXT, encoding="utf-8")
    return path


def env_with_agent(base: Path, agent_socket: str | None) -> dict[str, str]:
    """The agent's environment: both subsystems' variables (the query socket unset)."""
    env = server_env(None, skill_file(base))
    for name in policy.AGENT_SUBSYSTEM_VARIABLES:
        env.pop(name, None)
    if agent_socket is not None:
        env[policy.ENV_AGENT_SOCKET] = agent_socket
        env[policy.ENV_AGENT_SKILL] = str(agent_skill(base))
        env[policy.ENV_AGENT_REPOS] = "octo/alpha"
    env[DEADLINE_ENV] = "5"
    return env


def handshake(server: Any) -> None:
    assert "result" in server.ask(initialize())
    server.send(INITIALIZED)


# --- the raw protocol ----------------------------------------------------------------


def test_names_are_the_policys() -> None:
    """The server file restates the variable names (it must import on its own):
    they are the policy's, and the tool's task bound is spec 15.2's."""
    assert mcp_server.AGENT_SOCKET_ENV == policy.ENV_AGENT_SOCKET
    assert mcp_server.AGENT_SKILL_ENV == policy.ENV_AGENT_SKILL
    assert mcp_server.MAX_TASK_BYTES == policy.ENCLAVE_MAX_TASK_BYTES


def test_without_the_agent_socket_the_tool_does_not_exist(tmp_path: Path) -> None:
    command = [str(agent_dir(tmp_path) / "bounded-query-mcp")]
    with silent_listener() as (path, listener):
        env = env_with_agent(tmp_path, None)
        env[policy.ENV_AGENT_SKILL] = str(agent_skill(tmp_path))  # a skill alone enables nothing
        env[policy.ENV_SOCKET] = path  # and a task never goes to the query broker
        with raw_server(command, env) as server:
            handshake(server)
            tools = server.ask(request(1, "tools/list"))["result"]["tools"]
            assert [t["name"] for t in tools] == NAMES
            called = server.ask(
                call(2, "bounded_agent", {"repo": "octo/alpha", "schema": SCHEMA, "task": "t"})
            )
            assert called["error"]["code"] == -32602
            listed = server.ask(request(3, "resources/list"))["result"]["resources"]
            assert [r["uri"] for r in listed] == ["bounded-query://SKILL.md"]
            read = server.ask(request(4, "resources/read", {"uri": "bounded-agent://SKILL.md"}))
            assert read["error"]["code"] == -32602
            init = server.ask(initialize(5))  # a second initialize is refused; era unchanged
            assert init["error"]["code"] == -32600
            _lines, stderr, status = server.close()
        contacted = was_contacted(listener)
    assert (stderr, status) == (b"", 0)
    assert not contacted


@pytest.mark.parametrize("where", ["agent-ingress", "query-ingress"])
def test_with_the_agent_socket_the_tool_asks_the_agent_broker(tmp_path: Path, where: str) -> None:
    """From either ingress's copy of the server: listed third, called with the
    object schema, the strict frame arrives with the compact bytes and the
    task verbatim; the result is the canonical body; the skill is readable."""
    bin_dir = agent_dir(tmp_path) if where == "agent-ingress" else wrapper_dir(tmp_path)
    limit = LIMIT if where == "agent-ingress" else policy.ENCLAVE_MAX_TASK_BYTES
    with recorded_server(Reply([http_reply(OK)])) as broker:
        env = env_with_agent(tmp_path, broker.path)
        with raw_server([str(bin_dir / "bounded-query-mcp")], env) as server:
            handshake(server)
            tools = server.ask(request(1, "tools/list"))["result"]["tools"]
            assert [t["name"] for t in tools] == [*NAMES, "bounded_agent"]
            agent_tool = tools[2]
            assert agent_tool["inputSchema"]["required"] == ["repo", "schema", "task"]
            assert agent_tool["inputSchema"]["additionalProperties"] is False
            branches = agent_tool["inputSchema"]["properties"]["schema"]["anyOf"]
            assert [b["type"] for b in branches] == ["object", "string"]
            answer = server.ask(
                call(2, "bounded_agent", {"repo": "octo/alpha", "schema": SCHEMA, "task": TASK})
            )["result"]
            assert answer["structuredContent"] == json.loads(OK)
            assert answer["content"] == [{"type": "text", "text": OK.decode()}]
            assert answer["isError"] is False
            listed = server.ask(request(3, "resources/list"))["result"]["resources"]
            assert [r["uri"] for r in listed] == [
                "bounded-query://SKILL.md",
                "bounded-agent://SKILL.md",
            ]
            read = server.ask(request(4, "resources/read", {"uri": "bounded-agent://SKILL.md"}))
            assert read["result"]["contents"][0]["text"] == AGENT_SKILL_TEXT
            init = server.ask(request(5, "ping"))
            assert init["result"] == {}
            _lines, stderr, status = server.close()
    assert (stderr, status) == (b"", 0)
    assert len(broker.requests) == 1
    frame = parse_agent_frame(broker.requests[0], limit)
    assert (frame.repo, frame.schema, frame.task) == ("octo/alpha", SCHEMA_BYTES, TASK.encode())
    assert broker.requests == [cli.build_agent_request("octo/alpha", SCHEMA_BYTES, TASK.encode())]


def test_the_agent_ingress_copy_also_serves_bounded_query(tmp_path: Path) -> None:
    """First on PATH, the agent ingress's server has only ``bounded-agent`` as its
    sibling: the same file, so ``bounded_query`` still frames the v2 query to
    the query socket (and a task still goes only to the agent socket)."""
    with (
        recorded_server(Reply([http_reply(OK)])) as query_broker,
        recorded_server(Reply([http_reply(OK)])) as agent_broker,
    ):
        env = env_with_agent(tmp_path, agent_broker.path)
        env[policy.ENV_SOCKET] = query_broker.path
        with raw_server([str(agent_dir(tmp_path) / "bounded-query-mcp")], env) as server:
            handshake(server)
            script = {"repo": "octo/alpha", "schema": SCHEMA, "script": "print(1)\n"}
            task = {"repo": "octo/alpha", "schema": SCHEMA, "task": TASK}
            for request_id, (tool, arguments) in enumerate(
                (("bounded_query", script), ("bounded_agent", task))
            ):
                answer = server.ask(call(request_id, tool, arguments))["result"]
                assert answer["structuredContent"] == json.loads(OK)
            server.close()
    assert query_broker.requests == [cli.build_request("octo/alpha", SCHEMA_BYTES, b"print(1)\n")]
    assert agent_broker.requests == [
        cli.build_agent_request("octo/alpha", SCHEMA_BYTES, TASK.encode())
    ]


def test_the_stateless_era_lists_and_calls_it_too(tmp_path: Path) -> None:
    with recorded_server(Reply([http_reply(OK)])) as broker:
        env = env_with_agent(tmp_path, broker.path)
        with raw_server([str(agent_dir(tmp_path) / "bounded-query-mcp")], env) as server:
            listed = server.ask(request(1, "tools/list", {"_meta": envelope()}))["result"]
            assert [t["name"] for t in listed["tools"]] == [*NAMES, "bounded_agent"]
            arguments = {"repo": "octo/alpha", "schema": SCHEMA, "task": TASK}
            answer = server.ask(call(2, "bounded_agent", arguments, envelope()))["result"]
            assert answer["structuredContent"] == json.loads(OK)
            assert answer["resultType"] == "complete"
            server.close()
    assert parse_agent_frame(broker.requests[0], LIMIT).schema == SCHEMA_BYTES


@pytest.mark.parametrize(
    ("arguments", "code"),
    [
        ({"repo": "octo/alpha", "schema": SCHEMA, "task": "x" * (LIMIT + 1)}, None),
        ({"repo": "octo/alpha", "schema": SCHEMA, "task": "\ud800"}, None),
        ({"repo": "octo/alpha", "schema": {"type": "\ud800"}, "task": "t"}, None),
        ({"repo": "octo/alpha", "schema": "x" * 4097, "task": "t"}, -32602),
        ({"repo": "octo/alpha", "schema": SCHEMA, "task": ""}, -32602),
        ({"repo": "octo/alpha", "schema": SCHEMA}, -32602),
        ({"repo": "octo/alpha", "schema": SCHEMA, "task": "t", "model": "x"}, -32602),
        ({"repo": "octo/alpha", "schema": SCHEMA, "task": 7}, -32602),
        ({"repo": "octo/alpha", "schema": 7, "task": "t"}, -32602),
        ({"repo": "a/b c", "schema": SCHEMA, "task": "t"}, None),
    ],
    ids=[
        "task-over-limit",
        "task-lone-surrogate",
        "schema-lone-surrogate",
        "schema-text-too-long",
        "task-empty",
        "task-missing",
        "extra-argument",
        "task-not-a-string",
        "schema-not-object-or-text",
        "repo-not-a-slug",
    ],
)
def test_bad_arguments_never_reach_the_broker(
    tmp_path: Path, arguments: dict[str, Any], code: int | None
) -> None:
    """Refused as the CLI refuses (the canonical error) or as a bad parameter
    (-32602); either way the agent broker is never contacted."""
    with silent_listener() as (path, listener):
        env = env_with_agent(tmp_path, path)
        with raw_server([str(agent_dir(tmp_path) / "bounded-query-mcp")], env) as server:
            handshake(server)
            reply = server.ask(call(1, "bounded_agent", arguments))
            server.close()
        contacted = was_contacted(listener)
    if code is None:
        assert reply["result"]["structuredContent"] == {"status": "error"}
    else:
        assert reply["error"]["code"] == code
    assert not contacted


def test_a_repeated_argument_is_refused(tmp_path: Path) -> None:
    line = (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"bounded_agent",'
        b'"arguments":{"repo":"octo/alpha","schema":{"type":"boolean"},"task":"a","task":"b"}}}\n'
    )
    with silent_listener() as (path, listener):
        env = env_with_agent(tmp_path, path)
        with raw_server([str(agent_dir(tmp_path) / "bounded-query-mcp")], env) as server:
            handshake(server)
            assert server.ask(line)["error"]["code"] == -32602
            server.close()
        assert not was_contacted(listener)


def test_the_agent_tool_on_a_real_python_3_8(tmp_path: Path) -> None:
    """The floor: the installed server and its ``bounded-agent`` sibling (with
    the ``bq_protocol`` facts and the limits file) under a real 3.8."""
    python38 = require_python38()
    bin_dir = agent_dir(tmp_path)
    with recorded_server(Reply([http_reply(OK)])) as broker:
        env = env_with_agent(tmp_path, broker.path)
        with raw_server([python38, str(bin_dir / "bounded-query-mcp")], env) as server:
            handshake(server)
            tools = server.ask(request(1, "tools/list"))["result"]["tools"]
            assert [t["name"] for t in tools] == [*NAMES, "bounded_agent"]
            arguments = {"repo": "octo/alpha", "schema": SCHEMA, "task": TASK}
            answer = server.ask(call(2, "bounded_agent", arguments))["result"]
            assert answer["structuredContent"] == json.loads(OK)
            over = {**arguments, "task": "x" * (LIMIT + 1)}
            refused = server.ask(call(3, "bounded_agent", over))["result"]
            assert refused["structuredContent"] == {"status": "error"}
            _lines, stderr, status = server.close()
    assert (stderr, status) == (b"", 0)
    assert broker.requests == [cli.build_agent_request("octo/alpha", SCHEMA_BYTES, TASK.encode())]


# --- the official Python SDK ------------------------------------------------------------


def texts(items: Any) -> list[str]:
    out = []
    for item in items:
        assert isinstance(item, (TextContent, TextResourceContents)), item
        out.append(item.text)
    return out


@pytest.mark.parametrize("mode", ["legacy", "auto", MODERN])
async def test_sdk_lists_calls_and_reads_the_agent_tool(tmp_path: Path, mode: str) -> None:
    bin_dir = agent_dir(tmp_path)
    hostile = http_reply(b'{"status":"ok","result":{"validated":true,"risk":"low"},"x":1}')
    for reply, expected in ((http_reply(OK), OK), (hostile, b'{"status":"error"}')):
        with recorded_server(Reply([reply])) as broker:
            params = StdioServerParameters(
                command=str(bin_dir / "bounded-query-mcp"),
                env=env_with_agent(tmp_path, broker.path),
            )
            async with Client(params, mode=mode) as client:
                listed = await client.list_tools()
                assert [tool.name for tool in listed.tools] == [*NAMES, "bounded_agent"]
                agent_tool = listed.tools[2]
                assert agent_tool.output_schema is not None
                answer = await client.call_tool(
                    "bounded_agent", {"repo": "octo/alpha", "schema": SCHEMA, "task": TASK}
                )
                assert not answer.is_error
                assert answer.structured_content == json.loads(expected)
                assert texts(answer.content) == [expected.decode()]
                read = await client.read_resource("bounded-agent://SKILL.md")
                assert texts(read.contents) == [AGENT_SKILL_TEXT]
                skill = await client.read_resource("bounded-query://SKILL.md")
                assert texts(skill.contents) == [SKILL_TEXT]
        frame = parse_agent_frame(broker.requests[0], LIMIT)
        assert (frame.schema, frame.task) == (SCHEMA_BYTES, TASK.encode())


async def test_sdk_without_the_agent_socket_sees_no_agent_tool(tmp_path: Path) -> None:
    params = StdioServerParameters(
        command=str(agent_dir(tmp_path) / "bounded-query-mcp"),
        env=env_with_agent(tmp_path, None),
    )
    async with Client(params, mode="legacy") as client:
        listed = await client.list_tools()
        assert [tool.name for tool in listed.tools] == NAMES
        resources = await client.list_resources()
        assert [str(r.uri) for r in resources.resources] == ["bounded-query://SKILL.md"]


# --- the MCP Inspector (Node.js) --------------------------------------------------------


def inspector(env: dict[str, str], cwd: Path, era: str, *args: str) -> Any:
    forwarded = [
        item
        for name in (*policy.AGENT_VARIABLES, *policy.AGENT_SUBSYSTEM_VARIABLES, DEADLINE_ENV)
        if name in env
        for item in ("-e", f"{name}={env[name]}")
    ]
    return run_client(
        [node_client("mcp-inspector"), "--cli", "--protocol-era", era, *forwarded, *args],
        env,
        cwd,
    )


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_inspector_lists_strict_clean_and_calls_with_an_object(tmp_path: Path, era: str) -> None:
    bin_dir = agent_dir(tmp_path)
    node_dir = os.path.dirname(node_client("mcp-inspector"))
    with recorded_server(Reply([http_reply(OK)])) as broker:
        env = env_with_agent(tmp_path, broker.path)
        env["PATH"] = f"{bin_dir}:{node_dir}:{os.environ['PATH']}"
        env["HOME"] = str(tmp_path)
        env["NO_COLOR"] = "1"
        listed = inspector(
            env, tmp_path, era, "bounded-query-mcp", "--strict", "--method", "tools/list"
        )
        assert listed.returncode == 0, listed.stderr
        assert "Warning" not in listed.stderr
        tools = json.loads(listed.stdout)["tools"]
        assert [t["name"] for t in tools] == [*NAMES, "bounded_agent"]
        done = inspector(
            env,
            tmp_path,
            era,
            "bounded-query-mcp",
            "--method",
            "tools/call",
            "--tool-name",
            "bounded_agent",
            "--tool-args-json",
            json.dumps({"repo": "octo/alpha", "schema": SCHEMA, "task": TASK}),
        )
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["structuredContent"] == json.loads(OK)
        assert answer.get("isError") is False
    assert broker.requests == [cli.build_agent_request("octo/alpha", SCHEMA_BYTES, TASK.encode())]
    parse_agent_frame(broker.requests[0], LIMIT)
