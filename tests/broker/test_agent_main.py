"""The one entry point builds the enclave runner for a bounded-agent config (broker/__main__.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import bounded_query.sandbox as sandbox
from bounded_query.broker.__main__ import _sandbox_runner
from bounded_query.broker.config import parse_config
from bounded_query.broker.runner import EnclaveOptions, RunnerSettings
from tests.broker.agent_helpers import FakeEnclaveRunner, agent_doc


def test_an_agent_config_gets_the_enclave_runner_with_its_trusted_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = parse_config(agent_doc(tmp_path))
    built: list[tuple[RunnerSettings, EnclaveOptions]] = []
    made = FakeEnclaveRunner()

    def create_enclave_runner(settings: RunnerSettings, options: EnclaveOptions) -> object:
        built.append((settings, options))
        return made

    # The enclave-runner part provides this factory; a fake one stands in here.
    monkeypatch.setattr(sandbox, "create_enclave_runner", create_enclave_runner, raising=False)
    assert _sandbox_runner(config) is made
    assert built == [(config.runner_settings(), config.enclave)]


def test_without_an_enclave_runner_the_agent_broker_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bounded_query.broker.__main__ import EXIT_REFUSED, run_server

    agent_doc(tmp_path)
    # Fail closed: no factory means no broker, never the query runner instead.
    monkeypatch.delattr(sandbox, "create_enclave_runner", raising=False)
    assert run_server(tmp_path / "broker.json") == EXIT_REFUSED
    assert '"reason": "runner"' in capsys.readouterr().err


def test_an_agent_config_without_enclave_settings_is_refused_with_the_location(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from bounded_query.broker.__main__ import EXIT_REFUSED, run_server

    doc = agent_doc(tmp_path)
    del doc["enclave"]
    (tmp_path / "broker.json").write_text(json.dumps(doc))
    assert run_server(tmp_path / "broker.json") == EXIT_REFUSED
    (line,) = capsys.readouterr().err.splitlines()
    event = json.loads(line)
    assert event["event"] == "broker-refused"
    assert event["reason"] == "config"
    assert event["detail"].startswith("config.enclave: missing")
