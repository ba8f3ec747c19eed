"""``bounded-query-harness run``: one complete run (spec 14.2, 14.6-14.8).

Phases, each reported as a JSONL event: configuration -> the sweep of roots
left by a harness killed with SIGKILL (``sweep.py``) -> preflight (static,
then the runtime probe) -> private root with its owner record, and staging -> seed map, broker
config, skill and wrapper -> broker (a child process in its own session; or
the compose service) -> readiness (the broker's ``control/ready`` file) ->
the agent command -> teardown. Before the broker starts, a size-limited tmpfs
is mounted over the private root's ``work/`` (the query workspaces; see
``quota.py``), or the run is reported degraded.

The agent gets the caller's environment minus GH_TOKEN/GITHUB_TOKEN, plus
``AWF_BOUNDED_QUERY_SOCKET``, ``AWF_BOUNDED_QUERY_SKILL`` and
``AWF_BOUNDED_QUERY_REPOS`` (slugs only) and the wrapper directory first on
PATH. With the section absent or not enabled, nothing is staged or started
and the agent runs with the environment untouched (spec 14.2).

Teardown runs on every path (normal exit, failure, SIGINT/SIGTERM/SIGHUP),
shielded from cancellation: stop the agent if it still runs, stop the broker
(SIGTERM, then SIGKILL), force-remove every container labelled with the run
id, unmount the workspace quota, read the journal and audit log for the
summary, delete both roots. The broker child also carries a parent-death
signal (SIGTERM), so it does not outlive a harness killed with SIGKILL.

Exit status (seed 000 5.3): the agent's own status (128+N when it died of
signal N); 2 for every harness failure before the agent started (invalid
configuration, failed preflight or staging, a broker that never became
ready); 128+N when the harness itself was stopped by signal N before the
agent finished. A signal while the agent runs is forwarded to it; an agent
that has not exited ``stop_grace`` seconds later (or at a second signal) is
terminated, then killed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio
from bounded_query.broker.runner import LABEL_RUN, parse_memory_limit

from .child import broker_environment, start_child_broker
from .config import BoundedQueriesConfig, ConfigError, LoadedConfig, Problem, load_config
from .events import EventSink, append_step_summary
from .outputs import (
    DEFAULT_IMAGE,
    broker_config_doc,
    remove_roots,
    seed_map_doc,
    write_agent_side,
    write_json_private,
)
from .paths import DEFAULT_BASE, RunPaths, run_paths
from .preflight import (
    TOKEN_VARIABLES,
    PreflightInputs,
    docker_host_from_env,
    runtime_problems,
    staging_token,
    static_problems,
)
from .quota import mount_work_quota, unmount_work_quota
from .staging import SeedSpec, StagedSeed, StagingError, create_private_root, stage_seeds
from .summary import render_summary, usage_from_state
from .sweep import MODE_COMPOSE, MODE_RUN, current_owner, sweep_stale_roots, write_owner_record

__all__ = [
    "EXIT_HARNESS",
    "BrokerHandle",
    "PreparedRun",
    "RunOptions",
    "agent_environment",
    "broker_environment",
    "load_reported",
    "prepare",
    "reconcile_containers",
    "run",
]

EXIT_HARNESS = 2
#: How long the broker may take to write its ready file.
READY_TIMEOUT_S = 60.0
READY_POLL_S = 0.05
#: Grace period before escalating to SIGKILL.
AGENT_STOP_GRACE_S = 10.0
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Everything ``run`` needs besides the environment."""

    config_source: str
    agent: tuple[str, ...]
    seed_sources: Mapping[str, Path] = field(default_factory=dict)
    workspace: Path = field(default_factory=Path.cwd)
    agent_mounts: tuple[Path, ...] = ()
    image: str = DEFAULT_IMAGE
    base: Path = DEFAULT_BASE
    #: The broker command before ``--config PATH`` (tests use a fake runner).
    broker_command: tuple[str, ...] = ("bounded-query-broker",)
    ready_timeout: float = READY_TIMEOUT_S
    #: Skip the engine probe (tests with a fake broker only).
    probe_runtime: bool = True
    #: Append the broker child's stderr (its JSONL diagnostics) here instead
    #: of the harness's stderr.
    broker_log: Path | None = None
    #: How long a signalled agent may take to exit before it is terminated,
    #: and then killed (each step gets this long).
    stop_grace: float = AGENT_STOP_GRACE_S


class BrokerHandle(Protocol):
    """A started broker (child process or compose service)."""

    def exited(self) -> int | None:
        """The broker's exit status, or None while it runs."""
        ...

    async def stop(self) -> int | None:
        """Stop it (SIGTERM, then SIGKILL); return the exit status if known."""
        ...


