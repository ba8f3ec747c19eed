"""Preparing a run: sweep, preflight, private root, staging, outputs (spec 14.2, 14.6, 14.8).

Theory of operation: :func:`execute_plan` carries out a
:class:`.plan.RunPlan` in order, reporting each phase as a JSONL event and
stopping at the first failure (which it reports; the caller tears down):

1. sweep the roots and agent containers left by a harness killed with
   SIGKILL (``sweep.py``, :func:`.agent.sweep_agent_containers`);
2. static preflight, then (unless disabled) the runtime probe;
3. the private root and its owner record (``sweep.py``), recorded in the
   :class:`.teardown.RunState` as soon as it exists, so teardown deletes it
   on every later path; for ``run``, the detached reaper (``reaper.py``),
   which deletes it on the one path teardown never runs, a SIGKILL;
4. offline staging with the staging token, which no later phase sees;
5. the seed map, the broker configuration, the skill and the wrapper
   directory; the socket directory is given to the agent's group.

With bounded agents on (``agents.py``), step 3 also creates the agent
private root and its owner record (before the reaper is armed, so its arm
names both pairs), step 4 stages the agent repositories into it with the
same token window, and step 5 writes its seed map, its ingress root (the
socket directory, the agent-wrapper's artifacts) and the API proxy's files
with the 0400 credential file, then seals the agent private root 0700.

Every blocking step runs in a worker thread; a cancellation (a signal) takes
effect between steps, never between creating the root and recording it.
:func:`prepare` is the same for ``compose``, without a broker.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

from bounded_query.broker.protocol.policy import (
    DOCKER_UNIX_SCHEME,
    SUBSYSTEM_AGENT,
    SUBSYSTEM_QUERY,
)
from bounded_query.harness.agent.launch import sweep_agent_containers
from bounded_query.harness.configuration.channel_policy import NON_ROOT_MISSING
from bounded_query.harness.configuration.config import (
    BoundedQueriesConfig,
    LoadedConfig,
    Problem,
)
from bounded_query.harness.configuration.preflight import (
    runtime_problems,
    staging_token,
    static_problems,
)
from bounded_query.harness.lifecycle.agents import (
    AgentPlan,
    seal_agent_private_root,
    write_proxy_files,
)
from bounded_query.harness.lifecycle.options import RunOptions
from bounded_query.harness.lifecycle.paths import RunPaths
from bounded_query.harness.lifecycle.plan import RunPlan, plan_run
from bounded_query.harness.lifecycle.reconcile import reconcile_containers
from bounded_query.harness.lifecycle.sweep import (
    MODE_COMPOSE,
    MODE_RUN,
    current_owner,
    sweep_stale_roots,
    write_owner_record,
)
from bounded_query.harness.lifecycle.teardown import RunState, remove_created_roots
from bounded_query.harness.records.events import EventSink
from bounded_query.harness.records.notices import problems_event
from bounded_query.harness.staging.outputs import (
    _seal,
    create_ingress_root,
    seed_map_doc,
    write_agent_side,
    write_json_private,
)
from bounded_query.harness.staging.seeds import (
    StagedSeed,
    StagingError,
    create_private_root,
    stage_seeds,
)

__all__ = ["PreparedRun", "execute_plan", "new_run_id", "prepare"]

#: Random bytes of a run id (its hex form names the run's containers).
RUN_ID_BYTES = 16


def new_run_id() -> str:
    """A fresh, unguessable run id."""
    return secrets.token_hex(RUN_ID_BYTES)


async def _sweep_agents(docker_host: str, sink: EventSink) -> None:
    """Remove agent containers left by a harness killed with SIGKILL (best effort)."""
    if not docker_host.startswith(DOCKER_UNIX_SCHEME):
        return
    with contextlib.suppress(Exception):
        await trio.to_thread.run_sync(sweep_agent_containers, docker_host, sink)


def _run_reconciler(docker_host: str) -> Callable[[str], object] | None:
    """The sweep's per-run reconcile on ``docker_host`` (a local engine only)."""
    if not docker_host.startswith(DOCKER_UNIX_SCHEME):
        return None
    return functools.partial(reconcile_containers, docker_host)


