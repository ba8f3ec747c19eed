"""Client configuration for ``bounded-query-mcp`` (spec 14.8).

Pure: :func:`render_mcp_config` returns the snippet one MCP client expects for
a local stdio server named ``bounded-query`` that runs ``bounded-query-mcp``
with the three agent variables (``AWF_BOUNDED_QUERY_SOCKET``,
``AWF_BOUNDED_QUERY_SKILL``, ``AWF_BOUNDED_QUERY_REPOS``).

By default the snippet forwards the variables from the client's own
environment, which the harness sets for the agent, so one snippet serves
every run: ``${VAR}`` references for Claude Code, Copilot CLI and Gemini CLI
(each expands them when it starts the server), ``env_vars`` for Codex (which
passes only the variables it is told to). Explicit values replace the
references with literal strings.

Where each snippet goes (:data:`CONFIG_FILES`): Claude Code ``.mcp.json`` in
the project (or ``claude mcp add-json``), Copilot CLI
``~/.copilot/mcp-config.json``, Codex ``~/.codex/config.toml``, Gemini CLI
``.gemini/settings.json`` (in a trusted folder) or ``~/.gemini/settings.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from bounded_query.broker.protocol import policy

__all__ = [
    "AGENT_SERVER_NAME",
    "CLIENTS",
    "CONFIG_FILES",
    "SERVER_COMMAND",
    "SERVER_NAME",
    "render_mcp_config",
    "server_env",
]

#: The name the server is registered under in every client.
SERVER_NAME = "bounded-query"
#: The name of the same server registered for the bounded-agent subsystem
#: (forwarding its three variables: ``AWF_BOUNDED_AGENT_*``).
AGENT_SERVER_NAME = "bounded-agent"

#: The MCP server as the agent sees it: first on PATH from the wrapper directory.
SERVER_COMMAND = "bounded-query-mcp"


#: The supported clients and where their snippet goes.
CONFIG_FILES: Mapping[str, str] = {
    "claude": ".mcp.json (project) or: claude mcp add-json bounded-query '<the server object>'",
    "copilot": "~/.copilot/mcp-config.json",
    "codex": "~/.codex/config.toml",
    "gemini": ".gemini/settings.json (trusted folder) or ~/.gemini/settings.json",
}
CLIENTS = tuple(CONFIG_FILES)


def server_env(
    values: Mapping[str, str] | None = None,
    variables: Sequence[str] = policy.AGENT_VARIABLES,
) -> dict[str, str]:
    """Each of ``variables`` mapped to its literal value, or to a ``${VAR}`` reference.

    Raises:
        ValueError: ``values`` names a variable that is not one of ``variables``.
    """
    given = dict(values or {})
    unknown = sorted(set(given) - set(variables))
    if unknown:
        raise ValueError(f"not an agent variable: {', '.join(unknown)}")
    return {name: given.get(name, "${" + name + "}") for name in variables}


def _toml_string(value: str) -> str:
    """A TOML basic string: JSON's escaping (``\\``, ``\"``, control characters as
    ``\\uXXXX``) is TOML's, except that TOML also wants DEL escaped; non-ASCII
    stays literal (a JSON surrogate-pair escape is not valid TOML)."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _codex(command: str, values: Mapping[str, str], name: str, variables: Sequence[str]) -> str:
    lines = [
        f"[mcp_servers.{name}]",
        f"command = {_toml_string(command)}",
        "args = []",
    ]
    forwarded = [v for v in variables if v not in values]
    if forwarded:
        lines.append("env_vars = [" + ", ".join(_toml_string(n) for n in forwarded) + "]")
    if values:
        lines += ["", f"[mcp_servers.{name}.env]"]
        lines += [f"{v} = {_toml_string(values[v])}" for v in variables if v in values]
    return "\n".join(lines) + "\n"


def render_mcp_config(
    client: str,
    *,
    command: str = SERVER_COMMAND,
    values: Mapping[str, str] | None = None,
    server_name: str = SERVER_NAME,
    variables: Sequence[str] = policy.AGENT_VARIABLES,
) -> str:
    """The configuration snippet for ``client`` (one of :data:`CLIENTS`).

    ``values`` gives literal values for some of ``variables`` (default: the
    query subsystem's three); the others are forwarded from the client's
    environment. ``server_name`` is the registration's name
    (:data:`AGENT_SERVER_NAME` for the bounded-agent subsystem's).

    Raises:
        ValueError: an unknown client, an empty command or an unknown variable.
    """
    if client not in CONFIG_FILES:
        raise ValueError(f"unknown client {client!r}: expected one of {', '.join(CLIENTS)}")
    if not command:
        raise ValueError("the server command is empty")
    literal = dict(values or {})
    env = server_env(literal, variables)
    if client == "codex":
        return _codex(command, literal, server_name, variables)
    server: dict[str, object] = {"command": command, "args": [], "env": env}
    if client == "claude":
        server = {"type": "stdio", **server}
    elif client == "copilot":
        server = {"type": "local", **server, "tools": ["*"]}
    return json.dumps({"mcpServers": {server_name: server}}, indent=2) + "\n"
