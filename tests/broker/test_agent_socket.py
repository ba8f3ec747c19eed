"""A bounded-agent broker from the attacker's side, over its real Unix socket (spec 15.3).

An in-process ``BrokerServer`` built from an agent config (the frame, the
payload and the audit record type all follow from ``subsystem``) with the
fake enclave runner. Every refusal is the canonical error, byte for byte,
and never reaches the runner; lane answers leave at a bucket boundary.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from bounded_query.broker.http import response_bytes
from bounded_query.broker.protocol import FORBIDDEN_CONTROL_HEADERS
from bounded_query.broker.server import BrokerServer
from bounded_query.broker.timing import BOUNDARIES_S
from tests.broker.agent_helpers import FakeEnclaveRunner, agent_doc, agent_request_bytes
from tests.broker.helpers import ERROR, exchange, load, request_bytes

ERROR_RESPONSE = response_bytes(ERROR)
OK_RESPONSE = response_bytes(b'{"status":"ok","result":true}')
TASK_BOUND = 200


@dataclass
class Served:
    server: BrokerServer
    runner: FakeEnclaveRunner
    socket: Path
    audit: Path


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    config, seed_map = load(agent_doc(tmp_path, max_invocations=200, maxTaskBytes=TASK_BOUND))
    runner = FakeEnclaveRunner()
    server = BrokerServer(config, seed_map, runner)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield Served(server, runner, config.socket_path, config.audit_path)
        server.stop()


async def _ask(served: Served, raw: bytes) -> tuple[bytes, float]:
    start = time.monotonic()
    response = await exchange(served.socket, raw)
    return response, time.monotonic() - start


def _landed_on_a_boundary(served: Served, elapsed: float | None = None) -> bool:
    """The last lane answer left at a bucket boundary (which one depends on the
    journal's fsync on a loaded machine; the MockClock tests pin the first)."""
    service = served.server.service
    assert service is not None
    assert service.last_timing is not None
    landing = service.last_timing[2]
    if landing is None or landing.boundary_s not in BOUNDARIES_S:
        return False
    return elapsed is None or elapsed >= landing.boundary_s


async def test_a_valid_request_is_answered(served: Served) -> None:
    response, elapsed = await _ask(served, agent_request_bytes("Is the seed there?"))
    assert response == OK_RESPONSE
    assert _landed_on_a_boundary(served, elapsed)
    assert [call.task for call in served.runner.calls] == ["Is the seed there?"]


REFUSED = [
    pytest.param(agent_request_bytes("x", repo="octo/unknown"), id="unknown-repo"),
    pytest.param(agent_request_bytes("x", repo="OCTO/SEALED"), id="sealed"),
    pytest.param(agent_request_bytes(""), id="empty-task"),
    pytest.param(agent_request_bytes("x", schema=b'{"type":"integer"}'), id="invalid-schema"),
    pytest.param(agent_request_bytes("x", schema=b"[true"), id="schema-not-json"),
    pytest.param(agent_request_bytes("x", version="2"), id="wrong-version"),
    pytest.param(agent_request_bytes("x", extra=[("X-AWF-Engine", "gpt")]), id="unknown-header"),
    pytest.param(
        agent_request_bytes("x", extra=[("X-AWF-Repo", "octo/internal")]), id="duplicate-repo"
    ),
    pytest.param(request_bytes("write true"), id="query-frame"),
    *[
        pytest.param(agent_request_bytes("x", extra=[(name.title(), "/bin/sh")]), id=name)
        for name in FORBIDDEN_CONTROL_HEADERS
    ],
]


@pytest.mark.parametrize("raw", REFUSED)
async def test_refused_in_the_lane_with_no_runner_call(served: Served, raw: bytes) -> None:
    response, elapsed = await _ask(served, raw)
    assert response == ERROR_RESPONSE
    assert _landed_on_a_boundary(served, elapsed)
    assert served.runner.calls == []
    # The broker still serves, and the next valid request runs.
    assert (await _ask(served, agent_request_bytes("ok")))[0] == OK_RESPONSE
    assert len(served.runner.calls) == 1


@pytest.mark.parametrize("size", [TASK_BOUND + 1, 64 * 1024, 64 * 1024 + 1])
async def test_an_oversize_task_is_refused_by_the_transport(served: Served, size: int) -> None:
    response, _ = await _ask(served, agent_request_bytes("x" * size))
    assert response == ERROR_RESPONSE
    assert served.runner.calls == []


async def test_a_task_of_exactly_the_bound_runs(served: Served) -> None:
    response, _ = await _ask(served, agent_request_bytes("é" * (TASK_BOUND // 2)))
    assert response == OK_RESPONSE
    assert served.runner.calls[0].task == "é" * (TASK_BOUND // 2)


async def test_over_budget_is_refused_with_no_runner_call(served: Served) -> None:
    enum16 = json.dumps({"type": "enum", "values": [str(i) for i in range(16)]}).encode()
    first, _ = await _ask(
        served, agent_request_bytes('answer "7"', repo="octo/confidential", schema=enum16)
    )
    assert first == response_bytes(b'{"status":"ok","result":"7"}')
    second, _ = await _ask(served, agent_request_bytes("x", repo="octo/confidential"))
    # Byte for byte the error of an unknown repository: the balance is not disclosed.
    assert second == ERROR_RESPONSE
    assert _landed_on_a_boundary(served)
    assert len(served.runner.calls) == 1


@pytest.mark.parametrize(
    ("schema", "answer"),
    [
        (b'{"type":"boolean"}', '"maybe"'),
        (b'{"type":"integer","minimum":0,"maximum":9}', "1.5"),
        (b'{"type":"object","fields":{"k":{"type":"boolean"}}}', '{"k":true,"k":true}'),
        (b'{"type":"boolean"}', "true garbage"),
    ],
)
async def test_a_non_conforming_answer_is_the_error_with_the_charge_kept(
    served: Served, schema: bytes, answer: str
) -> None:
    raw = agent_request_bytes(f"answer {answer}", repo="octo/internal", schema=schema)
    response, _ = await _ask(served, raw)
    assert response == ERROR_RESPONSE
    assert _landed_on_a_boundary(served)
    assert len(served.runner.calls) == 1
    service = served.server.service
    assert service is not None
    assert service.accounts.ledger.spent("octo/internal") > 0


async def test_past_max_invocations_nothing_runs(tmp_path: Path) -> None:
    config, seed_map = load(agent_doc(tmp_path, max_invocations=3))
    runner = FakeEnclaveRunner()
    server = BrokerServer(config, seed_map, runner)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        answers = [
            await exchange(config.socket_path, agent_request_bytes("x", repo="octo/nope")),
            await exchange(config.socket_path, agent_request_bytes("x" * 10_000)),  # transport
            await exchange(config.socket_path, agent_request_bytes("x")),
            await exchange(config.socket_path, agent_request_bytes("x")),
            await exchange(config.socket_path, agent_request_bytes("x")),
        ]
        server.stop()
    assert answers == [ERROR_RESPONSE, ERROR_RESPONSE, OK_RESPONSE, ERROR_RESPONSE, ERROR_RESPONSE]
    assert len(runner.calls) == 1


async def test_the_audit_file_never_names_a_repository(tmp_path: Path) -> None:
    config, seed_map = load(agent_doc(tmp_path))
    server = BrokerServer(config, seed_map, FakeEnclaveRunner())
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        for raw in [
            agent_request_bytes("answer true", repo="octo/internal"),
            agent_request_bytes("x", repo="octo/not-configured"),
            agent_request_bytes("x", repo="octo/sealed"),
            agent_request_bytes("x", repo="octo/confidential", extra=[("X-AWF-Proxy", "p")]),
        ]:
            await exchange(config.socket_path, raw)
        server.stop()
    # serve() returned: every line is written and the log closed.
    data = config.audit_path.read_bytes()
    assert b"octo" not in data
    assert b"not-configured" not in data
    lines = [json.loads(line) for line in data.splitlines()]
    assert {line["_schema"] for line in lines} == {"bounded-agent-audit/v1"}
    assert [line["sensitivity"] for line in lines] == ["internal", None, "sealed", None]


def _as_agent_frame(raw: bytes) -> bytes:
    """A hostile query-frame case re-aimed at the agent frame (the same mutation)."""
    return raw.replace(b"X-AWF-Query-Version: 2", b"X-AWF-Agent-Version: 1")


async def test_the_hostile_corpus_never_reaches_the_enclave_runner(tmp_path: Path) -> None:
    from tests.broker.test_hostile import CORPUS, GOOD

    config, seed_map = load(agent_doc(tmp_path, max_invocations=10000))
    runner = FakeEnclaveRunner()
    server = BrokerServer(config, seed_map, runner, header_timeout_s=1.0)
    wrong = []
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        for label, raw in CORPUS:
            for case in {raw, _as_agent_frame(raw)}:
                response = await exchange(config.socket_path, case)
                if response not in (b"", ERROR_RESPONSE):
                    wrong.append(label)
        assert runner.calls == []
        assert server.service is not None
        assert server.service.accounts.ledger.spent_by_repo() == {}
        # The one case that is well-formed once re-aimed runs, and the broker still serves.
        assert await exchange(config.socket_path, _as_agent_frame(GOOD)) == OK_RESPONSE
        server.stop()
    assert wrong == []
    assert [call.task for call in runner.calls] == ["write true"]