async def _start_reaper(
    plan: RunPlan, env: Mapping[str, str], state: RunState, sink: EventSink
) -> None:
    """Arm the reaper for this run; without one the run goes on, degraded (the
    next sweep is then the only cleanup after a SIGKILL)."""
    from bounded_query.harness.lifecycle.reaper import Arm, start_reaper

    paths = plan.paths
    agent_paths = state.agent_paths
    try:
        roots = (str(paths.private_root), str(paths.ingress_root))
        arm = Arm(
            plan.run_id,
            plan.docker_host,
            *roots,
            session=os.getsid(0),
            agent_private_root="" if agent_paths is None else str(agent_paths.private_root),
            agent_ingress_root="" if agent_paths is None else str(agent_paths.ingress_root),
        )
        state.reaper = await trio.to_thread.run_sync(start_reaper, arm, env)
    except (OSError, ValueError) as exc:
        sink.degrade("reaper", f"the reaper did not start ({exc})")
        return
    sink.emit("reaper_armed", pid=state.reaper.pid)


def _write_owner(plan: RunPlan, private_root: Path | None = None) -> None:
    root = plan.paths.private_root if private_root is None else private_root
    write_owner_record(root, current_owner(plan.owner_mode, plan.run_id))


def write_agent_ingress_artifacts(paths: RunPaths, agent_plan: AgentPlan) -> None:
    """HOOK for agent-wrapper (``harness/staging/skill.py``): its one function writing
    the ``bounded-agent`` CLI and its SKILL.md into the agent ingress root.

    Called with the ingress root created (``run/`` for the socket,
    ``skill/bin`` writable) and before ``skill/`` is sealed read-only. Until
    that function lands, nothing but the socket directory is there.
    """
    from bounded_query.harness.staging import skill

    writer = getattr(skill, "write_agent_ingress", None)
    if writer is not None:
        writer(paths, agent_plan.config)


def _write_agent_outputs(
    plan: RunPlan, agent_plan: AgentPlan, seeds: list[StagedSeed], credential: bytes
) -> None:
    """The agent seed map, ingress root and proxy files; then the agent private root is sealed."""
    paths = agent_plan.paths
    write_json_private(paths.seed_map, seed_map_doc(seeds))
    create_ingress_root(paths)
    write_agent_ingress_artifacts(paths, agent_plan)
    _seal(paths.skill_dir)
    if plan.socket_gid is not None:  # the agent connects through its group (0770)
        os.chown(paths.socket_dir, -1, plan.socket_gid, follow_symlinks=False)
    write_proxy_files(agent_plan, credential)
    seal_agent_private_root(agent_plan)


def _write_outputs(plan: RunPlan, config: BoundedQueriesConfig, seeds: list[StagedSeed]) -> None:
    paths = plan.paths
    write_json_private(paths.seed_map, seed_map_doc(seeds))
    write_json_private(paths.broker_config, plan.broker_config)
    write_agent_side(paths, config)
    if plan.socket_gid is not None:  # the agent connects through its group (0770)
        os.chown(paths.socket_dir, -1, plan.socket_gid, follow_symlinks=False)


