"""Teardown: undo what a run created, on every path (spec 14.6-14.8; seed 000 5.4).

Theory of operation: a :class:`RunState` records what the run got to (roots
created, broker started, workspace quota mounted, progress followed), filled
in by ``prepare.py`` and ``orchestrate.py`` as each phase succeeds.
:func:`teardown` turns it into a :class:`.plan.TeardownPlan` and executes
it, shielded by its caller from cancellation: stop the broker (SIGTERM,
then SIGKILL), print the answers it audited last, force-remove every
container labelled with the run id (``reconcile.py``), unmount
the workspace quota, write the step summary from the journal and audit log,
keep the state when asked, delete both roots, disarm the reaper
(``reaper.py``: only a teardown that got that far does), and emit
``run_end`` whatever failed on the way. Every blocking step (the Engine API, reading the journal,
writing the step summary, deleting trees) runs in a worker thread.

With bounded agents (spec 15.1): the agent broker is stopped right after
the query broker; the one reconcile removes the enclaves, the API proxy and
the harness's bounded-agent networks (``reconcile.py``); the summary gets a
"Bounded agents" section from the agent journal and audit log (and the
count of the proxy's usage records); ``--keep-state`` copies the agent
state below ``bounded-agent/``; the agent roots go with the query roots.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from bounded_query.broker.protocol.policy import SUBSYSTEM_AGENT
from bounded_query.harness.configuration.config import BoundedAgentsConfig, BoundedQueriesConfig
from bounded_query.harness.lifecycle.options import BrokerHandle
from bounded_query.harness.lifecycle.paths import RunPaths
from bounded_query.harness.lifecycle.plan import TeardownPlan, plan_teardown, summary_kind
from bounded_query.harness.lifecycle.quota import unmount_work_quota
from bounded_query.harness.lifecycle.reconcile import reconcile_containers
from bounded_query.harness.records.events import EventSink, append_step_summary
from bounded_query.harness.records.notices import emit_usage, failed_early_markdown, print_progress
from bounded_query.harness.records.progress import AuditFollower, drain
from bounded_query.harness.records.report import (
    AGENT_STATE_DIR,
    count_usage_records,
    keep_agent_state,
    keep_state,
    read_optional,
)
from bounded_query.harness.records.usage import render_summary, usage_from_state
from bounded_query.harness.staging.outputs import remove_roots

if TYPE_CHECKING:  # the reaper's module is also its process's __main__: not imported eagerly
    from bounded_query.harness.lifecycle.reaper import Reaper

__all__ = [
    "RunState",
    "disarm_reaper",
    "remove_created_roots",
    "summarize",
    "teardown",
]


@dataclass
class RunState:
    """What one run has created so far (mutable; teardown undoes it)."""

    config: BoundedQueriesConfig | None = None
    #: Set once the private root exists (then ``roots_created``).
    paths: RunPaths | None = None
    run_id: str = ""
    docker_host: str = ""
    roots_created: bool = False
    broker: BrokerHandle | None = None
    work_quota: bool = False
    #: The terminal progress follower of the audit log, when enabled.
    progress: AuditFollower | None = None
    #: Reported as ``degraded`` events (subsystem ``harness``) at teardown.
    degraded_notes: list[str] = field(default_factory=list)
    #: The detached reaper (``reaper.py``): disarmed once teardown has finished.
    reaper: Reaper | None = None
    #: The ``boundedAgents`` section when enabled (``agents.py``).
    agents: BoundedAgentsConfig | None = None
    #: Set once the agent private root exists (created by this run).
    agent_paths: RunPaths | None = None
    agent_broker: BrokerHandle | None = None


def teardown_plan(state: RunState, keep: Path | None) -> TeardownPlan:
    """The plan of :func:`teardown` for what ``state`` records."""
    return plan_teardown(
        broker_started=state.broker is not None or state.agent_broker is not None,
        progress_followed=state.progress is not None,
        paths_known=state.paths is not None,
        roots_created=state.roots_created,
        docker_host=state.docker_host,
        work_quota=state.work_quota,
        keep_state=keep,
    )


async def teardown(
    state: RunState,
    sink: EventSink,
    env: Mapping[str, str],
    *,
    status: int,
    phase: str,
    keep: Path | None,
) -> None:
    """Undo the run (call it shielded); ``run_end`` is emitted even if a step raises."""
    plan = teardown_plan(state, keep)
    try:
        try:
            if plan.stop_broker and state.broker is not None:
                stopped = await state.broker.stop()
                sink.emit("broker_stopped", status=stopped)
                state.broker = None
            if plan.stop_broker and state.agent_broker is not None:
                stopped = await state.agent_broker.stop()
                sink.emit("broker_stopped", status=stopped, subsystem=SUBSYSTEM_AGENT)
                state.agent_broker = None
            if plan.drain_progress and state.progress is not None and state.paths is not None:
                # The broker is gone: print the answers it audited last.
                await trio.to_thread.run_sync(
                    drain, state.paths.audit_log, state.progress, print_progress
                )
            if plan.reconcile:
                await _reconcile(state, sink)
        finally:
            if plan.unmount_quota and state.paths is not None:
                await unmount_work_quota(state.paths.workspaces_dir, sink)
                state.work_quota = False
        await summarize(state, status, phase, sink, env)
        if plan.keep_state is not None and state.paths is not None:
            await _keep_state(state.paths, plan.keep_state, sink, state.agent_paths)
        if plan.remove_roots:
            await remove_created_roots(state, sink)
        # Only a teardown that got this far disarms the reaper: after an
        # exception it stays armed and removes what is left once the harness exits.
        await disarm_reaper(state)
    finally:
        sink.emit("run_end", status=status, phase=phase)


async def _reconcile(state: RunState, sink: EventSink) -> None:
    try:
        removed = await trio.to_thread.run_sync(
            reconcile_containers, state.docker_host, state.run_id
        )
    except Exception as exc:
        state.degraded_notes.append(f"container reconciliation failed ({exc.__class__.__name__})")
        return
    sink.emit("containers_reconciled", removed=removed)


async def _keep_state(
    paths: RunPaths, target: Path, sink: EventSink, agent_paths: RunPaths | None = None
) -> None:
    """Copy the run's state out before the roots go; a failure only degrades."""
    try:
        copied = await trio.to_thread.run_sync(keep_state, paths, target)
        if agent_paths is not None:
            kept = await trio.to_thread.run_sync(
                keep_agent_state, agent_paths, target / AGENT_STATE_DIR
            )
            copied += [f"{AGENT_STATE_DIR}/{name}" for name in kept]
    except OSError as exc:
        sink.degrade("keep-state", f"the run's state was not kept: {exc.strerror or exc}")
        return
    sink.emit("state_kept", files=copied)


