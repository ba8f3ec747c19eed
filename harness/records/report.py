"""``bounded-query-harness report --state DIR``: the summary of a kept run.

Theory of operation: a run's private root holds everything the step summary
is made of -- the seed map (which repositories, at which sensitivity), the
broker configuration (the runtime), the journal (charges) and the protected
audit log (buckets and outcomes). :func:`load_state` reads those four files
from a private root that a finished run kept or a crashed run left behind
(a missing or damaged file becomes a note, never an exception), and
:func:`report_markdown` / :func:`report_document` render the same summary as
the run itself writes (``summary.py``), as Markdown or as one JSON document
of type :data:`REPORT_SCHEMA`. Nothing here writes to the state directory.
``run --keep-state DIR`` (:func:`keep_state`) copies exactly those four files
out of the private root at teardown, so the report works after the roots are
deleted.

The bounded-agent subsystem (spec 15.1) has its own four files and the API
proxy's usage records: ``--keep-state`` puts them below
``DIR/bounded-agent/`` (:data:`AGENT_STATE_DIR`), and :func:`load_state`
reads them from there, or from the sibling agent private root of a crashed
run's query root; the report then has a second, "Bounded agents" section
(``boundedAgents`` in the JSON document).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bounded_query.harness.lifecycle.paths import AGENT_PRIVATE_PREFIX, PRIVATE_PREFIX, RunPaths
from bounded_query.harness.records.usage import RunUsage, render_summary, usage_from_state

__all__ = [
    "AGENT_STATE_DIR",
    "REPORT_SCHEMA",
    "KeptState",
    "count_usage_records",
    "keep_agent_state",
    "keep_state",
    "load_state",
    "read_optional",
    "report_document",
    "report_markdown",
]

#: Record type of ``report --json`` (shipped schema: ``schemas/``).
REPORT_SCHEMA = "bounded-query-report/v1"


@dataclass(frozen=True, slots=True)
class KeptState:
    """What a kept private root says about its run."""

    usage: RunUsage
    runtime: str
    #: The bounded-agent subsystem's state, when the run had one.
    agents: KeptState | None = None
    #: Lines of the API proxy's usage log (bounded-agent state only).
    usage_records: int = 0


def read_optional(path: Path) -> bytes | None:
    """The file's bytes, or None when it cannot be read (a missing state file is a note)."""
    try:
        return path.read_bytes()
    except OSError:
        return None


def _json_object(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


#: Where ``--keep-state`` puts the bounded-agent subsystem's state (spec 15.1).
AGENT_STATE_DIR = "bounded-agent"


def count_usage_records(paths: RunPaths) -> int:
    """Lines of the API proxy's usage log (0 when there is none; blocking)."""
    raw = read_optional(paths.usage_log)
    return 0 if raw is None else sum(1 for line in raw.splitlines() if line.strip())


def keep_agent_state(paths: RunPaths, target: Path) -> list[str]:
    """:func:`keep_state` for the agent private root, plus the proxy's usage records.

    Never the credential, a seed, a workspace or the control socket.
    """
    copied = keep_state(paths, target)
    raw = read_optional(paths.usage_log)
    if raw is not None:
        relative = paths.usage_log.relative_to(paths.private_root)
        dest = target / relative
        dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
        copied.append(str(relative))
    return copied


def _kept_files(paths: RunPaths) -> tuple[Path, ...]:
    """What ``run --keep-state`` copies: the accounting and its explanation,
    never a seed, a workspace or the socket."""
    return (paths.seed_map, paths.broker_config, paths.journal, paths.audit_log)


def keep_state(paths: RunPaths, target: Path) -> list[str]:
    """Copy the run's seed map, broker config, journal and audit log into ``target``.

    Called at teardown, after the broker stopped.

    ``target`` is created with mode 0700 (it must not exist, or be an empty
    directory); the copies are 0600. Returns the relative names copied; a
    missing source file is skipped (a crashed run may lack some).

    Raises:
        FileExistsError: ``target`` exists and is not an empty directory.
        OSError: the copy failed.
    """
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} exists and is not an empty directory")
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    copied: list[str] = []
    for source in _kept_files(paths):
        relative = source.relative_to(paths.private_root)
        try:
            data = source.read_bytes()
        except FileNotFoundError:
            continue
        dest = target / relative
        dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        copied.append(str(relative))
    return copied


