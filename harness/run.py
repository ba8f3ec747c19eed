"""``bounded-query-harness run``: one complete run (spec 14.2, 14.6-14.8).

Phases, each reported as a JSONL event: configuration -> the sweep of roots
left by a harness killed with SIGKILL (``sweep.py``) -> preflight (static,
then the runtime probe) -> private root with its owner record, and staging -> seed map, broker
config, skill and wrapper -> broker (a child process in its own session; or
the compose service) -> readiness (the broker's ``control/ready`` file) ->
the agent command -> teardown. Before the broker starts, a size-limited tmpfs
is mounted over the private root's ``work/`` (the query workspaces; see
``quota.py``), or the run is reported degraded.

The agent is confined (issue 8, ``agent.py``): by default it runs in its own
container (``agent_spec.py``: the workspace, the socket directory and the
read-only skill/wrapper directory as its only mounts, a non-root uid, no
capabilities); with ``--agent-on-host`` it runs on the host as an
unprivileged user after :func:`.hostcheck.host_agent_problems` proved that
user cannot reach the private root, the harness's or broker's environment,
the Docker socket or the journal; as root only with ``--unconfined-agent``,
and then the run is degraded. It gets the caller's environment minus
GH_TOKEN/GITHUB_TOKEN (and anything naming the private root), plus
``AWF_BOUNDED_QUERY_SOCKET``, ``AWF_BOUNDED_QUERY_SKILL`` and
``AWF_BOUNDED_QUERY_REPOS`` (slugs only) and the wrapper directory first on
PATH; the broker socket is group-owned by the agent's gid. With the section
absent or not enabled, nothing is staged or started and the agent runs with
the environment untouched (spec 14.2).

The staging token is read once (:func:`.tokens.take_process_token` wipes it
from this process's own environment block at start) and dropped from the
run's environment as soon as staging is over: only the clone children ever
hold it.

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
import json
import os
import secrets
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import trio
from bounded_query.broker.runner import LABEL_RUN, parse_memory_limit
from bounded_query.sandbox.cpus import agent_cpu_set, agent_cpus

from .agent import (
    AgentHandle,
    AgentStartError,
    start_container_agent,
    start_host_agent,
    stdin_is_terminal,
    sweep_agent_containers,
)
from .agent_spec import (
    AGENT_NETWORK_DEFAULT,
    DEFAULT_AGENT_IMAGE,
    AgentContainer,
    AgentUser,
    default_agent_user,
)
from .agent_spec import agent_environment as _agent_environment
from .channel_policy import channel_decision
from .child import broker_environment, start_child_broker
from .config import BoundedQueriesConfig, ConfigError, LoadedConfig, Problem, load_config
from .events import EventSink, append_step_summary
from .hostcheck import HostCheck, host_agent_problems
from .outputs import (
    DEFAULT_IMAGE,
    broker_config_doc,
    remove_roots,
    seed_map_doc,
    write_agent_side,
    write_json_private,
)
from .paths import DEFAULT_BASE, RunPaths, overlaps, run_paths
from .preflight import (
    TOKEN_VARIABLES,
    PreflightInputs,
    docker_host_from_env,
    runtime_problems,
    staging_token,
    static_problems,
)
from .progress import AuditFollower, drain, follow_audit
from .quota import mount_work_quota, unmount_work_quota
from .report import keep_state, read_optional
from .staging import SeedSpec, StagedSeed, StagingError, create_private_root, stage_seeds
from .summary import render_summary, usage_from_state
from .sweep import MODE_COMPOSE, MODE_RUN, current_owner, sweep_stale_roots, write_owner_record
from .tokens import scrub_process_environment

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
    #: Run the agent on the host instead of in its container.
    agent_on_host: bool = False
    #: The agent's uid/gid (default: the workspace owner unless root, else
    #: ``agent_spec.DEFAULT_AGENT_UID``; on the host: none, i.e. refused).
    agent_user: AgentUser | None = None
    #: Allow a host agent with the harness's own uid (root): degraded.
    unconfined_agent: bool = False
    agent_image: str = DEFAULT_AGENT_IMAGE
    agent_network: str = AGENT_NETWORK_DEFAULT
    #: Give the agent container a TTY; None: when stdin is a terminal.
    agent_tty: bool | None = None
    #: Allow a non-https ``GITHUB_SERVER_URL`` (local test servers only).
    allow_insecure_server: bool = False
    #: ``--allow-runc-mixed-sensitivity``: accept a public + metered run where
    #: cross-invocation channels stay open, degraded (harness/channel_policy.py).
    allow_mixed_sensitivity: bool = False
    #: ``--keep-state DIR``: copy the journal, audit log, seed map and broker
    #: config there at teardown, for ``report --state DIR`` (``report.py``).
    keep_state: Path | None = None
    #: One human line per answered invocation on stderr (``progress.py``);
    #: None: when stderr is a terminal.
    progress: bool | None = None


async def _keep_state(paths: RunPaths, target: Path, sink: EventSink) -> None:
    """Copy the run's state out before the roots go; a failure only degrades."""
    try:
        copied = await trio.to_thread.run_sync(keep_state, paths, target)
    except OSError as exc:
        sink.degrade("keep-state", f"the run's state was not kept: {exc.strerror or exc}")
        return
    sink.emit("state_kept", files=copied)


