"""``bounded-query-harness mcp-config``: each client's snippet parses and says the
same thing (the real clients read them in ``test_mcp_clients.py``)."""

from __future__ import annotations

import json
import tomllib

import pytest

from bounded_query.broker.protocol import policy
from bounded_query.harness.__main__ import main
from bounded_query.harness.staging.mcp_config import (
    AGENT_SERVER_NAME,
    CLIENTS,
    SERVER_NAME,
    render_mcp_config,
    server_env,
)

REFERENCES = {name: "${" + name + "}" for name in policy.AGENT_VARIABLES}


def parsed(client: str, **kwargs) -> dict:
    text = render_mcp_config(client, **kwargs)
    if client == "codex":
        return tomllib.loads(text)["mcp_servers"]["bounded-query"]
    return json.loads(text)["mcpServers"]["bounded-query"]


@pytest.mark.parametrize("client", ["claude", "copilot", "gemini"])
def test_json_clients_forward_the_three_variables_by_reference(client):
    server = parsed(client)
    assert server["command"] == "bounded-query-mcp"
    assert server["args"] == []
    assert server["env"] == REFERENCES
    assert server.get("type") == {"claude": "stdio", "copilot": "local", "gemini": None}[client]
    if client == "copilot":
        assert server["tools"] == ["*"]


def test_codex_forwards_the_variables_with_env_vars():
    server = parsed("codex")
    assert server == {
        "command": "bounded-query-mcp",
        "args": [],
        "env_vars": list(policy.AGENT_VARIABLES),
    }


WEIRD = 'C:\\a "b"\t\u00e9\U0001f600\x7f\x01/run'


@pytest.mark.parametrize("client", CLIENTS)
def test_literal_values_survive_each_format_exactly(client):
    values = {"AWF_BOUNDED_QUERY_SOCKET": WEIRD, "AWF_BOUNDED_QUERY_REPOS": "a/b,c/d"}
    server = parsed(client, command="/opt/x y/bounded-query-mcp", values=values)
    assert server["command"] == "/opt/x y/bounded-query-mcp"
    if client == "codex":
        assert server["env"] == values
        assert server["env_vars"] == ["AWF_BOUNDED_QUERY_SKILL"]
    else:
        assert server["env"] == {**REFERENCES, **values}


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="unknown client"):
        render_mcp_config("vscode")
    with pytest.raises(ValueError, match="empty"):
        render_mcp_config("claude", command="")
    with pytest.raises(ValueError, match="not an agent variable"):
        server_env({"GH_TOKEN": "x"})


@pytest.mark.parametrize("client", CLIENTS)
def test_the_subcommand_prints_the_snippet(client, capsys):
    assert main(["mcp-config", "--client", client, "--socket", "/run/s.sock"]) == 0
    out = capsys.readouterr().out
    assert out == render_mcp_config(client, values={"AWF_BOUNDED_QUERY_SOCKET": "/run/s.sock"})


def test_the_subcommand_refuses_an_unknown_client(capsys):
    assert main(["mcp-config", "--client", "vscode"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_skill_md_shows_every_clients_snippet():
    from bounded_query.harness.staging.skill import render_skill
    from tests.harness.test_harness_outputs import CONFIG

    text = render_skill(CONFIG)
    assert "## From an MCP client" in text
    for client in CLIENTS:
        assert render_mcp_config(client).rstrip("\n") in text
    assert "bounded-query://SKILL.md" in text


def test_readme_shows_the_rendered_claude_snippet():
    from tests.wrapper.fakes import REPO_ROOT

    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Use it from an MCP client" in readme
    assert render_mcp_config("claude").rstrip("\n") in readme
    for client in CLIENTS:
        assert f"mcp-config --client {client}" in readme


@pytest.mark.parametrize("client", CLIENTS)
def test_the_agent_registration_forwards_only_the_agent_variables(client):
    """The bounded-agent skill's snippet: its own server name and its three
    variables; a query variable given as a literal is refused."""
    variables = policy.AGENT_SUBSYSTEM_VARIABLES
    text = render_mcp_config(client, server_name=AGENT_SERVER_NAME, variables=variables)
    for name in variables:
        assert name in text
    for name in policy.AGENT_VARIABLES:
        assert name not in text
    servers = (
        tomllib.loads(text)["mcp_servers"] if client == "codex" else json.loads(text)["mcpServers"]
    )
    assert list(servers) == [AGENT_SERVER_NAME] != [SERVER_NAME]
    with pytest.raises(ValueError, match="not an agent variable"):
        render_mcp_config(client, variables=variables, values={policy.ENV_SOCKET: "/x"})