def agent_environment(
    env: Mapping[str, str], paths: RunPaths, config: BoundedQueriesConfig
) -> dict[str, str]:
    """The agent's environment (spec 14.8): tokens removed, three variables added."""
    out = {k: v for k, v in env.items() if k not in TOKEN_VARIABLES}
    out["AWF_BOUNDED_QUERY_SOCKET"] = str(paths.socket_path)
    out["AWF_BOUNDED_QUERY_SKILL"] = str(paths.skill_file)
    out["AWF_BOUNDED_QUERY_REPOS"] = ",".join(config.slugs)
    path = env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    out["PATH"] = f"{paths.wrapper_dir}{os.pathsep}{path}" if path else str(paths.wrapper_dir)
    return out


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _problems_event(sink: EventSink, event: str, problems: Sequence[Problem]) -> None:
    for problem in problems:
        sink.emit(event, location=problem.location, message=problem.message, hint=problem.hint)


def load_reported(
    source: str, sink: EventSink, summary_path: str | None = None
) -> LoadedConfig | None:
    """Load the configuration, reporting every problem; None after a failure.

    Each problem is one ``config_error`` event (location, message, fix hint),
    followed by ``config_invalid``; with ``summary_path`` (the value of
    ``$GITHUB_STEP_SUMMARY``) the problems are also appended to the step
    summary (seed 000 5.4: an invocation error is reported there too). On
    success the legacy-entry warnings and ``config_loaded`` are emitted.
    """
    try:
        loaded = load_config(source, sys.stdin.buffer)
    except ConfigError as exc:
        _problems_event(sink, "config_error", exc.problems)
        sink.emit("config_invalid", problems=len(exc.problems))
        markdown = "\n".join(
            [
                f"## Bounded queries — invalid configuration (exit {EXIT_HARNESS})",
                "",
                "Nothing was staged or started. Fix every problem below and run again:",
                "",
                *(
                    f"- `{p.location}`: {p.message} — fix: {p.hint}"
                    for p in exc.problems
                ),
                "",
            ]
        )
        append_step_summary(summary_path, markdown, sink)
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


def reconcile_containers(docker_host: str, run_id: str) -> int:
    """Force-remove every query container labelled with ``run_id``; return the count."""
    import docker

    client = docker.DockerClient(base_url=docker_host, timeout=60)
    try:
        removed = 0
        for container in client.containers.list(
            all=True, filters={"label": f"{LABEL_RUN}={run_id}"}
        ):
            with contextlib.suppress(Exception):
                container.remove(force=True)
                removed += 1
        return removed
    finally:
        client.close()


def _read_optional(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


@dataclass
class _RunState:
    """Mutable bookkeeping of one run, for teardown."""

    signal_number: int | None = None
    agent: trio.Process | None = None
    broker: BrokerHandle | None = None
    paths: RunPaths | None = None
    config: BoundedQueriesConfig | None = None
    run_id: str = ""
    docker_host: str = ""
    roots_created: bool = False
    degraded_notes: list[str] = field(default_factory=list)
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)
    stop_grace: float = AGENT_STOP_GRACE_S
    agent_done: bool = False
    work_quota: bool = False


async def _watch_signals(state: _RunState, sink: EventSink) -> None:
    """Forward a signal to a running agent, else cancel the run.

    An agent that ignores the forwarded signal gets ``stop_grace`` seconds;
    then (or at a second signal) the run is cancelled, which terminates and
    finally kills it, so teardown always happens.
    """
    with trio.open_signal_receiver(*_SIGNALS) as signals:
        async for signum in signals:
            first = state.signal_number is None
            state.signal_number = signum
            sink.emit("signal", signal=signal.Signals(signum).name)
            agent = state.agent
            if agent is not None and agent.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    agent.send_signal(signum)
                if first:
                    deadline = trio.current_time() + state.stop_grace
                    state.cancel.deadline = min(state.cancel.deadline, deadline)
                else:
                    state.cancel.cancel()
            else:
                state.cancel.cancel()


async def _start_agent(
    options: RunOptions, env: Mapping[str, str], state: _RunState, sink: EventSink
) -> int:
    try:
        process = await trio.lowlevel.open_process(
            list(options.agent), env=dict(env), cwd=str(options.workspace)
        )
    except OSError as exc:
        sink.emit("agent_failed_to_start", message=exc.strerror or str(exc))
        return EXIT_HARNESS
    state.agent = process
    sink.emit("agent_started", pid=process.pid)
    try:
        returncode = await process.wait()
    finally:
        if process.poll() is None:
            with trio.CancelScope(shield=True):
                process.terminate()
                with trio.move_on_after(state.stop_grace):
                    await process.wait()
                if process.poll() is None:
                    process.kill()
                killed = await process.wait()
                sink.emit("agent_stopped", status=_exit_status(killed))
    status = _exit_status(returncode)
    state.agent_done = True
    sink.emit("agent_exited", status=status)
    return status