def _print_progress(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


class BrokerHandle(Protocol):
    """A started broker (child process or compose service)."""

    def exited(self) -> int | None:
        """The broker's exit status, or None while it runs."""
        ...

    async def stop(self) -> int | None:
        """Stop it (SIGTERM, then SIGKILL); return the exit status if known."""
        ...


def agent_environment(
    env: Mapping[str, str],
    paths: RunPaths,
    config: BoundedQueriesConfig,
    *,
    container: bool = False,
) -> dict[str, str]:
    """The agent's environment (spec 14.8; ``agent_spec.agent_environment``)."""
    return _agent_environment(
        env,
        socket_path=str(paths.socket_path),
        skill_file=str(paths.skill_file),
        slugs=config.slugs,
        wrapper_dir=str(paths.wrapper_dir),
        private_root=str(paths.private_root),
        container=container,
    )


def resolve_agent_user(options: RunOptions) -> AgentUser | None:
    """The agent's user: ``--agent-user``, else (container) the default rule.

    For a host agent without ``--agent-user`` this is None: the agent would
    keep the harness's uid, which only ``--unconfined-agent`` allows.
    """
    if options.agent_user is not None:
        return options.agent_user
    if options.agent_on_host:
        return None
    try:
        st = os.stat(options.workspace)
    except OSError:
        return default_agent_user(0, 0)
    return default_agent_user(st.st_uid, st.st_gid)


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
                f"### Bounded queries — invalid configuration (exit {EXIT_HARNESS})",
                "",
                "Nothing was staged or started. Fix every problem below and run again:",
                "",
                *(f"- `{p.location}`: {p.message} — fix: {p.hint}" for p in exc.problems),
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


@dataclass
class _RunState:
    """Mutable bookkeeping of one run, for teardown."""

    signal_number: int | None = None
    agent: AgentHandle | None = None
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
    #: The broker socket's group: the agent's gid (None: the harness's).
    socket_gid: int | None = None
    #: The terminal progress follower of the audit log, when enabled.
    progress: AuditFollower | None = None


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
                await agent.signal(signum)
                if first:
                    deadline = trio.current_time() + state.stop_grace
                    state.cancel.deadline = min(state.cancel.deadline, deadline)
                else:
                    state.cancel.cancel()
            else:
                state.cancel.cancel()


AgentLauncher = Callable[[], Awaitable[AgentHandle]]


def _host_launcher(
    options: RunOptions, env: Mapping[str, str], user: AgentUser | None, *, pin: bool = True
) -> AgentLauncher:
    async def launch() -> AgentHandle:
        agent = await start_host_agent(options.agent, env, str(options.workspace), user)
        if pin:
            _pin_host_agent(agent.pid)
        return agent

    return launch


def _container_launcher(
    options: RunOptions, env: Mapping[str, str], state: _RunState, user: AgentUser
) -> AgentLauncher:
    assert state.paths is not None
    paths = state.paths
    tty = stdin_is_terminal() if options.agent_tty is None else options.agent_tty

    async def launch() -> AgentHandle:
        try:
            spec = AgentContainer(
                image=options.agent_image,
                argv=options.agent,
                workspace=str(options.workspace),
                socket_dir=str(paths.socket_dir),
                skill_dir=str(paths.skill_dir),
                env=env,
                user=user,
                run_id=state.run_id,
                owner=json.dumps(current_owner(MODE_RUN).to_doc(), sort_keys=True),
                network=options.agent_network,
                tty=tty,
                cpuset=_agent_cpuset(),
            )
        except (ValueError, OSError) as exc:
            raise AgentStartError(str(exc)) from None
        return await start_container_agent(state.docker_host, spec)

    return launch


def _agent_cpuset() -> str:
    """The agent's CPUs (``sandbox/cpus.py``): disjoint from the queries' when partitioned."""
    return agent_cpus(os.cpu_count() or 1)


def _pin_host_agent(pid: int) -> None:
    """Best effort: a host agent runs on the agent CPUs too (a failure changes nothing)."""
    with contextlib.suppress(OSError, ValueError):
        os.sched_setaffinity(pid, agent_cpu_set(os.cpu_count() or 1))


async def _start_agent(launch: AgentLauncher, state: _RunState, sink: EventSink) -> int:
    try:
        agent = await launch()
    except AgentStartError as exc:
        sink.emit("agent_failed_to_start", message=str(exc))
        return EXIT_HARNESS
    state.agent = agent
    pid = getattr(agent, "pid", None)
    if pid is not None:
        sink.emit("agent_started", pid=pid)
    else:
        sink.emit("agent_started", container=agent.ident[:12])
    try:
        status = await agent.wait()
    finally:
        with trio.CancelScope(shield=True):
            if agent.poll() is None:
                killed = await agent.stop(state.stop_grace)
                sink.emit("agent_stopped", status=killed)
            await agent.close()
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
    await _sweep_agents(docker_host_from_env(env), sink)
    state.run_id = secrets.token_hex(16)
    state.docker_host = docker_host_from_env(env)
    paths = run_paths(os.getuid(), options.workspace, state.run_id, options.base)
    sink.redact(paths.private_root, "<privateRoot>")
    sink.redact(paths.ingress_root, "<ingressRoot>")
    home = (Path(env["HOME"]),) if env.get("HOME", "").startswith("/") else ()
    visible = (Path("/tmp"), options.workspace, *home, *options.agent_mounts)
    inputs = PreflightInputs(
        config=config,
        paths=paths,
        env=env,
        seed_sources=dict(options.seed_sources),
        agent_visible=visible,
        allow_insecure_server=options.allow_insecure_server,
        allow_mixed_sensitivity=options.allow_mixed_sensitivity,
        isolated_storage=os.geteuid() == 0,
    )
    problems = static_problems(inputs)
    if not problems and options.probe_runtime:
        problems = await runtime_problems(config, state.docker_host, options.image, state.run_id)
    if problems:
        _problems_event(sink, "preflight_error", problems)
        sink.emit("preflight_failed", problems=len(problems))
        return False
    sink.emit("preflight_passed", runtime=config.runtime)
    channels = channel_decision(
        config.runtime,
        (repo.sensitivity for repo in config.private_repos),
        isolated_storage=inputs.isolated_storage,
        allow_mixed=inputs.allow_mixed_sensitivity,
    )
    if channels.degraded is not None:
        sink.degrade("cross-invocation channels", channels.degraded)
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
            lambda: stage_seeds(
                specs,
                paths,
                env,
                token,
                on_staged=staged,
                allow_insecure_server=options.allow_insecure_server,
            )
        )
    except StagingError as exc:
        sink.emit("staging_failed", message=str(exc))
        return False
    finally:
        token = None
    write_json_private(paths.seed_map, seed_map_doc(seeds))
    write_json_private(
        paths.broker_config,
        broker_config_doc(
            paths,
            state.run_id,
            config,
            image=options.image,
            docker_host=state.docker_host,
            socket_gid=state.socket_gid,
        ),
    )
    write_agent_side(paths, config)
    if state.socket_gid is not None:  # the agent connects through its group (0770)
        os.chown(paths.socket_dir, -1, state.socket_gid, follow_symlinks=False)
    sink.emit("outputs_written", skill=str(paths.skill_file), socket=str(paths.socket_path))
    return True


