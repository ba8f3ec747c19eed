"""The official Python SDK client (``mcp`` on PyPI) against ``bounded-query-mcp``.

Both protocol eras: ``mode="legacy"`` (the ``initialize`` handshake; the SDK
offers 2025-11-25), ``mode="auto"`` (the SDK probes ``server/discover`` first
and must settle on the stateless 2026-07-28 revision) and the pinned
``mode="2026-07-28"``. In each: list the tools, call both, read the skill
resource. The server is the harness's verbatim copy in a wrapper directory;
the broker is a recorded fake socket whose request bytes are checked against
the CLI wrapper's framing of the same question.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from mcp import Client, StdioServerParameters
from mcp.types import TextContent, TextResourceContents

from bounded_query.broker import protocol
from bounded_query.wrapper import bounded_query_cli as cli
from tests.wrapper.fakes import Reply, http_reply, recorded_server
from tests.wrapper.mcp_fixtures import (
    BOOLEAN,
    MODERN,
    SKILL_TEXT,
    server_env,
    skill_file,
    wrapper_dir,
)

MODES = {"legacy": "2025-11-25", "auto": MODERN, MODERN: MODERN}
OK = b'{"status":"ok","result":{"tag":"major","value":[2,"\xc3\xa9\\n"]}}'
SCRIPT = 'import json\njson.dump(True, open("/query/out", "w"))\n'


def texts(items: Sequence[object]) -> list[str]:
    """The text of every item; any other kind of content fails the test."""
    out = []
    for item in items:
        assert isinstance(item, (TextContent, TextResourceContents)), item
        out.append(item.text)
    return out


def params(tmp_path, socket_path):
    bin_dir = wrapper_dir(tmp_path)
    return StdioServerParameters(
        command=str(bin_dir / "bounded-query-mcp"),
        env=server_env(socket_path, skill_file(tmp_path)),
    )


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_sdk_lists_calls_and_reads(tmp_path, mode):
    with recorded_server(Reply([http_reply(OK)])) as broker:
        async with Client(params(tmp_path, broker.path), mode=mode) as client:
            assert client.protocol_version == MODES[mode]
            listed = await client.list_tools()
            names = [tool.name for tool in listed.tools]
            assert names == ["bounded_query", "bounded_query_cost"]
            for tool in listed.tools:
                assert tool.input_schema["additionalProperties"] is False
                assert tool.output_schema is not None

            answer = await client.call_tool(
                "bounded_query", {"repo": "octo/alpha", "schema": BOOLEAN, "script": SCRIPT}
            )
            assert not answer.is_error
            assert answer.structured_content == json.loads(OK)
            assert texts(answer.content) == [OK.decode()]

            cost = await client.call_tool("bounded_query_cost", {"schema": BOOLEAN})
            assert not cost.is_error
            charge = protocol.charge(protocol.parse_schema({"type": "boolean"}))
            assert cost.structured_content["chargeBits"] == charge == 5
            assert cost.structured_content["valid"] is True

            resources = await client.list_resources()
            assert [str(r.uri) for r in resources.resources] == ["bounded-query://SKILL.md"]
            read = await client.read_resource("bounded-query://SKILL.md")
            assert texts(read.contents) == [SKILL_TEXT]
        # Exactly one broker request, byte-identical to the CLI's for the same question.
        assert broker.requests == [
            cli.build_request("octo/alpha", BOOLEAN.encode(), SCRIPT.encode())
        ]


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_sdk_sees_the_canonical_error_and_invalid_cost(tmp_path, mode):
    hostile = http_reply(b'{"status":"ok","result":1.0}')  # not canonical: error
    with recorded_server(Reply([hostile])) as broker:
        async with Client(params(tmp_path, broker.path), mode=mode) as client:
            answer = await client.call_tool(
                "bounded_query", {"repo": "octo/alpha", "schema": BOOLEAN, "script": SCRIPT}
            )
            assert not answer.is_error
            assert answer.structured_content == {"status": "error"}
            assert texts(answer.content) == ['{"status":"error"}']
            cost = await client.call_tool("bounded_query_cost", {"schema": '{"type":"nope"}'})
            assert not cost.is_error
            assert cost.structured_content["valid"] is False
            assert "error" in cost.structured_content
        assert len(broker.requests) == 1


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_sdk_sends_the_schema_as_an_object(tmp_path, mode):
    """The declared form (issue 21 item 1): the SDK passes the object through, the
    server sends its compact UTF-8 bytes, byte-identical to the CLI's request for
    that text; the cost tool judges it as it judges the text."""
    schema = {
        "type": "object",
        "fields": {"ok": {"type": "boolean"}, "n": {"type": "enum", "values": ["\u00e9", "b"]}},
    }
    text = json.dumps(schema, ensure_ascii=False, separators=(",", ":")).encode()
    with recorded_server(Reply([http_reply(OK)])) as broker:
        async with Client(params(tmp_path, broker.path), mode=mode) as client:
            listed = await client.list_tools()
            for tool in listed.tools:
                branches = tool.input_schema["properties"]["schema"]["anyOf"]
                assert [branch["type"] for branch in branches] == ["object", "string"]
            answer = await client.call_tool(
                "bounded_query", {"repo": "octo/alpha", "schema": schema, "script": SCRIPT}
            )
            assert not answer.is_error
            assert answer.structured_content == json.loads(OK)
            as_object = await client.call_tool("bounded_query_cost", {"schema": schema})
            as_text = await client.call_tool("bounded_query_cost", {"schema": text.decode()})
            assert as_object.structured_content == as_text.structured_content
            assert as_object.structured_content["valid"] is True
            assert as_object.structured_content["schemaBytes"] == len(text)
            charge = protocol.charge(protocol.parse_schema(schema))
            assert as_object.structured_content["chargeBits"] == charge
            bad = await client.call_tool("bounded_query_cost", {"schema": {"type": "nope"}})
            assert bad.structured_content["valid"] is False
    assert broker.requests == [cli.build_request("octo/alpha", text, SCRIPT.encode())]
