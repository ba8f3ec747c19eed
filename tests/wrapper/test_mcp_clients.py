"""Real Node.js MCP clients against ``bounded-query-mcp``.

* the MCP Inspector in CLI mode, in the handshake and the stateless era:
  ``tools/list`` clean under ``--strict``, ``tools/call`` of both tools,
  ``resources/read`` of the skill;
* Claude Code (``claude mcp list``) and Gemini CLI (``gemini mcp list``)
  report the server connected, configured with the snippets that
  ``bounded-query-harness mcp-config`` prints and the server found on PATH in
  the wrapper directory, as the agent would have it;
* Copilot CLI and Codex accept their snippets (``mcp get`` shows the server
  with the three variables; these two do not connect in ``mcp get``).

The clients come from ``.ci/install-test-tools`` (``$BQ_TEST_TOOLS``). A
missing client skips outside CI and fails under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bounded_query.broker.protocol import policy
from bounded_query.harness.staging.mcp_config import render_mcp_config
from bounded_query.wrapper import bounded_query_cli as cli
from tests.wrapper.fakes import Reply, http_reply, recorded_server
from tests.wrapper.mcp_fixtures import BOOLEAN, SKILL_TEXT, server_env, skill_file, wrapper_dir

TOOLS_DIR = Path(os.environ.get("BQ_TEST_TOOLS", "/opt/bq-test-tools"))
#: The clients start quickly; this is a safety net for a hung one.
CLIENT_TIMEOUT_S = 180
OK = b'{"status":"ok","result":{"tag":"x","value":7}}'


def client(name: str) -> str:
    path = TOOLS_DIR / "node_modules" / ".bin" / name
    if path.exists() and shutil.which("node"):
        return str(path)
    reason = f"{name} is not installed in {TOOLS_DIR}: run .ci/install-test-tools"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def agent_env(tmp_path: Path, socket_path: str | None) -> tuple[dict[str, str], Path]:
    """The agent's view: wrapper directory first on PATH, the three variables, a fresh HOME."""
    bin_dir = wrapper_dir(tmp_path)
    home = tmp_path / "home"
    (home / "project").mkdir(parents=True)
    env = server_env(socket_path, skill_file(tmp_path))
    env["AWF_BOUNDED_QUERY_REPOS"] = "octo/alpha"
    node_dir = os.path.dirname(shutil.which("node") or "/usr/bin/node")
    env.update(
        {
            "HOME": str(home),
            "PATH": f"{bin_dir}:{node_dir}:/usr/bin:/bin",
            "NO_COLOR": "1",
            "CI": "true",
        }
    )
    return env, home


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S,
        check=False,
        stdin=subprocess.DEVNULL,
    )


# ---------------------------------------------------------------------------
# MCP Inspector, CLI mode

ERAS = ["legacy", "modern", "auto"]


def inspector(env, home, era, *args):
    """The Inspector passes the server only a safe default environment: the three
    variables go in with ``-e`` (as a client configuration's ``env`` would)."""
    forwarded = [
        item
        for name in policy.AGENT_VARIABLES
        if name in env
        for item in ("-e", f"{name}={env[name]}")
    ]
    return run(
        [
            client("mcp-inspector"),
            "--cli",
            "--protocol-era",
            era,
            *forwarded,
            "bounded-query-mcp",
            *args,
        ],
        env,
        home / "project",
    )


@pytest.mark.parametrize("era", ERAS)
def test_inspector_lists_tools_strict_clean(tmp_path, era):
    env, home = agent_env(tmp_path, None)
    done = inspector(env, home, era, "--strict", "--method", "tools/list")
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr
    assert "0 errors" in done.stderr or done.stderr.strip() == "", done.stderr
    tools = json.loads(done.stdout)["tools"]
    assert [t["name"] for t in tools] == ["bounded_query", "bounded_query_cost"]


