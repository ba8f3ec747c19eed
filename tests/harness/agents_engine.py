"""A real run with bounded agents on the real engine (shared by the agent engine tests).

* :func:`with_agents` gives the lifecycle the normalized ``boundedAgents``
  value (its parsing from the configuration file is agent-harness's; once
  that lands the file's section alone does it and this wrapper is a no-op
  replacement of the same value).
* :func:`agent_broker_starter` starts the real agent broker child (the
  run's default; named so the SIGKILL script and the run test share it).
* :data:`HARNESS_SCRIPT`: the same run in a child process, for SIGKILL tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from bounded_query.broker.protocol.policy import SUBSYSTEM_AGENT
from bounded_query.harness.configuration.config import (
    ApiTarget,
    BoundedAgentsConfig,
    PrivateRepo,
)
from bounded_query.harness.lifecycle import orchestrate
from bounded_query.harness.lifecycle.broker_child import ChildBroker, start_child_broker
from bounded_query.harness.lifecycle.paths import RunPaths

__all__ = [
    "AGENTS",
    "HARNESS_SCRIPT",
    "agent_broker_starter",
    "with_agents",
]

#: The engine test's section: claude on runc, one repository, a target
#: nobody listens on (no enclave runs in these tests: nothing is forwarded).
AGENTS = BoundedAgentsConfig(
    enabled=True,
    private_repos=(PrivateRepo("octo/alpha", "confidential"),),
    runtime="docker",
    engine="claude",
    model="claude-haiku-4-5",
    target=ApiTarget("http", "192.0.2.1", 9, ""),
)


def with_agents(agents: BoundedAgentsConfig = AGENTS) -> Any:
    """``orchestrate.load_reported`` returning ``agents`` as the loaded section."""
    original = orchestrate.load_reported  # type: ignore[attr-defined]

    def load(*args: Any, **kwargs: Any) -> Any:
        loaded = original(*args, **kwargs)
        return None if loaded is None else dataclasses.replace(loaded, agents=agents)

    return load


async def agent_broker_starter(
    options: Any, paths: RunPaths, env: Mapping[str, str]
) -> ChildBroker:
    """Start the agent broker child exactly as the run does."""
    return await start_child_broker(options, paths, env, SUBSYSTEM_AGENT)


#: A harness run with bounded agents in a child process (argv: config, seed
#: source, state base, work dir); events on stderr. The agent sleeps.
HARNESS_SCRIPT = r"""
import sys
from pathlib import Path
import trio
from bounded_query.harness import RunOptions, run
from bounded_query.harness.lifecycle import orchestrate
from bounded_query.harness.records.events import EventSink
from tests.harness.agents_engine import agent_broker_starter, with_agents

orchestrate.load_reported = with_agents()
config, source, base, work = sys.argv[1:5]
options = RunOptions(
    config_source=config,
    agent=("sleep", "600"),
    seed_sources={"octo/alpha": Path(source)},
    workspace=Path(work),
    base=Path(base),
    agent_on_host=True,
    unconfined_agent=True,
    allow_insecure_api_target=True,
)
sys.exit(trio.run(lambda: run(options, EventSink(sys.stderr), None, None, agent_broker_starter)))
"""
