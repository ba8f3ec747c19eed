"""End to end: an agent in its container calls the MCP server, which reaches the
real broker and a real query container (spec 14.6-14.8, issue 13).

``bounded-query-harness run`` (the real ``run``: staging, the real
``bounded-query-broker`` with the docker runtime, the agent container) runs an
agent that drives ``bounded-query-mcp`` from its PATH over stdio with a plain
stdlib JSON-RPC client: one question in the handshake era, one in the
stateless era, the cost tool and the skill resource. The answers must be the
canonical ones and the ledger must show exactly the two charges.
"""

from __future__ import annotations

import io
import json
import os

import pytest

from bounded_query.broker import protocol
from bounded_query.harness import RunOptions, run
from bounded_query.harness.records.events import EventSink
from tests.harness.bq_harness_helpers import make_repo, var_tmp_base

pytestmark = pytest.mark.engine

SCHEMA = {
    "type": "object",
    "fields": {
        "readme": {"type": "boolean"},
        "commits": {"type": "integer", "minimum": 0, "maximum": 15},
    },
}
SCRIPT = (
    "import json, os, subprocess\n"
    "n = int(subprocess.run(['git', '-C', '/query/repo', 'rev-list', '--count', 'HEAD'],\n"
    "                       capture_output=True, text=True).stdout)\n"
    "json.dump({'readme': os.path.exists('/query/repo/README.md'), 'commits': n},\n"
    "          open('/query/out', 'w'))\n"
)
#: The agent: a stdlib JSON-RPC client (what an MCP client does over stdio).
DRIVER = r"""
import json, subprocess, sys
question, out = json.load(open(sys.argv[1])), sys.argv[2]
META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}}

class Server:
    def __init__(self):
        self.p = subprocess.Popen(["bounded-query-mcp"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.n = 0
    def send(self, msg):
        self.p.stdin.write(json.dumps(msg).encode() + b"\n")
        self.p.stdin.flush()
    def ask(self, method, params):
        self.n += 1
        self.send({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params})
        return json.loads(self.p.stdout.readline())
    def close(self):
        self.p.stdin.close()
        rest = self.p.stdout.read()
        return self.p.wait(), rest, self.p.stderr.read()

report = {}
legacy = Server()
report["init"] = legacy.ask("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                           "clientInfo": {"name": "e2e", "version": "0"}})
legacy.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
report["cost"] = legacy.ask("tools/call", {"name": "bounded_query_cost",
                                           "arguments": {"schema": question["schema"]}})
report["legacy"] = legacy.ask("tools/call", {"name": "bounded_query", "arguments": question})
report["skill"] = legacy.ask("resources/read", {"uri": "bounded-query://SKILL.md"})
status, rest, err = legacy.close()
report["legacy_exit"] = [status, rest.decode(), err.decode()]
modern = Server()
report["discover"] = modern.ask("server/discover", {"_meta": META})
# The stateless era sends the schema as an object (the declared form).
as_object = dict(question, schema=json.loads(question["schema"]))
report["modern"] = modern.ask("tools/call", {"name": "bounded_query", "arguments": as_object,
                                             "_meta": META})
status, rest, err = modern.close()
report["modern_exit"] = [status, rest.decode(), err.decode()]
json.dump(report, open(out, "w"))
"""


@pytest.fixture
def engine(docker_client):
    for image in ("bounded-query-python:latest", "bounded-query-agent:latest"):
        try:
            docker_client.images.get(image)
        except Exception:
            pytest.fail(f"{image} is missing: run `make images`")
    return docker_client


async def test_mcp_tool_call_reaches_the_real_broker_and_is_charged(engine):
    with var_tmp_base() as base:
        source = base / "src"
        make_repo(source, {"README.md": "hello\n"}, commits=3)
        workspace = base / "ws"
        workspace.mkdir()
        (workspace / "driver.py").write_text(DRIVER)
        question = {"repo": "octo/alpha", "schema": json.dumps(SCHEMA), "script": SCRIPT}
        (workspace / "question.json").write_text(json.dumps(question))
        os.chmod(workspace, 0o777)
        config = base / "config.json"
        config.write_text(
            json.dumps(
                {
                    "boundedQueries": {
                        "enabled": True,
                        "privateRepos": [{"repo": "octo/alpha", "sensitivity": "internal"}],
                    }
                }
            )
        )
        state = base / "state"
        state.mkdir(mode=0o755)
        stream = io.StringIO()
        options = RunOptions(
            config_source=str(config),
            agent=(
                "python3",
                f"{workspace}/driver.py",
                f"{workspace}/question.json",
                f"{workspace}/report.json",
            ),
            seed_sources={"octo/alpha": source},
            workspace=workspace,
            base=state,
        )
        status = await run(options, EventSink(stream), {"PATH": os.environ["PATH"]})
        events = [json.loads(line) for line in stream.getvalue().splitlines()]
        assert status == 0, events
        report = json.loads((workspace / "report.json").read_text())
    ok = {"status": "ok", "result": {"readme": True, "commits": 3}}
    for era in ("legacy", "modern"):
        result = report[era]["result"]
        assert result["structuredContent"] == ok, report[era]
        assert json.loads(result["content"][0]["text"]) == ok
        assert result["isError"] is False
        assert report[f"{era}_exit"] == [0, "", ""]
    assert report["init"]["result"]["protocolVersion"] == "2025-06-18"
    assert report["discover"]["result"]["supportedVersions"] == ["2026-07-28"]
    charge = protocol.charge(protocol.parse_schema(SCHEMA))
    assert report["cost"]["result"]["structuredContent"]["chargeBits"] == charge == 9
    skill = report["skill"]["result"]["contents"][0]["text"]
    assert "octo/alpha" in skill
    # The ledger: both questions (schema as text, then as an object: the same
    # charge), and only they, were charged.
    usage = next(e for e in events if e["event"] == "repo_usage")
    assert usage["spent"] == 2 * charge
    assert usage["invocations"] == 2