async def execute_plan(
    plan: RunPlan,
    options: RunOptions,
    config: BoundedQueriesConfig,
    env: Mapping[str, str],
    state: RunState,
    sink: EventSink,
    agents: tuple[AgentPlan, bytes] | None = None,
) -> bool:
    """Sweep, preflight, staging and outputs; False after a reported failure.

    ``agents``: the bounded-agent plan and the provider credential (it is
    written to the proxy's 0400 file and referenced nowhere else).
    """
    await trio.to_thread.run_sync(
        sweep_stale_roots, options.base, plan.uid, sink, _run_reconciler(plan.docker_host)
    )
    await _sweep_agents(plan.docker_host, sink)
    state.run_id = plan.run_id
    state.docker_host = plan.docker_host
    paths = plan.paths
    sink.redact(paths.private_root, "<privateRoot>")
    sink.redact(paths.ingress_root, "<ingressRoot>")
    problems = await trio.to_thread.run_sync(static_problems, plan.preflight)
    if not problems and options.probe_runtime:
        problems = await runtime_problems(config, plan.docker_host, options.image, plan.run_id)
    if problems:
        problems_event(sink, "preflight_error", problems)
        sink.emit("preflight_failed", problems=len(problems))
        return False
    sink.emit("preflight_passed", runtime=config.runtime)
    if not plan.preflight.isolated_storage:
        sink.degrade(NON_ROOT_MISSING.subsystem, NON_ROOT_MISSING.reason)
    if plan.channels.degraded is not None:
        sink.degrade("cross-invocation channels", plan.channels.degraded)
    try:
        await trio.to_thread.run_sync(create_private_root, paths)
    except StagingError as exc:
        sink.emit("staging_failed", message=str(exc))
        return False
    state.paths = paths
    state.roots_created = True
    try:
        await trio.to_thread.run_sync(_write_owner, plan)
    except OSError as exc:
        sink.emit("staging_failed", message=f"cannot write the owner record: {exc.strerror or exc}")
        return False
    if agents is not None:
        agent_paths = agents[0].paths
        sink.redact(agent_paths.private_root, "<agentPrivateRoot>")
        sink.redact(agent_paths.ingress_root, "<agentIngressRoot>")
        try:
            await trio.to_thread.run_sync(create_private_root, agent_paths)
        except StagingError as exc:
            sink.emit("staging_failed", message=str(exc), subsystem=SUBSYSTEM_AGENT)
            return False
        state.agent_paths = agent_paths
        try:
            await trio.to_thread.run_sync(_write_owner, plan, agent_paths.private_root)
        except OSError as exc:
            message = f"cannot write the owner record: {exc.strerror or exc}"
            sink.emit("staging_failed", message=message, subsystem=SUBSYSTEM_AGENT)
            return False
    if plan.owner_mode == MODE_RUN:
        await _start_reaper(plan, env, state, sink)

    def staged(seed: StagedSeed, subsystem: str = SUBSYSTEM_QUERY) -> None:
        sink.emit(
            "repo_staged",
            repo=seed.repo,
            sensitivity=seed.sensitivity,
            commit=seed.commit,
            seconds=round(seed.seconds, 3),
            subsystem=subsystem,
        )

    def staged_agent(seed: StagedSeed) -> None:
        staged(seed, SUBSYSTEM_AGENT)

    agent_specs = [] if agents is None else list(agents[0].seeds)
    sink.emit("staging_started", repos=len(plan.seeds), agentRepos=len(agent_specs))
    token = staging_token(env)
    subsystem = SUBSYSTEM_QUERY
    try:
        seeds = await trio.to_thread.run_sync(
            lambda: stage_seeds(
                list(plan.seeds),
                paths,
                env,
                token,
                on_staged=staged,
                allow_insecure_server=options.allow_insecure_server,
            )
        )
        agent_seeds: list[StagedSeed] = []
        if agents is not None:
            # Staged again, into the agent root: no seed is shared (spec 15.1).
            subsystem = SUBSYSTEM_AGENT
            agent_root = agents[0].paths
            agent_seeds = await trio.to_thread.run_sync(
                lambda: stage_seeds(
                    agent_specs,
                    agent_root,
                    env,
                    token,
                    on_staged=staged_agent,
                    allow_insecure_server=options.allow_insecure_server,
                )
            )
    except StagingError as exc:
        sink.emit("staging_failed", message=str(exc), subsystem=subsystem)
        return False
    finally:
        token = None
    await trio.to_thread.run_sync(_write_outputs, plan, config, seeds)
    sink.emit("outputs_written", skill=str(paths.skill_file), socket=str(paths.socket_path))
    if agents is not None:
        agent_plan, credential = agents
        try:
            await trio.to_thread.run_sync(
                _write_agent_outputs, plan, agent_plan, agent_seeds, credential
            )
        except OSError as exc:
            message = f"cannot write the bounded-agent outputs: {exc.strerror or exc}"
            sink.emit("staging_failed", message=message, subsystem=SUBSYSTEM_AGENT)
            return False
        finally:
            credential = b""
        sink.emit(
            "outputs_written",
            skill=str(agent_plan.paths.skill_file),
            socket=str(agent_plan.paths.socket_path),
            subsystem=SUBSYSTEM_AGENT,
        )
    return True


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

    The roots' owner record says ``compose``: the sweep never removes them
    (``compose-down`` does). The caller mounts the workspace quota
    (``compose`` does, and ``compose-down`` unmounts it). Returns None after
    a reported failure, having removed what it created.

    Bounded agents are not composed yet (their proxy, networks and broker
    are ``run``'s): an enabled ``boundedAgents`` section is refused here,
    before anything is staged, rather than silently left out.
    """
    if loaded.agents.enabled:
        problem = Problem(
            "boundedAgents.enabled",
            "bounded agents are not available with compose yet",
            "use `bounded-query-harness run`, or disable the section for compose",
        )
        problems_event(sink, "preflight_error", [problem])
        sink.emit("preflight_failed", problems=1, subsystem=SUBSYSTEM_AGENT)
        return None
    state = RunState(config=loaded.config)
    plan = plan_run(
        options,
        loaded.config,
        env,
        run_id=new_run_id(),
        uid=os.getuid(),
        euid=os.geteuid(),
        owner_mode=MODE_COMPOSE,
    )
    try:
        ok = await execute_plan(plan, options, loaded.config, env, state, sink)
    except BaseException:
        with trio.CancelScope(shield=True):
            await remove_created_roots(state, sink)
        raise
    if not ok or state.paths is None:
        await remove_created_roots(state, sink)
        return None
    return PreparedRun(state.run_id, state.paths, loaded.config, state.docker_host)