async def disarm_reaper(state: RunState) -> None:
    """Tell the reaper teardown is done and reap it (``reaper.py``); idempotent."""
    reaper, state.reaper = state.reaper, None
    if reaper is not None:
        await trio.to_thread.run_sync(reaper.disarm)


async def remove_created_roots(state: RunState, sink: EventSink) -> None:
    """Delete both roots if this run created them (``roots_removed``)."""
    if state.paths is not None and state.roots_created:
        await trio.to_thread.run_sync(remove_roots, state.paths)
        sink.emit("roots_removed")
    if state.agent_paths is not None:
        await trio.to_thread.run_sync(remove_roots, state.agent_paths)
        sink.emit("roots_removed", subsystem=SUBSYSTEM_AGENT)
        state.agent_paths = None


def _read_state(paths: RunPaths) -> tuple[bytes | None, bytes | None]:
    return read_optional(paths.journal), read_optional(paths.audit_log)


async def summarize(
    state: RunState, status: int, phase: str, sink: EventSink, env: Mapping[str, str]
) -> None:
    """Report the degraded notes, then the step summary and the usage events."""
    for note in state.degraded_notes:
        sink.degrade("harness", note)
    kind = summary_kind(
        config_known=state.config is not None, paths_known=state.paths is not None, phase=phase
    )
    summary_path = env.get("GITHUB_STEP_SUMMARY")
    if kind == "failed-early":
        markdown = failed_early_markdown(phase, status)
        await trio.to_thread.run_sync(append_step_summary, summary_path, markdown, sink)
        return
    if kind == "none" or state.config is None or state.paths is None:
        return
    repos = [(r.repo, r.sensitivity) for r in state.config.private_repos]
    journal, audit = await trio.to_thread.run_sync(_read_state, state.paths)
    usage = usage_from_state(repos, journal, audit)
    emit_usage(sink, usage)
    markdown = render_summary(
        usage, exit_code=status, runtime=state.config.runtime, degraded=sink.degraded
    )
    if state.agents is not None and state.agent_paths is not None:
        markdown += "\n" + await _agent_summary(state.agents, state.agent_paths, status, sink)
    await trio.to_thread.run_sync(append_step_summary, summary_path, markdown, sink)


async def _agent_summary(
    agents: BoundedAgentsConfig, paths: RunPaths, status: int, sink: EventSink
) -> str:
    """The bounded-agent section of the summary, and its usage events (``subsystem``)."""
    repos = [(r.repo, r.sensitivity) for r in agents.private_repos]
    journal, audit = await trio.to_thread.run_sync(_read_state, paths)
    records = await trio.to_thread.run_sync(count_usage_records, paths)
    usage = usage_from_state(repos, journal, audit)
    emit_usage(sink, usage, SUBSYSTEM_AGENT)
    sink.emit("api_proxy_usage", subsystem=SUBSYSTEM_AGENT, records=records)
    return render_summary(
        usage,
        exit_code=status,
        runtime=agents.runtime,
        title="Bounded agents",
        extra=[f"API proxy usage records (model requests, clamps, refusals): {records}."],
    )
