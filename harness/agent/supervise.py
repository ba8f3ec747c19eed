"""Supervising the agent: start it in its mode, forward signals, stop it.

Theory of operation: one :class:`Supervision` record per run holds the
agent's handle (``agent.py``), the cancel scope of the run's main phase and
the first signal the harness received. :func:`watch_signals` runs beside
the phases: a signal while the agent runs is forwarded to it, and the run's
scope gets a deadline ``stop_grace`` seconds later (a second signal cancels
at once); without a running agent the scope is cancelled at once. When the
scope is cancelled while :func:`start_agent` waits, its shielded cleanup
terminates and then kills the agent (``AgentHandle.stop``), so teardown
always happens.

:func:`run_confined_agent` starts the agent in the mode the options chose:
in its container (``agent_spec.py``: the workspace, the socket directory and
the read-only skill/wrapper directory as its only mounts, a non-root uid),
on the host as a checked unprivileged user (after
:func:`.hostcheck.host_agent_problems` proved it cannot reach the private
root, the harness's or broker's environment, the Docker socket or the
journal), or on the host with the harness's own uid (``--unconfined-agent``,
degraded). The environment is the caller's minus the tokens
(:func:`agent_environment`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from bounded_query.harness.agent.hostcheck import HostCheck, host_agent_problems
from bounded_query.harness.agent.launch import (
    AgentHandle,
    AgentStartError,
    start_container_agent,
    start_host_agent,
    stdin_is_terminal,
)
from bounded_query.harness.agent.spec import AgentContainer, AgentUser
from bounded_query.harness.agent.spec import agent_environment as _agent_environment
from bounded_query.harness.configuration.config import BoundedQueriesConfig, Problem
from bounded_query.harness.lifecycle.options import AGENT_STOP_GRACE_S, EXIT_HARNESS, RunOptions
from bounded_query.harness.lifecycle.paths import RunPaths
from bounded_query.harness.lifecycle.sweep import MODE_RUN, current_owner
from bounded_query.harness.records.events import EventSink
from bounded_query.harness.records.notices import problems_event
from bounded_query.sandbox import engine
from bounded_query.sandbox.cpus import agent_cpu_set, agent_cpus

if TYPE_CHECKING:  # the reaper's module is also its process's __main__: not imported eagerly
    from bounded_query.harness.lifecycle.reaper import Reaper

__all__ = [
    "SIGNALS",
    "AgentLauncher",
    "Supervision",
    "agent_environment",
    "agent_image_problems",
    "degrade_unconfined",
    "host_launcher",
    "run_confined_agent",
    "start_agent",
    "watch_child",
    "watch_signals",
    "workspace_owner",
]

#: The signals the harness forwards to its agent (and otherwise stops on).
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: Starts the agent; raises :class:`AgentStartError` when it cannot.
AgentLauncher = Callable[[], Awaitable[AgentHandle]]


@dataclass
class Supervision:
    """The agent's side of one run's mutable state (signals and the handle)."""

    stop_grace: float = AGENT_STOP_GRACE_S
    #: The run's main phase; cancelling it stops the agent and starts teardown.
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)
    #: The last signal the harness received (None: none).
    signal_number: int | None = None
    agent: AgentHandle | None = None
    #: The agent exited (on its own or stopped) and its status is known.
    agent_done: bool = False
    #: The run's reaper: a host agent must die with the harness too (``reaper.py``).
    reaper: Reaper | None = None


async def watch_signals(sup: Supervision, sink: EventSink) -> None:
    """Forward a signal to a running agent, else cancel the run.

    An agent that ignores the forwarded signal gets ``stop_grace`` seconds;
    then (or at a second signal) the run is cancelled, which terminates and
    finally kills it, so teardown always happens.
    """
    with trio.open_signal_receiver(*SIGNALS) as signals:
        async for signum in signals:
            first = sup.signal_number is None
            sup.signal_number = signum
            sink.emit("signal", signal=signal.Signals(signum).name)
            agent = sup.agent
            if agent is not None and agent.poll() is None:
                await agent.signal(signum)
                if first:
                    deadline = trio.current_time() + sup.stop_grace
                    sup.cancel.deadline = min(sup.cancel.deadline, deadline)
                else:
                    sup.cancel.cancel()
            else:
                sup.cancel.cancel()


async def start_agent(launch: AgentLauncher, sup: Supervision, sink: EventSink) -> int:
    """Start the agent and wait for it; its exit status, or EXIT_HARNESS if it never started.

    On every way out (cancellation included) a still running agent is
    stopped and its handle closed, shielded from cancellation.
    """
    try:
        agent = await launch()
    except AgentStartError as exc:
        sink.emit("agent_failed_to_start", message=str(exc))
        return EXIT_HARNESS
    sup.agent = agent
    pid = getattr(agent, "pid", None)
    watch_child(sup.reaper, "agent", pid, sink)
    if pid is not None:
        sink.emit("agent_started", pid=pid)
    else:
        sink.emit("agent_started", container=agent.ident[:12])
    try:
        status = await agent.wait()
    finally:
        with trio.CancelScope(shield=True):
            if agent.poll() is None:
                killed = await agent.stop(sup.stop_grace)
                sink.emit("agent_stopped", status=killed)
            await agent.close()
    sup.agent_done = True
    sink.emit("agent_exited", status=status)
    return status


def watch_child(reaper: Reaper | None, role: str, pid: int | None, sink: EventSink) -> None:
    """Have the reaper kill child ``pid`` if the harness dies (no pid: nothing to watch)."""
    if pid is None or reaper is None:
        return
    if not reaper.watch(role, pid):
        sink.degrade("reaper", f"the {role} is not watched: a SIGKILL would leave it running")


def agent_environment(
    env: Mapping[str, str],
    paths: RunPaths,
    config: BoundedQueriesConfig,
    *,
    container: bool = False,
    agents: tuple[RunPaths, tuple[str, ...]] | None = None,
) -> dict[str, str]:
    """The agent's environment (spec 14.8, 15.8; ``agent_spec.agent_environment``).

    ``agents``: the bounded-agent roots and slugs, when that subsystem is on.
    """
    return _agent_environment(
        env,
        socket_path=str(paths.socket_path),
        skill_file=str(paths.skill_file),
        slugs=config.slugs,
        wrapper_dir=str(paths.wrapper_dir),
        private_root=str(paths.private_root),
        container=container,
        agents=None
        if agents is None
        else (
            str(agents[0].socket_path),
            str(agents[0].skill_file),
            agents[1],
            str(agents[0].wrapper_dir),
        ),
    )


def _pin_host_agent(pid: int) -> None:
    """Best effort: a host agent runs on the agent CPUs too (a failure changes nothing)."""
    with contextlib.suppress(OSError, ValueError):
        os.sched_setaffinity(pid, agent_cpu_set(os.cpu_count() or 1))


def host_launcher(
    options: RunOptions, env: Mapping[str, str], user: AgentUser | None, *, pin: bool = True
) -> AgentLauncher:
    """Start ``options.agent`` on the host (as ``user``; None: the harness's uid)."""

    async def launch() -> AgentHandle:
        agent = await start_host_agent(options.agent, env, str(options.workspace), user)
        if pin:
            _pin_host_agent(agent.pid)
        return agent

    return launch


def _container_launcher(
    options: RunOptions,
    env: Mapping[str, str],
    paths: RunPaths,
    user: AgentUser,
    *,
    run_id: str,
    docker_host: str,
    agent_paths: RunPaths | None = None,
) -> AgentLauncher:
    tty = stdin_is_terminal() if options.agent_tty is None else options.agent_tty

    async def launch() -> AgentHandle:
        try:
            owner = await trio.to_thread.run_sync(current_owner, MODE_RUN)  # reads /proc
            spec = AgentContainer(
                image=options.agent_image,
                argv=options.agent,
                workspace=str(options.workspace),
                socket_dir=str(paths.socket_dir),
                skill_dir=str(paths.skill_dir),
                extra_mounts=()
                if agent_paths is None
                else ((str(agent_paths.socket_dir), False), (str(agent_paths.skill_dir), True)),
                env=env,
                user=user,
                run_id=run_id,
                owner=json.dumps(owner.to_doc(), sort_keys=True),
                network=options.agent_network,
                tty=tty,
                # The agent's CPUs (sandbox/cpus.py): disjoint from the queries' when partitioned.
                cpuset=agent_cpus(os.cpu_count() or 1),
            )
        except (ValueError, OSError) as exc:
            raise AgentStartError(str(exc)) from None
        return await start_container_agent(docker_host, spec)

    return launch


async def run_confined_agent(
    options: RunOptions,
    env: Mapping[str, str],
    sup: Supervision,
    user: AgentUser | None,
    sink: EventSink,
    *,
    paths: RunPaths,
    config: BoundedQueriesConfig,
    run_id: str,
    docker_host: str,
    broker_pid: int | None,
    agents: tuple[RunPaths, tuple[str, ...]] | None = None,
    agent_broker_pid: int | None = None,
) -> int:
    """Start the agent in the requested mode (after the host check for a host agent).

    ``agents``: the bounded-agent roots and slugs (their variables and, in a
    container, their ingress directories), when that subsystem is on; a host
    agent is then checked against the agent private root, journal, socket
    and broker as well.
    """
    container = not options.agent_on_host
    agent_env = agent_environment(env, paths, config, container=container, agents=agents)
    if container:
        assert user is not None
        sink.emit(
            "agent_mode",
            mode="container",
            user=str(user),
            image=options.agent_image,
            network=options.agent_network,
        )
        launch = _container_launcher(
            options,
            agent_env,
            paths,
            user,
            run_id=run_id,
            docker_host=docker_host,
            agent_paths=None if agents is None else agents[0],
        )
        return await start_agent(launch, sup, sink)
    if user is not None:
        check = HostCheck(
            user=user,
            private_root=paths.private_root,
            journal=paths.journal,
            socket_path=paths.socket_path,
            pids=tuple(p for p in (os.getpid(), broker_pid) if p is not None),
            docker_host=docker_host,
        )
        problems = await trio.to_thread.run_sync(host_agent_problems, check)
        if not problems and agents is not None:
            agent_paths = agents[0]
            agent_check = HostCheck(
                user=user,
                private_root=agent_paths.private_root,
                journal=agent_paths.journal,
                socket_path=agent_paths.socket_path,
                pids=tuple(p for p in (agent_broker_pid,) if p is not None),
                docker_host=docker_host,
            )
            problems = await trio.to_thread.run_sync(host_agent_problems, agent_check)
        if problems:
            problems_event(sink, "preflight_error", problems)
            sink.emit("preflight_failed", problems=len(problems))
            return EXIT_HARNESS
        sink.emit("agent_mode", mode="host", user=str(user))
    else:
        sink.emit("agent_mode", mode="host-unconfined", user=str(os.getuid()))
    return await start_agent(host_launcher(options, agent_env, user), sup, sink)


def agent_image_problems(docker_host: str, image: str) -> list[Problem]:
    """The agent container's image must exist locally (nothing is ever pulled; blocking)."""
    import docker

    try:
        client = engine.docker_client(docker_host, 30)
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


def degrade_unconfined(sink: EventSink) -> None:
    """Report a host agent with the harness's own uid: degraded, also on the terminal."""
    sink.degrade("agent", _UNCONFINED_NOTE)
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"bounded-query-harness: DEGRADED: {_UNCONFINED_NOTE}\n")
        sys.stderr.flush()


def workspace_owner(workspace: Path) -> tuple[int, int] | None:
    """The workspace's (uid, gid), None when it cannot be read (blocking)."""
    try:
        st = os.stat(workspace)
    except OSError:
        return None
    return st.st_uid, st.st_gid
