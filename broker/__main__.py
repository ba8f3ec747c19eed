"""``bounded-query-broker``: the trusted broker daemon's entry point (spec 14.7).

Usage: ``bounded-query-broker --config PATH`` (or the environment variable
``BOUNDED_QUERY_BROKER_CONFIG``). The config file and the seed map are written
by the trusted harness; no request can influence either. The sandbox runner
is built from configuration only: ``bounded_query.sandbox.create_runner``
for a bounded-query broker, ``create_enclave_runner`` with the config's
enclave settings for a bounded-agent broker (the config's ``subsystem``;
spec 15.1: one entry point, one broker process per subsystem); there is no
way to select any other runner from configuration.

Exit codes: 0 after a clean stop (SIGTERM/SIGINT), 2 when the broker refuses
to start (bad config, untrustworthy journal, unusable runtime or paths).
Diagnostics go to stderr as single JSON lines and never contain request data;
``broker-ready`` and ``broker-stopped`` name the subsystem served.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from bounded_query.broker.config import (
    CONFIG_ENV,
    BrokerConfig,
    ConfigError,
    load_config,
    load_seed_map,
)
from bounded_query.broker.journal import JournalCorrupt
from bounded_query.broker.protocol.policy import SUBSYSTEM_AGENT
from bounded_query.broker.runner import Runner, RunnerUnavailable
from bounded_query.broker.server import BrokerServer

__all__ = ["main", "run_server"]

EXIT_OK = 0
EXIT_REFUSED = 2


def _event(kind: str, **fields: object) -> None:
    print(json.dumps({"event": kind, **fields}, sort_keys=True), file=sys.stderr, flush=True)


def _raise_nofile_limit() -> None:
    """Use the hard descriptor limit: a flood of connections must not starve accept()."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


async def _serve_until_signalled(server: BrokerServer) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for _ in signals:
                    server.stop()
                    return

            nursery.start_soon(watch)
            await nursery.start(server.serve)
            if server.recovery is not None:
                _event(
                    "broker-ready",
                    subsystem=server.subsystem.name,
                    tornBytes=server.recovery.torn_bytes,
                    interrupted=len(server.recovery.interrupted),
                    invocations=server.recovery.invocations,
                )
        # serve() returned: the stop is complete.


def run_server(config_path: Path, runner_factory: object = None) -> int:
    """Load configuration, build the runner, serve until signalled; return an exit code.

    ``runner_factory`` is for in-repository test entry points only (a fake
    runner); the console script always passes None and gets the sandbox
    runner chosen by the config's ``runtime``.
    """
    try:
        config = load_config(config_path)
        seed_map = load_seed_map(config.seed_map_path)
    except ConfigError as exc:
        _event("broker-refused", reason="config", detail=str(exc))
        return EXIT_REFUSED
    try:
        runner: Runner
        if runner_factory is None:
            runner = _sandbox_runner(config)
        else:
            assert callable(runner_factory)
            runner = runner_factory(config)
    except (RunnerUnavailable, ImportError, ValueError) as exc:
        _event("broker-refused", reason="runner", detail=str(exc))
        return EXIT_REFUSED
    _raise_nofile_limit()
    server = BrokerServer(config, seed_map, runner)
    try:
        trio.run(_serve_until_signalled, server)
    except (JournalCorrupt, RunnerUnavailable, OSError, BaseExceptionGroup) as raised:
        # trio's nurseries wrap a start-up failure in an exception group.
        failure = _sole_exception(raised)
        if isinstance(failure, JournalCorrupt):
            _event("broker-refused", reason="journal", detail=str(failure))
        elif isinstance(failure, RunnerUnavailable):
            _event("broker-refused", reason="runner", detail=str(failure))
        elif isinstance(failure, OSError):
            _event("broker-refused", reason="os", detail=f"{failure.strerror} ({failure.errno})")
        else:
            raise
        return EXIT_REFUSED
    _event("broker-stopped", subsystem=server.subsystem.name)
    return EXIT_OK


def _sandbox_runner(config: BrokerConfig) -> Runner:
    """The runner the config's subsystem and runtime name (nothing else can choose it).

    Imported lazily: the sandbox pulls in the docker SDK. A bounded-agent
    broker gets the enclave runner with the config's trusted enclave
    settings; a query broker the query runner.
    """
    if config.subsystem == SUBSYSTEM_AGENT:
        from bounded_query.sandbox import create_enclave_runner  # type: ignore[attr-defined,unused-ignore]

        assert config.enclave is not None  # parse_config requires it
        agent_runner: Runner = create_enclave_runner(config.runner_settings(), config.enclave)
        return agent_runner
    from bounded_query.sandbox import create_runner

    return create_runner(config.runner_settings())


def _sole_exception(exc: BaseException) -> BaseException:
    """The one exception inside (nested) single-member exception groups, else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``bounded-query-broker``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "--config":
        path = args[1]
    elif not args and os.environ.get(CONFIG_ENV):
        path = os.environ[CONFIG_ENV]
    else:
        _event("broker-refused", reason="usage", detail="usage: bounded-query-broker --config PATH")
        return EXIT_REFUSED
    return run_server(Path(path))


if __name__ == "__main__":
    sys.exit(main())