async def _sweep_agents(docker_host: str, sink: EventSink) -> None:
    """Remove agent containers left by a harness killed with SIGKILL (best effort)."""
    if not docker_host.startswith("unix://"):
        return
    with contextlib.suppress(Exception):
        await trio.to_thread.run_sync(sweep_agent_containers, docker_host, sink)


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
            f"### Bounded queries — failed before the agent started (phase `{phase}`,"
            f" exit {status})\n\nSee the JSONL events on stderr for every problem and its fix.\n"
        )
        append_step_summary(summary_path, markdown, sink)
        return
    repos = [(r.repo, r.sensitivity) for r in state.config.private_repos]
    usage = usage_from_state(
        repos, read_optional(state.paths.journal), read_optional(state.paths.audit_log)
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
            status = await _start_agent(_host_launcher(options, env, None, pin=False), state, sink)
        nursery.cancel_scope.cancel()
    if state.signal_number is not None and not state.agent_done:
        status = 128 + state.signal_number
    return status


def docker_socket_path(docker_host: str) -> str:
    """The Docker socket's path of a ``unix://`` host, else the empty string."""
    return docker_host[len("unix://") :] if docker_host.startswith("unix://") else ""


def agent_mode_problems(
    options: RunOptions,
    user: AgentUser | None,
    harness_uid: int,
    docker_host: str = "unix:///var/run/docker.sock",
) -> list[Problem]:
    """Why the requested agent mode is refused (empty: allowed); issue 8 item 2."""
    where = "--agent-on-host"
    if options.unconfined_agent and not options.agent_on_host:
        return [
            Problem(
                "--unconfined-agent",
                "only applies to --agent-on-host",
                "drop --unconfined-agent (the agent container is confined)",
            )
        ]
    if not options.agent_on_host:
        socket = docker_socket_path(docker_host)
        if socket and overlaps(options.workspace, Path(socket)):
            return [
                Problem(
                    "--workspace",
                    f"contains the Docker socket {socket}, which the"
                    " agent container would then reach",
                    "pick another workspace",
                )
            ]
        return []
    if user is None and not options.unconfined_agent:
        return [
            Problem(
                where,
                f"the agent would run with the harness's own uid {harness_uid}"
                + (" (root)" if harness_uid == 0 else "")
                + ": it could read the staging token, the seeds and the journal",
                "pass --agent-user UID[:GID] of an unprivileged user, or drop --agent-on-host"
                " to run the agent in its container (--unconfined-agent accepts a degraded"
                " run)",
            )
        ]
    if user is not None and harness_uid != 0 and user.uid != harness_uid:
        return [
            Problem(
                "--agent-user",
                f"switching to uid {user.uid} needs a root harness",
                "run the harness as root, or run the agent in its container",
            )
        ]
    return []


def agent_image_problems(docker_host: str, image: str) -> list[Problem]:
    """The agent container's image must exist locally (nothing is ever pulled)."""
    import docker

    try:
        client = docker.DockerClient(base_url=docker_host, timeout=30)
    except Exception as exc:
        return [
            Problem(
                "--agent-image",
                f"no Docker engine ({exc.__class__.__name__})",
                "start the engine (.ci/provision-engine)",
            )
        ]
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return [
            Problem(
                "--agent-image",
                f"image {image} is not on the engine",
                "build it with `bounded-query-harness images` (or .ci/build-images),"
                " or pass --agent-image",
            )
        ]
    except Exception as exc:
        return [
            Problem(
                "--agent-image",
                f"cannot inspect {image}: {exc.__class__.__name__}",
                "check the Docker engine",
            )
        ]
    finally:
        client.close()
    return []


_UNCONFINED_NOTE = (
    "the agent runs on the host with the harness's uid (--unconfined-agent): it can read"
    " the staging token, the seeds, the journal and the audit log"
)


def _degrade_unconfined(sink: EventSink) -> None:
    sink.degrade("agent", _UNCONFINED_NOTE)
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"bounded-query-harness: DEGRADED: {_UNCONFINED_NOTE}\n")
        sys.stderr.flush()


