"""Tests-only broker entry point for either subsystem, with a fake runner.

``python -m tests.broker.subsystem_broker_main --config PATH`` (cwd = the
repository root): the same ``run_server`` as the console script; the config's
``subsystem`` picks the fake (the subprocess query runner, or the fake
enclave runner of ``agent_helpers``). Never installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bounded_query.broker.__main__ import run_server
from bounded_query.broker.config import BrokerConfig
from bounded_query.broker.protocol import policy
from bounded_query.broker.runner import Runner
from tests.broker.agent_helpers import fake_enclave_runner_factory
from tests.fakes.runner import process_runner_factory


def factory(config: BrokerConfig) -> Runner:
    """The fake runner for ``config``'s subsystem."""
    if config.subsystem == policy.SUBSYSTEM_AGENT:
        return fake_enclave_runner_factory(config)
    return process_runner_factory(config)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--config":
        sys.exit(2)
    sys.exit(run_server(Path(sys.argv[2]), runner_factory=factory))
