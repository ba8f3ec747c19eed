"""``bounded-query-harness run``: one complete run, phase by phase (spec 14.2, 14.6-14.8).

Phases, each reported as a JSONL event: configuration -> the agent mode
(``plan.agent_mode_problems``; the agent image must exist) -> the plan
(``plan.py``, no I/O) -> its execution (``prepare.py``: the sweep of roots
left by a harness killed with SIGKILL, preflight, private root with its
owner record, staging, seed map, broker config, skill and wrapper) -> the
workspace quota (a size-limited tmpfs over the private root's ``work/``,
``quota.py``; or the run is reported degraded) -> the broker (a child
process in its own session, ``child.py``, whose stderr lines are relayed as
``bounded-query-broker/v1`` records until teardown, ``broker_log.py``; or
the compose service) ->
readiness (the broker's ``control/ready`` file) -> the agent
(``supervise.py``) -> teardown (``teardown.py``).

The agent is confined: by default it runs in its own container;
with ``--agent-on-host`` as an unprivileged user after the host check; as
the harness's own uid only with ``--unconfined-agent``, and then the run is
degraded. With the section absent or not enabled, nothing is staged or
started and the agent runs with the environment untouched (spec 14.2).

The staging token is read once (:func:`.tokens.scrub_process_environment`
wipes it from this process's own environment block at start) and dropped
from the run's environment as soon as staging is over: only the clone
children ever hold it.

Teardown runs on every path (normal exit, failure, SIGINT/SIGTERM/SIGHUP),
shielded from cancellation. On the one path it cannot run, a SIGKILL, the
detached reaper (``reaper.py``, armed by ``prepare.py`` once the roots
exist; the broker child and a host agent are watched by pidfd as they
start) removes the run within seconds; the broker child also carries a
parent-death signal (SIGTERM).
With ``boundedAgents`` enabled (``agents.py``, spec 15): the provider
credential is taken from the run's environment and wiped from the
process's own at once; preparation also creates, stages and writes the
agent roots and the proxy's files; after the query broker is ready, the
enclave and egress networks, the API proxy (ready when its control socket
answers) and the agent broker child (its own readiness wait) start, in that
order, before the agent; any failure there is exit 2 before the agent. The
agent then gets the ``AWF_BOUNDED_AGENT_*`` variables and, in its
container, the agent ingress directories.

Exit status: see ``options.py``. A signal while the agent runs is forwarded
to it; an agent that has not exited ``stop_grace`` seconds later (or at a
second signal) is terminated, then killed (``supervise.py``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from functools import partial

import trio

from bounded_query.broker.protocol.policy import (
    AGENT_CREDENTIAL_VARIABLES,
    SUBSYSTEM_AGENT,
    parse_memory_limit,
)
from bounded_query.broker.readiness import decode_ready
from bounded_query.broker.runner import Degradation
from bounded_query.harness.agent.supervise import (
    Supervision,
    agent_image_problems,
    degrade_unconfined,
    host_launcher,
    run_confined_agent,
    start_agent,
    watch_child,
    watch_signals,
    workspace_owner,
)
from bounded_query.harness.configuration.agent_preflight import (
    AgentPreflightInputs,
    agent_api_target,
    agent_preflight,
    credential_variable,
)
from bounded_query.harness.configuration.channel_policy import (
    ChannelDecision,
    channel_decision,
    pin_missing,
)
from bounded_query.harness.configuration.config import Problem
from bounded_query.harness.configuration.preflight import docker_host_from_env
from bounded_query.harness.lifecycle.agents import (
    AgentPlan,
    AgentSetupError,
    agent_broker_config_doc,
    create_networks,
    plan_agents,
    start_proxy,
    take_credential,
    wait_proxy_ready,
    write_proxy_config,
)
from bounded_query.harness.lifecycle.broker_child import start_child_broker
from bounded_query.harness.lifecycle.options import (
    EXIT_HARNESS,
    READY_POLL_S,
    BrokerHandle,
    BrokerStarter,
    RunOptions,
)
from bounded_query.harness.lifecycle.paths import RunPaths
from bounded_query.harness.lifecycle.plan import (
    RunPlan,
    agent_mode_problems,
    choose_agent_user,
    final_status,
    plan_run,
)
from bounded_query.harness.lifecycle.prepare import execute_plan, new_run_id
from bounded_query.harness.lifecycle.quota import mount_work_quota
from bounded_query.harness.lifecycle.teardown import RunState, summarize, teardown
from bounded_query.harness.records.events import EventSink
from bounded_query.harness.records.notices import load_reported, print_progress, problems_event
from bounded_query.harness.records.progress import AuditFollower, follow_audit
from bounded_query.harness.staging.outputs import write_json_private
from bounded_query.harness.staging.tokens import TOKEN_VARIABLES, scrub_process_environment

__all__ = ["readiness_decision", "report_lost_protections", "run", "wait_ready"]


def _probe_ready(paths: RunPaths, broker: BrokerHandle) -> tuple[str | None, int | None]:
    """(readiness file text or None, exit status) of the broker (blocking: a
    read, and for the compose service an engine call)."""
    try:
        return paths.ready_file.read_text(encoding="utf-8", errors="replace"), None
    except FileNotFoundError:
        return None, broker.exited()
    except OSError:  # there, but not ours to read (a root broker service): ready, unknown
        return "", None


async def wait_ready(
    paths: RunPaths,
    broker: BrokerHandle,
    limit_s: float,
    sink: EventSink,
    subsystem: str | None = None,
) -> tuple[Degradation, ...] | None:
    """Wait up to ``limit_s`` for the broker's ready file; None (reported) if it exits first.

    Returns the protections the file says the runner could not set up (a
    ``degraded`` entry, ``broker/readiness.py``; empty when none). Each
    becomes a ``degraded`` event, and so part of the step summary, before
    the agent starts; the caller asks the channel policy whether the run
    may go on without them (:func:`readiness_problem`). ``subsystem`` names
    the bounded-agent broker in the events.
    """
    named = {} if subsystem is None else {"subsystem": subsystem}
    with trio.move_on_after(limit_s):
        while True:
            ready, status = await trio.to_thread.run_sync(_probe_ready, paths, broker)
            if ready is not None:
                sink.emit("broker_ready", **named)
                announced = decode_ready(ready)
                for missing in announced:
                    sink.degrade(missing.subsystem, missing.reason)
                return announced
            if status is not None:
                message = f"the broker exited with status {status}"
                sink.emit("broker_failed", message=message, **named)
                return None
            await trio.sleep(READY_POLL_S)
    sink.emit("broker_failed", message=f"the broker was not ready after {limit_s:g} s", **named)
    return None


def _write_agent_broker_config(plan: RunPlan, agent_plan: AgentPlan, address: str) -> None:
    doc = agent_broker_config_doc(agent_plan, address=address, docker_host=plan.docker_host)
    write_json_private(agent_plan.paths.broker_config, doc)


async def start_agents(
    options: RunOptions,
    plan: RunPlan,
    agent_plan: AgentPlan,
    env: Mapping[str, str],
    state: RunState,
    sink: EventSink,
    logs: trio.Nursery,
    start_broker: BrokerStarter | None = None,
) -> bool:
    """The networks, the API proxy and the agent broker, in that order; False after
    a reported failure (then nothing of the agent subsystem serves: exit 2).

    ``start_broker`` starts the agent broker (default: the child process
    with the agent paths, its records naming the subsystem).
    """
    docker_host = plan.docker_host
    try:
        net = await trio.to_thread.run_sync(create_networks, agent_plan, docker_host)
        sink.emit(
            "agent_network_created",
            subsystem=SUBSYSTEM_AGENT,
            network=net.network,
            subnet=net.subnet,
            egressNetwork=agent_plan.egress_network,
            egressCreated=agent_plan.egress_created,
        )
        await trio.to_thread.run_sync(write_proxy_config, agent_plan, net.address)
        ident = await trio.to_thread.run_sync(start_proxy, agent_plan, net, docker_host)
        sink.emit("api_proxy_started", subsystem=SUBSYSTEM_AGENT, address=net.address)
        await trio.to_thread.run_sync(
            wait_proxy_ready, agent_plan, ident, docker_host, options.ready_timeout
        )
        sink.emit("api_proxy_ready", subsystem=SUBSYSTEM_AGENT)
        await trio.to_thread.run_sync(_write_agent_broker_config, plan, agent_plan, net.address)
    except (AgentSetupError, OSError, ValueError) as exc:
        sink.emit("agent_setup_failed", subsystem=SUBSYSTEM_AGENT, message=str(exc))
        return False
    except Exception as exc:  # the engine's own error (docker.errors, requests)
        message = f"the engine refused: {exc.__class__.__name__}: {exc}"
        sink.emit("agent_setup_failed", subsystem=SUBSYSTEM_AGENT, message=message[:800])
        return False
    paths = agent_plan.paths
    if start_broker is None:
        broker: BrokerHandle = await start_child_broker(options, paths, env, SUBSYSTEM_AGENT)
    else:
        broker = await start_broker(options, paths, env)
    state.agent_broker = broker
    logs.start_soon(broker.relay_log, sink)
    watch_child(state.reaper, "agent-broker", getattr(broker, "pid", None), sink)
    sink.emit("broker_started", subsystem=SUBSYSTEM_AGENT)
    announced = await wait_ready(paths, broker, options.ready_timeout, sink, SUBSYSTEM_AGENT)
    return announced is not None


async def report_lost_protections(
    paths: RunPaths, broker: BrokerHandle, announced: tuple[Degradation, ...], sink: EventSink
) -> None:
    """After the agent: report what the broker lost during the run (it then halted).

    The broker rewrites its readiness file when a protection is lost mid-run
    (``broker/server.py``); each entry not announced at start becomes a
    ``degraded`` event and a ``broker_halted`` event (the step summary shows
    the former).
    """
    ready, _ = await trio.to_thread.run_sync(_probe_ready, paths, broker)
    if not ready:  # gone with the broker (reported apart) or not ours to read
        return
    for missing in decode_ready(ready):
        if missing not in announced:
            sink.emit("broker_halted", subsystem=missing.subsystem)
            sink.degrade(missing.subsystem, missing.reason)


def readiness_decision(plan: RunPlan, announced: tuple[Degradation, ...]) -> ChannelDecision:
    """The channel policy again, now that the broker said whether the pin runs (pure).

    Preflight assumed the page-cache pin; a sharing run refused only because
    it is missing is refused here, before the agent starts, and one the
    operator accepted gets the notice naming the page cache
    (``channel_policy.py``).
    """
    inputs = plan.preflight
    return channel_decision(
        inputs.config.runtime,
        (repo.sensitivity for repo in inputs.config.private_repos),
        isolated_storage=inputs.isolated_storage,
        allow_open=inputs.allow_open_channels,
        pinned=not pin_missing(announced),
    )


async def _run_agent_only(options: RunOptions, env: Mapping[str, str], sink: EventSink) -> int:
    """Bounded queries disabled: just the agent, with the environment untouched."""
    sup = Supervision(stop_grace=options.stop_grace)
    status = EXIT_HARNESS
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_signals, sup, sink)
        with sup.cancel:
            status = await start_agent(host_launcher(options, env, None, pin=False), sup, sink)
        nursery.cancel_scope.cancel()
    return final_status(status, sup.signal_number, sup.agent_done)


async def run(
    options: RunOptions,
    sink: EventSink,
    env: Mapping[str, str] | None = None,
    start_broker: BrokerStarter | None = None,
    start_agent_broker: BrokerStarter | None = None,
) -> int:
    """Run the harness once; returns the process exit status (``options.py``).

    With ``env`` None the process environment is used, and the token
    variables are then wiped from it at once (``tokens.py``); with bounded
    agents enabled, the provider credential variables too, once the
    configuration says so. ``start_agent_broker`` replaces the agent
    broker child (tests).
    """
    own_environment = env is None
    if env is None:
        env = dict(os.environ)
        scrub_process_environment(TOKEN_VARIABLES)
    else:
        env = dict(env)
    # Loading has no side effect but events: a Ctrl-C while it reads stdin
    # abandons the thread and ends the run as before (exit 130).
    loaded = await trio.to_thread.run_sync(
        load_reported,
        options.config_source,
        sink,
        env.get("GITHUB_STEP_SUMMARY"),
        abandon_on_cancel=True,
    )
    if loaded is None:
        sink.emit("run_end", status=EXIT_HARNESS, phase="config")
        return EXIT_HARNESS
    if loaded.agents.enabled and not loaded.config.enabled:
        # Not silently dropped: the agent subsystem runs next to the query one
        # (its staging, sweep and reaper ride on the query roots) for now.
        problem = Problem(
            "boundedAgents.enabled",
            "bounded agents need boundedQueries enabled in this version",
            "enable boundedQueries (it may list no repository you would not query),"
            " or disable boundedAgents",
        )
        problems_event(sink, "preflight_error", [problem])
        sink.emit("preflight_failed", problems=1, subsystem=SUBSYSTEM_AGENT)
        sink.emit("run_end", status=EXIT_HARNESS, phase="preflight")
        return EXIT_HARNESS
    if not loaded.config.enabled:
        sink.emit("bounded_queries_disabled")
        status = await _run_agent_only(options, env, sink)
        sink.emit("run_end", status=status)
        return status
    config = loaded.config
    agents_config = loaded.agents if loaded.agents.enabled else None
    credential = b""
    if agents_config is not None:
        variables = AGENT_CREDENTIAL_VARIABLES.get(agents_config.engine, ())
        if own_environment:  # read once: the copy in ``env`` is all that is left
            scrub_process_environment(variables)
    state = RunState(config=config, agents=agents_config)
    sup = Supervision(stop_grace=options.stop_grace)
    status = EXIT_HARNESS
    phase = "preflight"
    owner = None
    if options.agent_user is None and not options.agent_on_host:
        owner = await trio.to_thread.run_sync(workspace_owner, options.workspace)
    user = choose_agent_user(options, owner)
    docker_host = docker_host_from_env(env)
    refusal = agent_mode_problems(options, user, os.getuid(), docker_host)
    if not refusal and not options.agent_on_host and options.probe_runtime:
        refusal = await trio.to_thread.run_sync(
            agent_image_problems, docker_host, options.agent_image
        )
    if refusal:
        problems_event(sink, "preflight_error", refusal)
        sink.emit("preflight_failed", problems=len(refusal))
        await summarize(state, status, phase, sink, env)
        sink.emit("run_end", status=status, phase=phase)
        return status
    if options.agent_on_host and user is None:
        degrade_unconfined(sink)
    plan = plan_run(
        options,
        config,
        env,
        run_id=new_run_id(),
        uid=os.getuid(),
        euid=os.geteuid(),
        socket_gid=None if user is None else user.gid,
    )
    agent_plan: AgentPlan | None = None
    if agents_config is not None:
        # Before anything is staged (spec 15.4 step 1): a run that could never
        # launch an enclave never clones a private repository.
        inputs = AgentPreflightInputs(
            config=agents_config,
            env=env,
            seed_sources={k.lower(): v for k, v in options.seed_sources.items()},
            allow_insecure_server=options.allow_insecure_server,
            allow_insecure_api_target=options.allow_insecure_api_target,
            egress_network=options.api_proxy_egress_network,
        )
        problems = await agent_preflight(
            inputs, plan.docker_host, plan.run_id, probe_runtime=options.probe_runtime
        )
        if problems:
            problems_event(sink, "preflight_error", problems)
            sink.emit("preflight_failed", problems=len(problems), subsystem=SUBSYSTEM_AGENT)
            await summarize(state, status, phase, sink, env)
            sink.emit("run_end", status=status, phase=phase)
            return status
        try:
            agent_plan = plan_agents(
                agents_config,
                run_id=plan.run_id,
                uid=plan.uid,
                euid=os.geteuid(),
                workspace=options.workspace,
                base=options.base,
                seed_sources=options.seed_sources,
                target=agent_api_target(agents_config, env),
                credential_variable=credential_variable(agents_config.engine, env) or "",
                egress_network=options.api_proxy_egress_network,
                socket_gid=plan.socket_gid,
            )
            credential = take_credential(env, agent_plan.credential_variable)
        except AgentSetupError as exc:
            problem = Problem("boundedAgents", str(exc), "set it in the harness's environment")
            problems_event(sink, "preflight_error", [problem])
            sink.emit("preflight_failed", problems=1)
            await summarize(state, status, phase, sink, env)
            sink.emit("run_end", status=status, phase=phase)
            return status
    agent_run = None if agent_plan is None else (agent_plan, credential)
    credential = b""
    # The broker's stderr relay (broker_log.py) lives until teardown has
    # stopped the broker and relayed its last lines; it is cancelled after.
    async with trio.open_nursery() as logs:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_signals, sup, sink)
                with sup.cancel:
                    prepared = await execute_plan(
                        plan, options, config, env, state, sink, agent_run
                    )
                    agent_run = None  # the credential is in the proxy's file only now
                    if prepared:
                        sup.reaper = state.reaper
                        for name in TOKEN_VARIABLES:  # staging is over: nothing needs it now
                            env.pop(name, None)
                        paths = plan.paths
                        phase = "broker"
                        state.work_quota = await mount_work_quota(
                            paths.workspaces_dir, parse_memory_limit(config.memory_limit), sink
                        )
                        starter = start_broker or start_child_broker
                        state.broker = broker = await starter(options, paths, env)
                        logs.start_soon(broker.relay_log, sink)
                        watch_child(state.reaper, "broker", getattr(broker, "pid", None), sink)
                        sink.emit("broker_started")
                        announced = await wait_ready(paths, broker, options.ready_timeout, sink)
                        verdict = ChannelDecision()
                        if announced is not None and pin_missing(announced):
                            verdict = readiness_decision(plan, announced)
                        if verdict.degraded is not None:
                            sink.degrade("cross-invocation channels", verdict.degraded)
                        if verdict.problem is not None:
                            # Still before the agent: a preflight failure (exit 2).
                            phase = "preflight"
                            problems_event(sink, "preflight_error", [verdict.problem])
                            sink.emit("preflight_failed", problems=1)
                        elif announced is not None and (
                            agent_plan is None
                            or await start_agents(
                                options,
                                plan,
                                agent_plan,
                                env,
                                state,
                                sink,
                                logs,
                                start_agent_broker,
                            )
                        ):
                            phase = "agent"
                            progress = options.progress
                            if progress is None:
                                progress = sys.stderr.isatty()
                            if progress:
                                state.progress = AuditFollower()
                                nursery.start_soon(
                                    partial(
                                        follow_audit,
                                        paths.audit_log,
                                        print_progress,
                                        follower=state.progress,
                                    )
                                )
                            status = await run_confined_agent(
                                options,
                                env,
                                sup,
                                user,
                                sink,
                                paths=paths,
                                config=config,
                                run_id=plan.run_id,
                                docker_host=plan.docker_host,
                                broker_pid=getattr(broker, "pid", None),
                                agents=None
                                if agent_plan is None
                                else (agent_plan.paths, agent_plan.config.slugs),
                                agent_broker_pid=getattr(state.agent_broker, "pid", None),
                            )
                            await report_lost_protections(paths, broker, announced, sink)
                            if await trio.to_thread.run_sync(broker.exited) is not None:
                                state.degraded_notes.append(
                                    "the broker exited while the agent ran; later queries failed"
                                )
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                status = final_status(status, sup.signal_number, sup.agent_done)
                await teardown(
                    state, sink, env, status=status, phase=phase, keep=options.keep_state
                )
        logs.cancel_scope.cancel()
    return status
