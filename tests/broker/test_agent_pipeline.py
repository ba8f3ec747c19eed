"""The shared pipeline serving the bounded-agent subsystem (spec 15.3, 15.5; MockClock).

One ``Service`` (the same lane, admission, journal, ledger, buckets and
audit as bounded queries) with the agent subsystem built from an agent
config and a fake enclave runner. Refusals never reach the runner; a
non-conforming final answer is the canonical error with the charge kept;
every answer leaves exactly at a bucket boundary; the answer is the
runner's report (a decoy left in the workspace is never read); the audit
holds only 15.5's fields.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from bounded_query.broker.accounts import Accounts
from bounded_query.broker.admission import RawRequest
from bounded_query.broker.agent_payload import AgentPayload
from bounded_query.broker.audit import AGENT_AUDIT_SCHEMA, AuditLog
from bounded_query.broker.journal import JournalFile
from bounded_query.broker.ledger import Ledger
from bounded_query.broker.protocol import FORBIDDEN_CONTROL_HEADERS, TIMING_BUCKETS_MS, policy
from bounded_query.broker.service import Service
from bounded_query.broker.subsystem import subsystem_for
from bounded_query.broker.timing import BOUNDARIES_S
from tests.broker.agent_helpers import FakeEnclaveRunner, agent_doc, agent_request_bytes
from tests.broker.helpers import ERROR, load, raw_request, request_bytes, run_inline

OK_TRUE = b'{"status":"ok","result":true}'
ENUM16 = json.dumps({"type": "enum", "values": [f"v{i}" for i in range(16)]}).encode()
INTEGER = b'{"type":"integer","minimum":0,"maximum":3}'
OBJECT = b'{"type":"object","fields":{"a":{"type":"boolean"}}}'


class Agent:
    def __init__(self, service: Service, runner: FakeEnclaveRunner, audit: Path) -> None:
        self.service = service
        self.runner = runner
        self.audit = audit

    async def answer(self, raw: bytes) -> tuple[bytes, float]:
        sent: list[tuple[bytes, float]] = []

        async def send(body: bytes) -> None:
            sent.append((body, trio.current_time()))

        start = trio.current_time()
        await self.service.handle(raw_request(raw), send)
        ((body, when),) = sent
        return body, when - start

    def spent(self, repo: str) -> int:
        return self.service.accounts.ledger.spent(repo)

    def audit_lines(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.audit.read_bytes().splitlines()]


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    config, seed_map = load(agent_doc(tmp_path, max_invocations=64, maxTaskBytes=100))
    subsystem = subsystem_for(config)
    audit = AuditLog(config.audit_path, schema=subsystem.audit_schema)
    journal = JournalFile.open(config.journal_path, config.run_id)
    accounts = Accounts(journal, Ledger(), config.max_invocations, run_sync=run_inline)
    runner = FakeEnclaveRunner()
    # No subsystem given: the service takes the config's.
    service = Service(config, seed_map, runner, accounts, audit, run_sync=run_inline)
    assert service.subsystem.name == policy.SUBSYSTEM_AGENT
    yield Agent(service, runner, config.audit_path)
    accounts.close()
    audit.close()


async def test_an_answer_comes_from_the_report_at_the_first_boundary(
    autojump_clock: trio.testing.MockClock, agent: Agent
) -> None:
    body, elapsed = await agent.answer(agent_request_bytes("Is it? ✓", repo="octo/internal"))
    # The fake left "false" in the workspace: the broker answered the report's "true".
    assert body == OK_TRUE
    assert elapsed == pytest.approx(BOUNDARIES_S[0], abs=1e-9)
    (call,) = agent.runner.calls
    assert call == AgentPayload("Is it? ✓", '{"type":"boolean"}')
    (invocation,) = agent.runner.invocations
    assert invocation.seed_dir.name == "0002"  # the seed map's id of octo/internal
    assert agent.spent("octo/internal") == 5


@pytest.mark.parametrize("index", range(len(BOUNDARIES_S)))
async def test_engine_time_lands_on_the_next_boundary(
    autojump_clock: trio.testing.MockClock, agent: Agent, index: int
) -> None:
    duration = BOUNDARIES_S[index] - 0.001
    body, elapsed = await agent.answer(agent_request_bytes(f"sleep {duration}"))
    assert body == OK_TRUE
    assert elapsed == pytest.approx(BOUNDARIES_S[index], abs=1e-9)


@pytest.mark.parametrize(
    ("schema", "answer"),
    [
        (b'{"type":"boolean"}', '"maybe"'),
        (b'{"type":"boolean"}', "maybe"),
        (b'{"type":"boolean"}', "true true"),
        (b'{"type":"boolean"}', "true,"),
        (b'{"type":"boolean"}', ""),
        (INTEGER, "1.5"),
        (INTEGER, "1e0"),
        (INTEGER, "4"),
        (OBJECT, '{"a":true,"a":false}'),
        (OBJECT, '{"a":true}x'),
        (OBJECT, '{"a":true,"b":true}'),
        (ENUM16, '"v16"'),
    ],
)
async def test_a_non_conforming_answer_is_the_error_with_the_charge_kept(
    autojump_clock: trio.testing.MockClock, agent: Agent, schema: bytes, answer: str
) -> None:
    raw = agent_request_bytes(f"answer {answer}", repo="octo/internal", schema=schema)
    body, elapsed = await agent.answer(raw)
    assert body == ERROR
    assert elapsed == pytest.approx(BOUNDARIES_S[0], abs=1e-9)
    assert len(agent.runner.calls) == 1
    assert agent.spent("octo/internal") > 0
    (line,) = agent.audit_lines()
    assert line["category"] == policy.CATEGORY_INVALID_OUTPUT
    assert line["charge"] == agent.spent("octo/internal")


@pytest.mark.parametrize(
    ("schema", "answer", "canonical"),
    [
        (INTEGER, " 3\n", b"3"),
        (OBJECT, '```json\n{"a": false}\n```', None),  # the adapter strips fences, not the broker
        (OBJECT, '{ "a" : false }', b'{"a":false}'),
        (ENUM16, '"v15"', b'"v15"'),
    ],
)
async def test_conforming_answers_are_re_serialized(
    autojump_clock: trio.testing.MockClock,
    agent: Agent,
    schema: bytes,
    answer: str,
    canonical: bytes | None,
) -> None:
    body, _ = await agent.answer(agent_request_bytes(f"answer {answer}", schema=schema))
    expected = ERROR if canonical is None else b'{"status":"ok","result":' + canonical + b"}"
    assert body == expected


REFUSED = [
    pytest.param(agent_request_bytes("x", repo="octo/unknown"), id="unknown-repo"),
    pytest.param(agent_request_bytes("x", repo="octo/sealed"), id="sealed"),
    pytest.param(agent_request_bytes(""), id="empty-task"),
    pytest.param(agent_request_bytes("x" * 101), id="oversize-task"),
    pytest.param(agent_request_bytes(b"\xff\xfe"), id="non-utf8-task"),
    pytest.param(agent_request_bytes("x", schema=b'{"type":"string"}'), id="invalid-schema"),
    pytest.param(agent_request_bytes("x", version="2"), id="wrong-version"),
    pytest.param(agent_request_bytes("x", extra=[("X-AWF-Model", "opus")]), id="unknown-header"),
    pytest.param(request_bytes("x"), id="a-query-frame"),
    *[
        pytest.param(agent_request_bytes("x", extra=[(name, "v")]), id=name)
        for name in FORBIDDEN_CONTROL_HEADERS
    ],
]


@pytest.mark.parametrize("raw", REFUSED)
async def test_refusals_never_reach_the_runner(
    autojump_clock: trio.testing.MockClock, agent: Agent, raw: bytes
) -> None:
    body, elapsed = await agent.answer(raw)
    assert body == ERROR
    assert elapsed == pytest.approx(BOUNDARIES_S[0], abs=1e-9)
    assert agent.runner.calls == []
    assert agent.runner.invocations == []
    assert agent.service.accounts.ledger.invocations == 1  # counted all the same
    for repo in ("octo/public", "octo/internal", "octo/confidential", "octo/sealed"):
        assert agent.spent(repo) == 0


async def test_over_budget_is_refused_before_the_runner(
    autojump_clock: trio.testing.MockClock, agent: Agent
) -> None:
    # confidential: 8 bits; a 16-value enum costs exactly 8.
    first, _ = await agent.answer(
        agent_request_bytes('answer "v3"', repo="octo/confidential", schema=ENUM16)
    )
    assert first == b'{"status":"ok","result":"v3"}'
    body, elapsed = await agent.answer(agent_request_bytes("x", repo="octo/confidential"))
    assert body == ERROR
    assert elapsed == pytest.approx(BOUNDARIES_S[0], abs=1e-9)
    assert len(agent.runner.calls) == 1
    assert agent.spent("octo/confidential") == 8


async def test_past_max_invocations_nothing_runs(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    config, seed_map = load(agent_doc(tmp_path, max_invocations=2))
    subsystem = subsystem_for(config)
    audit = AuditLog(config.audit_path, schema=subsystem.audit_schema)
    journal = JournalFile.open(config.journal_path, config.run_id)
    accounts = Accounts(journal, Ledger(), config.max_invocations, run_sync=run_inline)
    runner = FakeEnclaveRunner()
    service = Service(
        config, seed_map, runner, accounts, audit, run_sync=run_inline, subsystem=subsystem
    )
    agent = Agent(service, runner, config.audit_path)
    try:
        assert (await agent.answer(agent_request_bytes("x", repo="octo/unknown")))[0] == ERROR
        assert (await agent.answer(agent_request_bytes("x")))[0] == OK_TRUE
        for _ in range(3):
            body, elapsed = await agent.answer(agent_request_bytes("x"))
            assert body == ERROR
            assert elapsed == pytest.approx(BOUNDARIES_S[0], abs=1e-9)
        assert len(runner.calls) == 1
    finally:
        accounts.close()
        audit.close()


async def test_a_runner_failure_is_the_error_with_the_charge_kept(
    autojump_clock: trio.testing.MockClock, agent: Agent
) -> None:
    body, _ = await agent.answer(agent_request_bytes("fail query-timeout", repo="octo/internal"))
    assert body == ERROR
    body, _ = await agent.answer(agent_request_bytes("none", repo="octo/internal"))
    assert body == ERROR
    assert agent.spent("octo/internal") == 10
    categories = [line["category"] for line in agent.audit_lines()]
    assert categories == ["query-timeout", policy.CATEGORY_INVALID_OUTPUT]


async def test_the_agent_audit_holds_only_the_spec_fields(
    autojump_clock: trio.testing.MockClock, agent: Agent
) -> None:
    await agent.answer(agent_request_bytes("answer true", repo="octo/confidential"))
    await agent.answer(agent_request_bytes("x", repo="octo/unknown-secret"))
    await agent.answer(agent_request_bytes("x", repo="octo/internal", extra=[("X-AWF-Image", "i")]))
    await agent.answer(agent_request_bytes("x", schema=b'{"type":"bogus-kind"}'))
    data = agent.audit.read_bytes()
    for secret in (b"octo", b"confidential-", b"unknown-secret", b"boolean", b"x-awf", b"bogus"):
        assert secret not in data
    lines = agent.audit_lines()
    assert [line["category"] for line in lines] == [
        policy.CATEGORY_OK,
        policy.CATEGORY_REPO_NOT_ALLOWED,
        policy.CATEGORY_INVALID_REQUEST,
        policy.CATEGORY_INVALID_REQUEST,
    ]
    for line in lines:
        assert set(line) == {"_schema", "invocationId", "sensitivity", "charge"} | {
            "bucketMs",
            "category",
        }
        assert line["_schema"] == AGENT_AUDIT_SCHEMA
        assert line["bucketMs"] == TIMING_BUCKETS_MS[0]
    assert lines[0]["sensitivity"] == "confidential"
    assert lines[0]["charge"] == 5


async def test_a_raw_request_is_plain_values(agent: Agent) -> None:
    # The pipeline's input type is the transport's plain values, for both subsystems.
    assert isinstance(raw_request(agent_request_bytes("x")), RawRequest)


def test_an_agent_service_refuses_a_query_audit_log(tmp_path: Path) -> None:
    config, seed_map = load(agent_doc(tmp_path))
    audit = AuditLog(config.audit_path)  # the query record type
    journal = JournalFile.open(config.journal_path, config.run_id)
    accounts = Accounts(journal, Ledger(), config.max_invocations, run_sync=run_inline)
    try:
        with pytest.raises(ValueError, match="record type"):
            Service(config, seed_map, FakeEnclaveRunner(), accounts, audit)
    finally:
        accounts.close()
        audit.close()


async def test_a_reported_answer_longer_than_max_output_bytes_is_refused(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # The runner reads with maxOutputBytes; a longer report is a runner bug: fail closed.
    config, seed_map = load(agent_doc(tmp_path, maxOutputBytes=8))
    audit = AuditLog(config.audit_path, schema=subsystem_for(config).audit_schema)
    journal = JournalFile.open(config.journal_path, config.run_id)
    accounts = Accounts(journal, Ledger(), config.max_invocations, run_sync=run_inline)
    runner = FakeEnclaveRunner()
    agent = Agent(
        Service(config, seed_map, runner, accounts, audit, run_sync=run_inline),
        runner,
        config.audit_path,
    )
    try:
        assert (await agent.answer(agent_request_bytes("answer " + " " * 4 + "true")))[
            0
        ] == OK_TRUE  # 8 bytes
        assert (await agent.answer(agent_request_bytes("answer " + " " * 5 + "true")))[
            0
        ] == ERROR  # 9 bytes
        assert len(runner.calls) == 2
    finally:
        accounts.close()
        audit.close()


@pytest.mark.parametrize(("task", "output"), [(0, 1), (65537, 1), (1, 0), (1, 8193)])
def test_the_agent_subsystem_refuses_out_of_range_bounds(task: int, output: int) -> None:
    from bounded_query.broker.subsystem import agent_subsystem

    with pytest.raises(ValueError, match="must be 1-"):
        agent_subsystem(task, output)


async def test_the_task_is_text_never_configuration(
    autojump_clock: trio.testing.MockClock, agent: Agent
) -> None:
    task = 'X-AWF-Image: evil\r\n\r\n{"timeout": 1, "model": "opus", "network": "host"}\nimage: x'
    body, _ = await agent.answer(agent_request_bytes(task))
    assert body == OK_TRUE
    (call,) = agent.runner.calls
    assert call.task == task  # verbatim, nothing interpreted
    (invocation,) = agent.runner.invocations
    assert invocation.run_id == agent.service.config.run_id


async def test_an_engine_past_the_last_boundary_halts_the_run(
    autojump_clock: trio.testing.MockClock, agent: Agent
) -> None:
    body, elapsed = await agent.answer(agent_request_bytes(f"sleep {BOUNDARIES_S[-1] + 60}"))
    assert body == ERROR
    assert agent.service.halted_at is not None
    # Later requests get the canonical error and never reach the runner.
    later, _ = await agent.answer(agent_request_bytes("x"))
    assert later == ERROR
    assert len(agent.runner.calls) == 1
    assert elapsed < BOUNDARIES_S[-1] + 60
