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

from .config import ConfigError, LoadedConfig, load_config
from .events import EventSink

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