async def _wait_ready(
    paths: RunPaths, broker: BrokerHandle, limit_s: float, sink: EventSink
) -> bool:
    with trio.move_on_after(limit_s):
        while True:
            if paths.ready_file.exists():
                sink.emit("broker_ready")
                return True
            status = broker.exited()
            if status is not None:
                sink.emit("broker_failed", message=f"the broker exited with status {status}")
                return False
            await trio.sleep(READY_POLL_S)
    sink.emit("broker_failed", message=f"the broker was not ready after {limit_s:g} s")
    return False


BrokerStarter = Callable[[RunOptions, RunPaths, Mapping[str, str]], Any]


@dataclass(frozen=True, slots=True)
class PreparedRun:
    """A staged run: roots written, broker not started."""

    run_id: str
    paths: RunPaths
    config: BoundedQueriesConfig
    docker_host: str


async def prepare(
    options: RunOptions, loaded: LoadedConfig, env: Mapping[str, str], sink: EventSink
) -> PreparedRun | None:
    """Preflight, staging and outputs without a broker (``compose``).

    The caller mounts the workspace quota (``compose`` does, and
    ``compose-down`` unmounts it). Returns None after a reported failure,
    having removed what it created.
    """
    state = _RunState(config=loaded.config)
    try:
        ok = await _prepare(options, loaded, env, state, sink, mode=MODE_COMPOSE)
    except BaseException:
        with trio.CancelScope(shield=True):
            await _remove_roots(state, sink)
        raise
    if not ok or state.paths is None:
        await _remove_roots(state, sink)
        return None
    return PreparedRun(state.run_id, state.paths, loaded.config, state.docker_host)


async def _prepare(
    options: RunOptions,
    loaded: LoadedConfig,
    env: Mapping[str, str],
    state: _RunState,
    sink: EventSink,
    *,
    mode: str = MODE_RUN,
) -> bool:
    """Sweep, preflight, staging and outputs; False after a reported failure.

    ``mode`` goes into the owner record (``sweep.py``): ``run`` roots are
    swept once their harness is gone, ``compose`` roots never are.
    """
    config = loaded.config
    await trio.to_thread.run_sync(sweep_stale_roots, options.base, os.getuid(), sink)
    state.run_id = secrets.token_hex(16)
    state.docker_host = docker_host_from_env(env)
    paths = run_paths(os.getuid(), options.workspace, state.run_id, options.base)
    home = (Path(env["HOME"]),) if env.get("HOME", "").startswith("/") else ()
    visible = (Path("/tmp"), options.workspace, *home, *options.agent_mounts)
    inputs = PreflightInputs(
        config=config,
        paths=paths,
        env=env,
        seed_sources=dict(options.seed_sources),
        agent_visible=visible,
    )
    problems = static_problems(inputs)
    if not problems and options.probe_runtime:
        problems = await runtime_problems(config, state.docker_host, options.image, state.run_id)
    if problems:
        _problems_event(sink, "preflight_error", problems)
        sink.emit("preflight_failed", problems=len(problems))
        return False
    sink.emit("preflight_passed", runtime=config.runtime)
    try:
        create_private_root(paths)
    except StagingError as exc:
        sink.emit("staging_failed", message=str(exc))
        return False
    state.paths = paths
    state.roots_created = True
    try:
        write_owner_record(paths.private_root, current_owner(mode))
    except OSError as exc:
        sink.emit("staging_failed", message=f"cannot write the owner record: {exc.strerror or exc}")
        return False
    specs = [SeedSpec(r, options.seed_sources.get(r.repo.lower())) for r in config.private_repos]

    def staged(seed: StagedSeed) -> None:
        sink.emit(
            "repo_staged",
            repo=seed.repo,
            sensitivity=seed.sensitivity,
            commit=seed.commit,
            seconds=round(seed.seconds, 3),
        )

    sink.emit("staging_started", repos=len(specs))
    token = staging_token(env)
    try:
        seeds = await trio.to_thread.run_sync(
            lambda: stage_seeds(specs, paths, env, token, on_staged=staged)
        )
    except StagingError as exc:
        sink.emit("staging_failed", message=str(exc))
        return False
    write_json_private(paths.seed_map, seed_map_doc(seeds))
    write_json_private(
        paths.broker_config,
        broker_config_doc(
            paths, state.run_id, config, image=options.image, docker_host=state.docker_host
        ),
    )
    write_agent_side(paths, config)
    sink.emit("outputs_written", skill=str(paths.skill_file), socket=str(paths.socket_path))
    return True


async def _stop_broker(state: _RunState, sink: EventSink) -> None:
    if state.broker is not None:
        status = await state.broker.stop()
        sink.emit("broker_stopped", status=status)
        state.broker = None


