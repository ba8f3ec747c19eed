"""``bounded-query-harness``: the host-side command (spec 14.2, 14.6, 14.8).

Subcommands:

* ``validate --config FILE|-``: load and validate only (exit 0 or 2);
* ``run --config FILE [--seed-source owner/repo=PATH ...] -- AGENT...``:
  validate, preflight, stage, start the broker, run the agent, tear down;
* ``compose --config FILE --out DIR``: stage and write a compose project;
* ``demo``: the built-in example end to end.

Exit codes (seed 000 section 5.3): the agent's status for ``run``; 0 success;
1 run failure; 2 invocation or infrastructure failure (bad configuration,
failed preflight or staging, broker that never became ready).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from .config import SLUG_RE, ConfigError, LoadedConfig, load_config
from .events import EventSink
from .outputs import DEFAULT_IMAGE
from .paths import DEFAULT_BASE
from .run import RunOptions, run

__all__ = ["EXIT_HARNESS", "build_parser", "main"]

#: Exit status for invocation and infrastructure failures (seed 000 5.3).
EXIT_HARNESS = 2


def report_config_error(sink: EventSink, error: ConfigError) -> None:
    """Emit one event per configuration problem."""
    for problem in error.problems:
        sink.emit(
            "config_error",
            location=problem.location,
            message=problem.message,
            hint=problem.hint,
        )


def load_or_report(source: str, sink: EventSink) -> LoadedConfig | None:
    """Load the configuration, emitting events; None after a reported failure."""
    try:
        loaded = load_config(source, sys.stdin.buffer)
    except ConfigError as exc:
        report_config_error(sink, exc)
        sink.emit("config_invalid", problems=len(exc.problems))
        return None
    for warning in loaded.warnings:
        sink.emit("config_warning", message=warning)
    sink.emit(
        "config_loaded",
        enabled=loaded.config.enabled,
        repos=list(loaded.config.slugs),
        runtime=loaded.config.runtime,
    )
    return loaded


def _cmd_validate(args: argparse.Namespace, sink: EventSink) -> int:
    loaded = load_or_report(args.config, sink)
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
        if not sep or not path or SLUG_RE.fullmatch(slug) is None:
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


def _run_options(args: argparse.Namespace) -> RunOptions:
    return RunOptions(
        config_source=args.config,
        agent=_agent_argv(args.agent),
        seed_sources=parse_seed_sources(args.seed_source),
        workspace=Path(args.workspace).absolute(),
        agent_mounts=tuple(Path(p).absolute() for p in args.agent_mount),
        image=args.image,
        base=Path(args.state_base),
    )


def _cmd_run(args: argparse.Namespace, sink: EventSink) -> int:
    try:
        options = _run_options(args)
    except UsageError as exc:
        sink.emit("usage_error", message=str(exc))
        return EXIT_HARNESS
    if args.compose:
        from .compose import compose_broker_starter

        return trio.run(run, options, sink, None, compose_broker_starter(args.compose_project))
    return trio.run(run, options, sink)


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
    parser.add_argument("--state-base", default=str(DEFAULT_BASE), help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``bounded-query-harness``."""
    parser = argparse.ArgumentParser(
        prog="bounded-query-harness",
        description="Host-side harness for AWF bounded queries (spec section 14).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", help="validate the boundedQueries section only")
    validate.add_argument("--config", required=True, help="configuration file, or - for stdin")
    validate.set_defaults(handler=_cmd_validate)

    run_parser = sub.add_parser("run", help="stage, start the broker, run the agent, tear down")
    _add_run_options(run_parser)
    run_parser.add_argument(
        "--compose", action="store_true", help="run the broker as the compose service"
    )
    run_parser.add_argument("--compose-project", default=None, help=argparse.SUPPRESS)
    run_parser.add_argument("agent", nargs=argparse.REMAINDER, help="-- AGENT-COMMAND...")
    run_parser.set_defaults(handler=_cmd_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse usage errors exit 2 already
        return int(exc.code) if isinstance(exc.code, int) else EXIT_HARNESS
    sink = EventSink()
    status: int = args.handler(args, sink)
    return status


if __name__ == "__main__":
    sys.exit(main())