async def _run_confined_agent(
    options: RunOptions,
    env: Mapping[str, str],
    state: _RunState,
    user: AgentUser | None,
    sink: EventSink,
) -> int:
    """Start the agent in the requested mode (after the host check for a host agent)."""
    assert state.paths is not None
    assert state.config is not None
    container = not options.agent_on_host
    agent_env = agent_environment(env, state.paths, state.config, container=container)
    if container:
        assert user is not None
        sink.emit(
            "agent_mode",
            mode="container",
            user=str(user),
            image=options.agent_image,
            network=options.agent_network,
        )
        return await _start_agent(_container_launcher(options, agent_env, state, user), state, sink)
    if user is not None:
        broker_pid = getattr(state.broker, "pid", None)
        problems = await trio.to_thread.run_sync(
            lambda: host_agent_problems(
                HostCheck(
                    user=user,
                    private_root=state.paths.private_root if state.paths else Path("/"),
                    journal=state.paths.journal if state.paths else Path("/"),
                    socket_path=state.paths.socket_path if state.paths else Path("/"),
                    pids=tuple(p for p in (os.getpid(), broker_pid) if p is not None),
                    docker_host=state.docker_host,
                )
            )
        )
        if problems:
            _problems_event(sink, "preflight_error", problems)
            sink.emit("preflight_failed", problems=len(problems))
            return EXIT_HARNESS
        sink.emit("agent_mode", mode="host", user=str(user))
    else:
        sink.emit("agent_mode", mode="host-unconfined", user=str(os.getuid()))
    return await _start_agent(_host_launcher(options, agent_env, user), state, sink)