def _agent_root_of(private_root: Path) -> Path | None:
    """Where the bounded-agent state of the run kept (or left) at ``private_root`` is."""
    kept = private_root / AGENT_STATE_DIR
    if kept.is_dir():
        return kept
    if private_root.name.startswith(PRIVATE_PREFIX):
        suffix = private_root.name[len(PRIVATE_PREFIX) :]
        sibling = private_root.parent / f"{AGENT_PRIVATE_PREFIX}{suffix}"
        if sibling.is_dir():
            return sibling
    return None


def load_state(private_root: Path, *, with_agents: bool = True) -> KeptState:
    """Read a run's state from its private root (see the module docstring).

    Raises:
        FileNotFoundError: ``private_root`` is not a directory (caller's fault).
    """
    if not private_root.is_dir():
        raise FileNotFoundError(f"{private_root} is not a directory")
    agents = None
    agent_root = _agent_root_of(private_root) if with_agents else None
    if agent_root is not None:
        agents = load_state(agent_root, with_agents=False)
        agents = dataclasses.replace(
            agents, usage_records=count_usage_records(RunPaths(agent_root, agent_root))
        )
    paths = RunPaths(private_root, private_root)
    notes: list[str] = []
    seed_map = _json_object(read_optional(paths.seed_map))
    repos: list[tuple[str, str]] = []
    entries = seed_map.get("repos") if seed_map else None
    if isinstance(entries, list):
        for entry in entries:
            if isinstance(entry, dict):
                repo, sensitivity = entry.get("repo"), entry.get("sensitivity")
                if isinstance(repo, str) and isinstance(sensitivity, str):
                    repos.append((repo, sensitivity))
    else:
        notes.append("the seed map is missing or unreadable; no repository is listed")
    broker = _json_object(read_optional(paths.broker_config))
    runtime = broker.get("runtime") if broker else None
    if not isinstance(runtime, str):
        notes.append("the broker configuration is missing or unreadable; the runtime is unknown")
        runtime = "unknown"
    usage = usage_from_state(repos, read_optional(paths.journal), read_optional(paths.audit_log))
    if notes:
        usage = dataclasses.replace(usage, notes=(*notes, *usage.notes))
    return KeptState(usage, runtime, agents)


def report_markdown(state: KeptState) -> str:
    """The step-summary Markdown of a kept run (no exit status is known)."""
    markdown = render_summary(state.usage, exit_code=-1, runtime=state.runtime)
    markdown = markdown.replace(", exit -1", ", from the kept state", 1)
    if state.agents is not None:
        agents = render_summary(
            state.agents.usage,
            exit_code=-1,
            runtime=state.agents.runtime,
            title="Bounded agents",
            extra=[f"API proxy usage records: {state.agents.usage_records}."],
        )
        markdown += "\n" + agents.replace(", exit -1", ", from the kept state", 1)
    return markdown


def report_document(state: KeptState) -> dict[str, Any]:
    """The machine-readable report (type :data:`REPORT_SCHEMA`)."""
    doc = _usage_document(state)
    if state.agents is not None:
        agents = _usage_document(state.agents)
        del agents["_schema"]
        agents["usageRecords"] = state.agents.usage_records
        doc["boundedAgents"] = agents
    return doc


def _usage_document(state: KeptState) -> dict[str, Any]:
    return {
        "_schema": REPORT_SCHEMA,
        "runtime": state.runtime,
        "repos": [
            {
                "repo": r.repo,
                "sensitivity": r.sensitivity,
                "budgetBits": r.budget,
                "spentBits": r.spent_bits,
                "invocations": r.invocations,
                "buckets": {str(ms): n for ms, n in r.buckets.items()},
                "outcomes": dict(r.outcomes),
                "refusals": dict(r.refusals),
            }
            for r in state.usage.repos
        ],
        "refused": state.usage.refused,
        "refusals": dict(state.usage.refusals),
        "unattributed": dict(state.usage.unattributed),
        "uncounted": dict(state.usage.uncounted),
        "responses": [
            {
                "invocationId": r.invocation_id,
                "repo": r.repo,
                "category": r.category,
                "charge": r.charge,
                "bucketMs": r.bucket_ms,
            }
            for r in state.usage.responses
        ],
        "notes": list(state.usage.notes),
    }
