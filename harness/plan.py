"""Planning a run: every decision of prepare and teardown as a value (spec 14.2, 14.6-14.8).

Theory of operation: ``orchestrate.run`` first decides, then acts. The
functions here take the options, the validated configuration, the
environment and the few facts the harness has read about its process (uid,
euid, the workspace owner) and return plain values; they never touch the
file system, the engine or trio. ``prepare.py`` executes a :class:`RunPlan`
(sweep, preflight, roots, staging, outputs) and ``teardown.py`` a
:class:`TeardownPlan`, so the order and the conditions of both can be read
and tested here as tables.

* :func:`plan_run` -- the run's id, Docker host, both roots, the preflight
  inputs (what the agent can see), what to stage, the cross-invocation
  channel decision and the broker configuration document.
* :func:`choose_agent_user` and :func:`agent_mode_problems` -- who the agent
  runs as, and why a requested agent mode is refused.
* :func:`plan_teardown`, :func:`summary_kind`, :func:`final_status` -- what
  teardown undoes, which step summary is written, and the exit status after
  a signal (``options.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bounded_query.broker.protocol.policy import (
    DEFAULT_DOCKER_HOST,
    DOCKER_UNIX_SCHEME,
    docker_socket_path,
)

from .agent_spec import AgentUser, default_agent_user
from .channel_policy import ChannelDecision, channel_decision
from .config import BoundedQueriesConfig, Problem
from .options import RunOptions
from .outputs import broker_config_doc
from .paths import RunPaths, overlaps, run_paths
from .preflight import PreflightInputs, docker_host_from_env
from .staging import SeedSpec
from .sweep import MODE_RUN

__all__ = [
    "RunPlan",
    "SummaryKind",
    "TeardownPlan",
    "agent_mode_problems",
    "choose_agent_user",
    "final_status",
    "plan_run",
    "plan_teardown",
    "summary_kind",
]


@dataclass(frozen=True, slots=True)
class RunPlan:
    """What ``prepare`` will do for one run; computed without I/O."""

    run_id: str
    docker_host: str
    paths: RunPaths
    #: Everything static preflight looks at (``preflight.static_problems``).
    preflight: PreflightInputs
    #: One entry per private repository, in configuration order.
    seeds: tuple[SeedSpec, ...]
    #: Whether cross-invocation channels leave the run degraded (14.8).
    channels: ChannelDecision
    #: The ``bounded-query-broker --config`` document (``outputs.py``).
    broker_config: Mapping[str, Any]
    #: The broker socket's group: the agent's gid (None: the harness's).
    socket_gid: int | None
    #: The harness's uid: the roots' names and the sweep are per uid.
    uid: int
    #: The owner record's mode (``sweep.py``): ``run`` roots are swept once
    #: their harness is gone, ``compose`` roots never are.
    owner_mode: str


def plan_run(
    options: RunOptions,
    config: BoundedQueriesConfig,
    env: Mapping[str, str],
    *,
    run_id: str,
    uid: int,
    euid: int,
    socket_gid: int | None = None,
    owner_mode: str = MODE_RUN,
) -> RunPlan:
    """The plan of one run's preparation (spec 14.2, 14.6, 14.8).

    The agent can see ``/tmp``, the workspace, an absolute ``$HOME`` and every
    ``--agent-mount``: preflight refuses a private root overlapping any of
    them. Each invocation gets its own storage only when the broker runs as
    root (``euid`` 0). ``run_id`` is the caller's (a fresh random token).
    """
    docker_host = docker_host_from_env(env)
    paths = run_paths(uid, options.workspace, run_id, options.base)
    home = (Path(env["HOME"]),) if env.get("HOME", "").startswith("/") else ()
    inputs = PreflightInputs(
        config=config,
        paths=paths,
        env=env,
        seed_sources=dict(options.seed_sources),
        agent_visible=(Path("/tmp"), options.workspace, *home, *options.agent_mounts),
        allow_insecure_server=options.allow_insecure_server,
        allow_open_channels=options.allow_open_channels,
        isolated_storage=euid == 0,
    )
    channels = channel_decision(
        config.runtime,
        (repo.sensitivity for repo in config.private_repos),
        isolated_storage=inputs.isolated_storage,
        allow_open=inputs.allow_open_channels,
    )
    seeds = tuple(
        SeedSpec(repo, options.seed_sources.get(repo.repo.lower())) for repo in config.private_repos
    )
    broker_config = broker_config_doc(
        paths,
        run_id,
        config,
        image=options.image,
        docker_host=docker_host,
        socket_gid=socket_gid,
    )
    return RunPlan(
        run_id=run_id,
        docker_host=docker_host,
        paths=paths,
        preflight=inputs,
        seeds=seeds,
        channels=channels,
        broker_config=broker_config,
        socket_gid=socket_gid,
        uid=uid,
        owner_mode=owner_mode,
    )


def choose_agent_user(
    options: RunOptions, workspace_owner: tuple[int, int] | None
) -> AgentUser | None:
    """The agent's user: ``--agent-user``, else (container) the default rule.

    ``workspace_owner`` is the workspace's (uid, gid), None when it could not
    be read (then the default for a root-owned workspace applies). For a host
    agent without ``--agent-user`` this is None: the agent would keep the
    harness's uid, which only ``--unconfined-agent`` allows.
    """
    if options.agent_user is not None:
        return options.agent_user
    if options.agent_on_host:
        return None
    uid, gid = workspace_owner if workspace_owner is not None else (0, 0)
    return default_agent_user(uid, gid)


def agent_mode_problems(
    options: RunOptions,
    user: AgentUser | None,
    harness_uid: int,
    docker_host: str = DEFAULT_DOCKER_HOST,
) -> list[Problem]:
    """Why the requested agent mode is refused (empty: allowed)."""
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


@dataclass(frozen=True, slots=True)
class TeardownPlan:
    """What teardown undoes, in this order (each step only when True/set)."""

    stop_broker: bool
    #: Print the answers the broker audited last (the terminal progress).
    drain_progress: bool
    #: Force-remove every container labelled with the run id.
    reconcile: bool
    unmount_quota: bool
    #: Copy the run's state here before the roots go (``--keep-state``).
    keep_state: Path | None
    remove_roots: bool


def plan_teardown(
    *,
    broker_started: bool,
    progress_followed: bool,
    paths_known: bool,
    roots_created: bool,
    docker_host: str,
    work_quota: bool,
    keep_state: Path | None,
) -> TeardownPlan:
    """Teardown's steps from what the run got to (it runs on every path).

    Containers are reconciled only when roots were created (before that, no
    broker can have started one) and the engine is a local socket.
    """
    return TeardownPlan(
        stop_broker=broker_started,
        drain_progress=progress_followed and paths_known,
        reconcile=roots_created and docker_host.startswith(DOCKER_UNIX_SCHEME),
        unmount_quota=work_quota and paths_known,
        keep_state=keep_state if paths_known else None,
        remove_roots=paths_known and roots_created,
    )


#: Which step summary teardown writes: none (no valid configuration), the
#: short "failed before the agent started" note, or the per-repository usage.
SummaryKind = Literal["none", "failed-early", "usage"]


def summary_kind(*, config_known: bool, paths_known: bool, phase: str) -> SummaryKind:
    """The step summary of a run that ended in ``phase`` (seed 000 5.4)."""
    if not config_known:
        return "none"
    if not paths_known or phase in ("preflight", "config"):
        return "failed-early"
    return "usage"


def final_status(status: int, signal_number: int | None, agent_done: bool) -> int:
    """The exit status: 128+N when the harness got signal N before the agent finished."""
    if signal_number is not None and not agent_done:
        return 128 + signal_number
    return status