async def run(
    options: RunOptions,
    sink: EventSink,
    env: Mapping[str, str] | None = None,
    start_broker: BrokerStarter | None = None,
) -> int:
    """Run the harness once; returns the process exit status.

    With ``env`` None the process environment is used, and the token
    variables are then wiped from it at once (``tokens.py``).
    """
    if env is None:
        env = dict(os.environ)
        scrub_process_environment(TOKEN_VARIABLES)
    else:
        env = dict(env)
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
    user = resolve_agent_user(options)
    refusal = agent_mode_problems(options, user, os.getuid(), docker_host_from_env(env))
    if not refusal and not options.agent_on_host and options.probe_runtime:
        refusal = await trio.to_thread.run_sync(
            agent_image_problems, docker_host_from_env(env), options.agent_image
        )
    if refusal:
        _problems_event(sink, "preflight_error", refusal)
        sink.emit("preflight_failed", problems=len(refusal))
        _summarize(state, status, phase, sink, env)
        sink.emit("run_end", status=status, phase=phase)
        return status
    if options.agent_on_host and user is None:
        _degrade_unconfined(sink)
    state.socket_gid = None if user is None else user.gid
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_signals, state, sink)
            with state.cancel:
                if await _prepare(options, loaded, env, state, sink):
                    for name in TOKEN_VARIABLES:  # staging is over: nothing needs it now
                        env.pop(name, None)
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
                    if await _wait_ready(state.paths, state.broker, options.ready_timeout, sink):
                        phase = "agent"
                        progress = options.progress
                        if progress is None:
                            progress = sys.stderr.isatty()
                        if progress:
                            state.progress = AuditFollower()
                            nursery.start_soon(
                                partial(
                                    follow_audit,
                                    state.paths.audit_log,
                                    _print_progress,
                                    follower=state.progress,
                                )
                            )
                        status = await _run_confined_agent(options, env, state, user, sink)
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
                    if state.progress is not None and state.paths is not None:
                        # The broker is gone: print the answers it audited last.
                        await trio.to_thread.run_sync(
                            drain, state.paths.audit_log, state.progress, _print_progress
                        )
                    await _reconcile(state, sink)
                finally:
                    if state.work_quota and state.paths is not None:
                        await unmount_work_quota(state.paths.workspaces_dir, sink)
                        state.work_quota = False
                _summarize(state, status, phase, sink, env)
                if options.keep_state is not None and state.paths is not None:
                    await _keep_state(state.paths, options.keep_state, sink)
                await _remove_roots(state, sink)
            finally:
                sink.emit("run_end", status=status, phase=phase)
    return status
