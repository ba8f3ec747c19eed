"""What a run tells its operator: problem events and step-summary Markdown (seed 000 5.4).

Theory of operation: every harness failure is reported twice, as JSONL
events on stderr (one per problem: location, message, fix hint) and, when
``$GITHUB_STEP_SUMMARY`` is set, as a short Markdown section there. The
Markdown is built by pure functions here; the per-repository usage table of
a run that got as far as staging is ``summary.py``'s (the journal and audit
log folded), and ``report.py`` renders the same for a kept state offline.

Functions here that write (the step summary, stderr) block: async callers
run them in a worker thread.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence

from bounded_query.harness.configuration.config import (
    ConfigError,
    LoadedConfig,
    Problem,
    load_config,
)
from bounded_query.harness.lifecycle.options import EXIT_HARNESS
from bounded_query.harness.records.events import EventSink, append_step_summary
from bounded_query.harness.records.usage import RunUsage

__all__ = [
    "config_invalid_markdown",
    "emit_usage",
    "failed_early_markdown",
    "load_reported",
    "print_progress",
    "problems_event",
]


def problems_event(sink: EventSink, event: str, problems: Sequence[Problem]) -> None:
    """One ``event`` per problem, with its location, message and fix hint."""
    for problem in problems:
        sink.emit(event, location=problem.location, message=problem.message, hint=problem.hint)


def config_invalid_markdown(problems: Sequence[Problem]) -> str:
    """The step summary of an invalid configuration: every problem and its fix."""
    return "\n".join(
        [
            f"### Bounded queries — invalid configuration (exit {EXIT_HARNESS})",
            "",
            "Nothing was staged or started. Fix every problem below and run again:",
            "",
            *(f"- `{p.location}`: {p.message} — fix: {p.hint}" for p in problems),
            "",
        ]
    )


def failed_early_markdown(phase: str, status: int) -> str:
    """The step summary of a run that failed before its agent started."""
    return (
        f"### Bounded queries — failed before the agent started (phase `{phase}`,"
        f" exit {status})\n\nSee the JSONL events on stderr for every problem and its fix.\n"
    )


def load_reported(
    source: str, sink: EventSink, summary_path: str | None = None
) -> LoadedConfig | None:
    """Load the configuration, reporting every problem; None after a failure (blocking).

    Each problem is one ``config_error`` event (location, message, fix hint),
    followed by ``config_invalid``; with ``summary_path`` (the value of
    ``$GITHUB_STEP_SUMMARY``) the problems are also appended to the step
    summary (seed 000 5.4: an invocation error is reported there too). On
    success the legacy-entry warnings and ``config_loaded`` are emitted.
    """
    try:
        loaded = load_config(source, sys.stdin.buffer)
    except ConfigError as exc:
        problems_event(sink, "config_error", exc.problems)
        sink.emit("config_invalid", problems=len(exc.problems))
        append_step_summary(summary_path, config_invalid_markdown(exc.problems), sink)
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


def emit_usage(sink: EventSink, usage: RunUsage, subsystem: str | None = None) -> None:
    """One ``repo_usage`` event per repository, then ``refused_requests`` if any.

    With ``subsystem`` (the bounded-agent one, spec 15.1) every event names it.
    """
    named = {} if subsystem is None else {"subsystem": subsystem}
    for repo in usage.repos:
        sink.emit(
            "repo_usage",
            **named,
            repo=repo.repo,
            sensitivity=repo.sensitivity,
            budget=repo.budget,
            spent=repo.spent_bits,
            invocations=repo.invocations,
            buckets={str(k): v for k, v in repo.buckets.items()},
        )
    if usage.refused:
        sink.emit("refused_requests", count=usage.refused, reasons=usage.refusals, **named)


def print_progress(line: str) -> None:
    """Write one human progress line to stderr (a closed stderr is ignored)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
