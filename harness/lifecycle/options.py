"""What one ``bounded-query-harness run`` is asked to do, as values (spec 14.2, 14.8).

:class:`RunOptions` is the command line of ``run`` (and of ``compose``) after
parsing; the broker a run talks to is reached through :class:`BrokerHandle`
(the child process of ``child.py`` or the compose service of
``compose.py``), started by a :data:`BrokerStarter`. Nothing here does I/O.

Exit status (seed 000 5.3): the agent's own status (128+N when it died of
signal N); :data:`EXIT_HARNESS` for every harness failure before the agent
started (invalid configuration, failed preflight or staging, a broker that
never became ready); 128+N when the harness itself was stopped by signal N
before the agent finished.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from bounded_query.broker.protocol.policy import DEFAULT_AGENT_IMAGE, DEFAULT_IMAGE
from bounded_query.harness.agent.spec import AGENT_NETWORK_DEFAULT, AgentUser
from bounded_query.harness.lifecycle.paths import DEFAULT_BASE, RunPaths

if TYPE_CHECKING:
    from bounded_query.harness.records.events import EventSink

__all__ = [
    "AGENT_STOP_GRACE_S",
    "EXIT_HARNESS",
    "READY_POLL_S",
    "READY_TIMEOUT_S",
    "BrokerHandle",
    "BrokerStarter",
    "RunOptions",
]

#: Exit status for invocation and infrastructure failures (seed 000 5.3).
EXIT_HARNESS = 2
#: How long the broker may take to write its ready file.
READY_TIMEOUT_S = 60.0
#: How often the ready file is looked for.
READY_POLL_S = 0.05
#: Grace period a signalled agent gets before each escalation (terminate, kill).
AGENT_STOP_GRACE_S = 10.0


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
    #: ``--allow-cross-invocation-channels``: accept a run whose repositories share
    #: the host while cross-invocation channels stay open, degraded
    #: (harness/configuration/channel_policy.py).
    allow_open_channels: bool = False
    #: ``--keep-state DIR``: copy the journal, audit log, seed map and broker
    #: config there at teardown, for ``report --state DIR`` (``report.py``).
    keep_state: Path | None = None
    #: One human line per answered invocation on stderr (``progress.py``);
    #: None: when stderr is a terminal.
    progress: bool | None = None
    #: ``--allow-insecure-api-target``: accept an ``http://HOST[:PORT]`` API
    #: target for the bounded-agent API proxy (tests, local gateways): the
    #: provider credential then crosses that network in clear text.
    allow_insecure_api_target: bool = False
    #: ``--api-proxy-egress-network NAME``: the API proxy's egress side joins
    #: this existing Docker network instead of a bridge the harness creates
    #: (checked: a Docker network name, not host/none/the enclave network).
    api_proxy_egress_network: str | None = None


class BrokerHandle(Protocol):
    """A started broker (child process or compose service)."""

    def exited(self) -> int | None:
        """The broker's exit status, or None while it runs."""
        ...

    async def stop(self) -> int | None:
        """Stop it (SIGTERM, then SIGKILL); return the exit status if known."""
        ...

    async def relay_log(self, sink: EventSink) -> None:
        """Relay the broker's stderr lines through ``sink`` as versioned records
        until it closes (``broker_log.py``); returns at once where something
        else keeps the broker's output (a log file, the engine's logs)."""
        ...


#: Starts the broker of a staged run: ``(options, paths, env) -> handle``.
BrokerStarter = Callable[[RunOptions, RunPaths, Mapping[str, str]], Awaitable[BrokerHandle]]