async def _reconcile(state: _RunState, sink: EventSink) -> None:
    if not (state.roots_created and state.docker_host.startswith("unix://")):
        return
    try:
        removed = await trio.to_thread.run_sync(
            reconcile_containers, state.docker_host, state.run_id
        )
    except Exception as exc:
        state.degraded_notes.append(f"container reconciliation failed ({exc.__class__.__name__})")
        return
    sink.emit("containers_reconciled", removed=removed)


async def _remove_roots(state: _RunState, sink: EventSink) -> None:
    if state.paths is not None and state.roots_created:
        await trio.to_thread.run_sync(remove_roots, state.paths)
        sink.emit("roots_removed")


def _summarize(
    state: _RunState, status: int, phase: str, sink: EventSink, env: Mapping[str, str]
) -> None:
    for note in state.degraded_notes:
        sink.degrade("harness", note)
    if state.config is None:
        return
    summary_path = env.get("GITHUB_STEP_SUMMARY")
    if state.paths is None or phase in ("preflight", "config"):
        markdown = (
            f"## Bounded queries — failed before the agent started (phase `{phase}`,"
            f" exit {status})\n\nSee the JSONL events on stderr for every problem and its fix.\n"
        )
        append_step_summary(summary_path, markdown, sink)
        return
    repos = [(r.repo, r.sensitivity) for r in state.config.private_repos]
    usage = usage_from_state(
        repos, _read_optional(state.paths.journal), _read_optional(state.paths.audit_log)
    )
    for repo in usage.repos:
        sink.emit(
            "repo_usage",
            repo=repo.repo,
            sensitivity=repo.sensitivity,
            budget=repo.budget,
            spent=repo.spent_bits,
            invocations=repo.invocations,
            buckets={str(k): v for k, v in repo.buckets.items()},
        )
    if usage.refused:
        sink.emit("refused_requests", count=usage.refused, reasons=usage.refusals)
    markdown = render_summary(
        usage, exit_code=status, runtime=state.config.runtime, degraded=sink.degraded
    )
    append_step_summary(summary_path, markdown, sink)


async def _run_agent_only(options: RunOptions, env: Mapping[str, str], sink: EventSink) -> int:
    state = _RunState(stop_grace=options.stop_grace)
    status = EXIT_HARNESS
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_signals, state, sink)
        with state.cancel:
            status = await _start_agent(options, env, state, sink)
        nursery.cancel_scope.cancel()
    if state.signal_number is not None and not state.agent_done:
        status = 128 + state.signal_number
    return status


async def run(
    options: RunOptions,
    sink: EventSink,
    env: Mapping[str, str] | None = None,
    start_broker: BrokerStarter | None = None,
) -> int:
    """Run the harness once; returns the process exit status."""
    env = dict(os.environ if env is None else env)
    loaded = load_reported(options.config_source, sink, env.get("GITHUB_STEP_SUMMARY"))
    if loaded is None:
        sink.emit("run_end", status=EXIT_HARNESS, phase="config")
        return EXIT_HARNESS
    if not loaded.config.enabled:
        sink.emit("bounded_queries_disabled")
        status = await _run_agent_only(options, env, sink)
        sink.emit("run_end", status=status)
        return status
    state = _RunState(config=loaded.config, stop_grace=options.stop_grace)
    status = EXIT_HARNESS
    phase = "preflight"
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_signals, state, sink)
            with state.cancel:
                if await _prepare(options, loaded, env, state, sink):
                    assert state.paths is not None
                    phase = "broker"
                    state.work_quota = await mount_work_quota(
                        state.paths.workspaces_dir,
                        parse_memory_limit(loaded.config.memory_limit),
                        sink,
                    )
                    starter = start_broker or start_child_broker
                    state.broker = await starter(options, state.paths, env)
                    sink.emit("broker_started")
                    if await _wait_ready(
                        state.paths, state.broker, options.ready_timeout, sink
                    ):
                        phase = "agent"
                        agent_env = agent_environment(env, state.paths, loaded.config)
                        status = await _start_agent(options, agent_env, state, sink)
                        if state.broker.exited() is not None:
                            state.degraded_notes.append(
                                "the broker exited while the agent ran; later queries failed"
                            )
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if state.signal_number is not None and not state.agent_done:
                status = 128 + state.signal_number
            try:
                try:
                    await _stop_broker(state, sink)
                    await _reconcile(state, sink)
                finally:
                    if state.work_quota and state.paths is not None:
                        await unmount_work_quota(state.paths.workspaces_dir, sink)
                        state.work_quota = False
                _summarize(state, status, phase, sink, env)
                await _remove_roots(state, sink)
            finally:
                sink.emit("run_end", status=status, phase=phase)
    return status
