"""``bounded-query-harness``: the host-side command (spec 14.2, 14.6, 14.8).

Subcommands:

* ``validate --config FILE|-``: load and validate only (exit 0 or 2);
* ``run --config FILE [--seed-source owner/repo=PATH ...] -- AGENT...``:
  validate, preflight, stage, start the broker, run the agent, tear down.
  The agent runs confined (README "Confinement"): in its own container
  (``--agent-image``, ``--agent-network``, ``--agent-user UID[:GID]``), or
  with ``--agent-on-host --agent-user`` as a checked unprivileged host user;
  ``--agent-on-host --unconfined-agent`` keeps the harness's uid, degraded;
* ``compose --config FILE --out DIR``: stage and write a compose project;
* ``demo``: the built-in example end to end;
* ``mcp-config --client claude|copilot|codex|gemini``: print that client's
  configuration for the ``bounded-query-mcp`` server (``harness/staging/mcp_config.py``).

Exit codes (seed 000 section 5.3): the agent's status for ``run``; 0 success;
1 run failure; 2 invocation or infrastructure failure (bad configuration,
failed preflight or staging, broker that never became ready).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from bounded_query.broker.protocol import policy
from bounded_query.broker.protocol.policy import DEFAULT_AGENT_IMAGE, DEFAULT_IMAGE
from bounded_query.harness.agent.spec import (
    AGENT_NETWORK_DEFAULT,
    DEFAULT_AGENT_UID,
    AgentUser,
    parse_agent_user,
)
from bounded_query.harness.configuration.channel_policy import ALLOW_FLAG, REMOVED_FLAG
from bounded_query.harness.lifecycle.options import EXIT_HARNESS, RunOptions
from bounded_query.harness.lifecycle.orchestrate import run
from bounded_query.harness.lifecycle.paths import DEFAULT_BASE
from bounded_query.harness.records.events import EventSink, append_step_summary
from bounded_query.harness.records.notices import load_reported

__all__ = ["EXIT_HARNESS", "build_parser", "main"]


def _cmd_validate(args: argparse.Namespace, sink: EventSink) -> int:
    loaded = load_reported(args.config, sink)
    if loaded is None:
        return EXIT_HARNESS
    config = loaded.config
    summary = {
        "valid": True,
        "enabled": config.enabled,
        "privateRepos": [
            {"repo": r.repo, "sensitivity": r.sensitivity, "budgetBits": r.budget}
            for r in config.private_repos
        ],
        "runtime": config.runtime,
        "timeout": config.timeout,
        "memoryLimit": config.memory_limit,
        "interpreter": config.interpreter,
        "maxInvocations": config.max_invocations,
        "warnings": list(loaded.warnings),
    }
    agents = loaded.agents
    if agents.enabled:
        summary["boundedAgents"] = {
            "enabled": True,
            "privateRepos": [
                {"repo": r.repo, "sensitivity": r.sensitivity, "budgetBits": r.budget}
                for r in agents.private_repos
            ],
            "runtime": agents.runtime,
            "engine": agents.engine,
            "model": agents.model,
            "timeout": agents.timeout,
            "maxInvocations": agents.max_invocations,
            "maxModelRequests": agents.max_model_requests,
            "maxModelTokens": agents.max_model_tokens,
            # where the proxy sends the model calls (never a credential)
            "target": None if agents.target is None else agents.target.url,
        }
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0


class UsageError(ValueError):
    """A malformed command line (caller's fault; exit 2)."""


def parse_seed_sources(items: Sequence[str]) -> dict[str, Path]:
    """Parse repeated ``owner/repo=PATH`` options, keyed by lowercased slug.

    Raises:
        UsageError: no ``=``, an unsafe slug, an empty path or a repeated slug.
    """
    out: dict[str, Path] = {}
    for item in items:
        slug, sep, path = item.partition("=")
        if not sep or not path or policy.SLUG_RE.fullmatch(slug) is None:
            raise UsageError(f"--seed-source {item!r}: expected owner/repo=PATH")
        key = slug.lower()
        if key in out:
            raise UsageError(f"--seed-source {slug}: given twice")
        out[key] = Path(path).absolute()
    return out


def _agent_argv(raw: Sequence[str]) -> tuple[str, ...]:
    argv = list(raw)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("missing agent command: run --config FILE -- COMMAND [ARGS...]")
    return tuple(argv)


def _agent_user(args: argparse.Namespace) -> AgentUser | None:
    raw = getattr(args, "agent_user", None)
    if raw is None:
        return None
    try:
        return parse_agent_user(raw)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _egress_network(args: argparse.Namespace) -> str | None:
    raw = getattr(args, "api_proxy_egress_network", None)
    if raw is None:
        return None
    from bounded_query.harness.configuration.agent_preflight import validate_network_name

    try:
        return validate_network_name(raw)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _run_options(args: argparse.Namespace, agent: tuple[str, ...]) -> RunOptions:
    if getattr(args, "allow_runc_mixed_sensitivity", False):
        raise UsageError(
            f"{REMOVED_FLAG} was renamed {ALLOW_FLAG}: it now covers every run whose"
            " repositories share the host (two metered repositories too), on any runtime"
        )
    return RunOptions(
        agent_on_host=getattr(args, "agent_on_host", False),
        agent_user=_agent_user(args),
        unconfined_agent=getattr(args, "unconfined_agent", False),
        agent_image=getattr(args, "agent_image", DEFAULT_AGENT_IMAGE),
        agent_network=getattr(args, "agent_network", AGENT_NETWORK_DEFAULT),
        allow_insecure_server=args.allow_insecure_server_url,
        allow_open_channels=getattr(args, "allow_cross_invocation_channels", False),
        allow_insecure_api_target=getattr(args, "allow_insecure_api_target", False),
        api_proxy_egress_network=_egress_network(args),
        config_source=args.config,
        agent=agent,
        seed_sources=parse_seed_sources(args.seed_source),
        workspace=Path(args.workspace).absolute(),
        agent_mounts=tuple(Path(p).absolute() for p in args.agent_mount),
        image=args.image,
        base=Path(args.state_base),
        keep_state=(
            Path(args.keep_state).absolute() if getattr(args, "keep_state", None) else None
        ),
    )


def _cmd_run(args: argparse.Namespace, sink: EventSink) -> int:
    try:
        options = _run_options(args, _agent_argv(args.agent))
    except UsageError as exc:
        sink.emit("usage_error", message=str(exc))
        return EXIT_HARNESS
    if args.compose:
        from bounded_query.harness.compose.service import compose_broker_starter

        return trio.run(run, options, sink, None, compose_broker_starter(args.compose_project))
    return trio.run(run, options, sink)


def _cmd_compose(args: argparse.Namespace, sink: EventSink) -> int:
    from bounded_query.harness.compose.project import compose_up

    try:
        options = _run_options(args, ("true",))
    except UsageError as exc:
        sink.emit("usage_error", message=str(exc))
        return EXIT_HARNESS
    return compose_up(options, Path(args.out).absolute(), sink, project=args.project, up=args.up)


def _cmd_compose_down(args: argparse.Namespace, sink: EventSink) -> int:
    from bounded_query.harness.compose.project import compose_down

    return compose_down(Path(args.out), sink)


def _cmd_demo(_args: argparse.Namespace, _sink: EventSink) -> int:
    from bounded_query.harness.demo import demo

    return demo()


def _cmd_mcp_config(args: argparse.Namespace, _sink: EventSink) -> int:
    from bounded_query.harness.staging.mcp_config import render_mcp_config

    values = {
        name: value
        for name, value in (
            (policy.ENV_SOCKET, args.socket),
            (policy.ENV_SKILL, args.skill),
            (policy.ENV_REPOS, args.repos),
        )
        if value is not None
    }
    sys.stdout.write(render_mcp_config(args.client, command=args.command, values=values))
    return 0


def _cmd_images(_args: argparse.Namespace, sink: EventSink) -> int:
    from bounded_query.harness.configuration.images import build_images, recipe_script

    results = build_images()
    for recipe, status in results:
        if status == 0:
            sink.emit("image_ready", image=recipe.image, what=recipe.what)
        else:
            message = (
                f"the recipe {recipe_script(recipe)} is missing (broken installation)"
                if status == 127
                else f"the build script exited with status {status} (see its output above)"
            )
            sink.emit("image_failed", image=recipe.image, what=recipe.what, message=message)
            return EXIT_HARNESS
    return 0


def _cmd_report(args: argparse.Namespace, sink: EventSink) -> int:
    from bounded_query.harness.records.report import load_state, report_document, report_markdown

    try:
        state = load_state(Path(args.state))
    except FileNotFoundError as exc:
        sink.emit("usage_error", message=f"--state: {exc}")
        return EXIT_HARNESS
    if args.json:
        sys.stdout.write(json.dumps(report_document(state), indent=2) + "\n")
    else:
        sys.stdout.write(report_markdown(state))
    return 0


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="configuration file, or - for stdin")
    parser.add_argument(
        "--seed-source",
        action="append",
        default=[],
        metavar="OWNER/REPO=PATH",
        help="stage this repository from a local repository or bundle (repeatable)",
    )
    parser.add_argument(
        "--workspace", default=".", help="the agent's work directory (agent-visible)"
    )
    parser.add_argument(
        "--agent-mount",
        action="append",
        default=[],
        metavar="PATH",
        help="another agent-visible path the private root must not overlap (repeatable)",
    )
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="query image")
    parser.add_argument(
        "--allow-insecure-server-url",
        action="store_true",
        help="accept a plain-http GITHUB_SERVER_URL (local test servers only: the token"
        " would travel in clear text)",
    )
    parser.add_argument(
        ALLOW_FLAG,
        action="store_true",
        help="accept a run whose repositories share the host (more than one runs queries,"
        " one of them metered) while cross-invocation kernel channels stay open (runc,"
        " no root, or no page-cache pin): reported degraded",
    )
    parser.add_argument(
        "--allow-insecure-api-target",
        action="store_true",
        help="bounded agents: accept an http://HOST[:PORT] API target (tests, local gateways"
        " only: the provider credential would travel in clear text)",
    )
    parser.add_argument(
        "--api-proxy-egress-network",
        default=None,
        metavar="NAME",
        help="bounded agents: the API proxy's egress side joins this existing Docker network"
        " instead of a bridge the harness creates",
    )
    # The former name is refused with a hint (harness/configuration/channel_policy.py).
    parser.add_argument(REMOVED_FLAG, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--state-base", default=str(DEFAULT_BASE), help=argparse.SUPPRESS)


def _add_agent_options(parser: argparse.ArgumentParser) -> None:
    """How the agent is confined (README "Confinement")."""
    parser.add_argument(
        "--agent-user",
        default=None,
        metavar="UID[:GID]",
        help="the agent's uid/gid, never 0 (default in a container: the workspace owner,"
        f" or {DEFAULT_AGENT_UID} when that is root)",
    )
    parser.add_argument(
        "--agent-image", default=DEFAULT_AGENT_IMAGE, help="the agent container's image"
    )
    parser.add_argument(
        "--agent-network",
        default=AGENT_NETWORK_DEFAULT,
        help="the agent container's network (default: the engine's bridge; none: no network)",
    )
    parser.add_argument(
        "--agent-on-host",
        action="store_true",
        help="run the agent on the host as --agent-user (checked before it starts)",
    )
    parser.add_argument(
        "--unconfined-agent",
        action="store_true",
        help="with --agent-on-host and no --agent-user: run it with the harness's uid"
        " (the run is reported degraded)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``bounded-query-harness``."""
    parser = argparse.ArgumentParser(
        prog="bounded-query-harness",
        description="Host-side harness for AWF bounded queries (spec section 14).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser(
        "validate", help="validate the boundedQueries and boundedAgents sections only"
    )
    validate.add_argument("--config", required=True, help="configuration file, or - for stdin")
    validate.set_defaults(handler=_cmd_validate)

    run_parser = sub.add_parser("run", help="stage, start the broker, run the agent, tear down")
    _add_run_options(run_parser)
    run_parser.add_argument(
        "--compose", action="store_true", help="run the broker as the compose service"
    )
    run_parser.add_argument(
        "--keep-state",
        default=None,
        metavar="DIR",
        help="copy the journal, audit log, seed map and broker config to DIR at teardown"
        " (for report --state DIR)",
    )
    run_parser.add_argument("--compose-project", default=None, help=argparse.SUPPRESS)
    _add_agent_options(run_parser)
    run_parser.add_argument("agent", nargs=argparse.REMAINDER, help="-- AGENT-COMMAND...")
    run_parser.set_defaults(handler=_cmd_run)

    compose = sub.add_parser("compose", help="stage and write the compose project")
    _add_run_options(compose)
    compose.add_argument("--out", required=True, help="directory for docker-compose.yml")
    compose.add_argument("--project", default=None, help="compose project name")
    compose.add_argument("--up", action="store_true", help="also run docker-compose up -d")
    compose.set_defaults(handler=_cmd_compose)

    down = sub.add_parser("compose-down", help="stop the compose project and delete its state")
    down.add_argument("--out", required=True, help="the directory given to compose --out")
    down.set_defaults(handler=_cmd_compose_down)

    demo = sub.add_parser("demo", help="the built-in example end to end")
    demo.set_defaults(handler=_cmd_demo)

    images = sub.add_parser(
        "images", help="build and verify every image the harness needs (no registry)"
    )
    images.set_defaults(handler=_cmd_images)

    report = sub.add_parser(
        "report", help="print the summary of a kept or crashed run from its private root"
    )
    report.add_argument(
        "--state", required=True, help="the run's private root (awf-bounded-query-private-*)"
    )
    report.add_argument("--json", action="store_true", help="one JSON document instead")
    report.set_defaults(handler=_cmd_report)

    from bounded_query.harness.staging.mcp_config import CLIENTS, CONFIG_FILES, SERVER_COMMAND

    mcp = sub.add_parser(
        "mcp-config",
        help="print an MCP client's configuration for bounded-query-mcp",
        description="Print the snippet for a local stdio server running bounded-query-mcp."
        " By default it forwards AWF_BOUNDED_QUERY_SOCKET, _SKILL and _REPOS from the"
        " client's environment (the harness sets them for the agent). Where it goes: "
        + "; ".join(f"{name}: {where}" for name, where in CONFIG_FILES.items()),
    )
    mcp.add_argument("--client", required=True, choices=CLIENTS)
    mcp.add_argument("--command", default=SERVER_COMMAND, help="the server executable")
    mcp.add_argument("--socket", default=None, help="a literal AWF_BOUNDED_QUERY_SOCKET")
    mcp.add_argument("--skill", default=None, help="a literal AWF_BOUNDED_QUERY_SKILL")
    mcp.add_argument("--repos", default=None, help="a literal AWF_BOUNDED_QUERY_REPOS")
    mcp.set_defaults(handler=_cmd_mcp_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse usage errors exit 2 already
        return int(exc.code) if isinstance(exc.code, int) else EXIT_HARNESS
    sink = EventSink()
    try:
        status: int = args.handler(args, sink)
    except KeyboardInterrupt:
        sink.emit("run_end", status=130, phase="interrupted")
        return 130
    except Exception as exc:  # a harness bug or an unexpected local failure
        sink.emit("harness_internal_error", error=exc.__class__.__name__, message=str(exc)[:500])
        append_step_summary(
            os.environ.get("GITHUB_STEP_SUMMARY"),
            f"### Bounded queries — harness failure (exit {EXIT_HARNESS})\n\n"
            f"`{exc.__class__.__name__}`: see the `harness_internal_error` event on stderr.\n",
            sink,
        )
        return EXIT_HARNESS
    return status


if __name__ == "__main__":
    sys.exit(main())