@pytest.mark.parametrize("era", ERAS)
def test_inspector_calls_both_tools_and_reads_the_skill(tmp_path, era):
    with recorded_server(Reply([http_reply(OK)])) as broker:
        env, home = agent_env(tmp_path, broker.path)
        question = {"repo": "octo/alpha", "schema": BOOLEAN, "script": "print(1)\n"}
        done = inspector(
            env,
            home,
            era,
            "--method",
            "tools/call",
            "--tool-name",
            "bounded_query",
            "--tool-args-json",
            json.dumps(question),
        )
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["structuredContent"] == json.loads(OK)
        assert answer["content"] == [{"type": "text", "text": OK.decode()}]
        assert answer.get("isError") is False
        done = inspector(
            env,
            home,
            era,
            "--method",
            "tools/call",
            "--tool-name",
            "bounded_query_cost",
            "--tool-args-json",
            json.dumps({"schema": BOOLEAN}),
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["structuredContent"]["chargeBits"] == 5
        done = inspector(
            env, home, era, "--method", "resources/read", "--uri", "bounded-query://SKILL.md"
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["contents"][0]["text"] == SKILL_TEXT
    assert len(broker.requests) == 1


@pytest.mark.parametrize("era", ERAS)
def test_inspector_sends_the_schema_as_an_object(tmp_path, era):
    """The declared object form (issue 21 item 1) from a Node.js client: the
    broker receives the object's compact bytes, as the CLI frames that text."""
    schema = {"type": "enum", "values": ["\u00e9t\u00e9", "hiver"]}
    text = json.dumps(schema, ensure_ascii=False, separators=(",", ":")).encode()
    with recorded_server(Reply([http_reply(OK)])) as broker:
        env, home = agent_env(tmp_path, broker.path)
        for tool, arguments in (
            ("bounded_query", {"repo": "octo/alpha", "schema": schema, "script": "print(1)\n"}),
            ("bounded_query_cost", {"schema": schema}),
        ):
            done = inspector(
                env,
                home,
                era,
                "--method",
                "tools/call",
                "--tool-name",
                tool,
                "--tool-args-json",
                json.dumps(arguments),
            )
            assert done.returncode == 0, done.stderr
            content = json.loads(done.stdout)["structuredContent"]
            if tool == "bounded_query":
                assert content == json.loads(OK)
            else:
                assert (content["valid"], content["schemaBytes"]) == (True, len(text))
    assert broker.requests == [cli.build_request("octo/alpha", text, b"print(1)\n")]


# ---------------------------------------------------------------------------
# Agent CLIs, configured with the mcp-config snippets


def server_object(name: str) -> dict:
    return json.loads(render_mcp_config(name))["mcpServers"]["bounded-query"]


def test_claude_code_reports_the_server_connected(tmp_path):
    claude = client("claude")
    env, home = agent_env(tmp_path, None)
    project = home / "project"
    added = run(
        [
            claude,
            "mcp",
            "add-json",
            "--scope",
            "user",
            "bounded-query",
            json.dumps(server_object("claude")),
        ],
        env,
        project,
    )
    assert added.returncode == 0, added.stdout + added.stderr
    listed = run([claude, "mcp", "list"], env, project)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    line = next(x for x in listed.stdout.splitlines() if x.startswith("bounded-query:"))
    assert "bounded-query-mcp" in line
    assert "Connected" in line, listed.stdout


def test_claude_code_reports_a_broken_server_as_failed(tmp_path):
    """Control: the health check really runs the command (a wrong one fails)."""
    claude = client("claude")
    env, home = agent_env(tmp_path, None)
    broken = {**server_object("claude"), "command": "bounded-query"}  # the CLI, not MCP
    run(
        [claude, "mcp", "add-json", "--scope", "user", "bounded-query", json.dumps(broken)],
        env,
        home / "project",
    )
    listed = run([claude, "mcp", "list"], env, home / "project")
    line = next(x for x in listed.stdout.splitlines() if x.startswith("bounded-query:"))
    assert "Connected" not in line, listed.stdout


def test_gemini_cli_reports_the_server_connected(tmp_path):
    gemini = client("gemini")
    env, home = agent_env(tmp_path, None)
    project = home / "project"
    (home / ".gemini").mkdir()
    (home / ".gemini" / "settings.json").write_text(render_mcp_config("gemini"))
    (home / ".gemini" / "trustedFolders.json").write_text(
        json.dumps({str(project): "TRUST_FOLDER"})
    )
    listed = run([gemini, "mcp", "list"], env, project)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    text = listed.stdout + listed.stderr
    line = next(x for x in text.splitlines() if "bounded-query:" in x)
    assert "bounded-query-mcp" in line
    assert "Connected" in line, text
    assert "Disconnected" not in line


@pytest.mark.parametrize(
    ("name", "config"), [("copilot", ".copilot/mcp-config.json"), ("codex", ".codex/config.toml")]
)
def test_copilot_and_codex_accept_their_snippets(tmp_path, name, config):
    binary = client(name)
    env, home = agent_env(tmp_path, None)
    target = home / config
    target.parent.mkdir(parents=True)
    target.write_text(render_mcp_config(name))
    shown = run([binary, "mcp", "get", "bounded-query"], env, home / "project")
    text = shown.stdout + shown.stderr
    assert shown.returncode == 0, text
    assert "bounded-query-mcp" in text
    for variable in policy.AGENT_VARIABLES:
        assert variable in text
    assert "stdio" in text or "local" in text
