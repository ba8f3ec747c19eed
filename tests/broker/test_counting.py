"""maxInvocations counts every response, transport-level refusals included (spec 14.10).

See the decision in the docstring of ``broker/service.py``.
"""

from __future__ import annotations

import os

import trio

from bounded_query.broker.accounts import Accounts
from bounded_query.broker.audit import AuditLog
from bounded_query.broker.journal import Admitted, JournalFile
from bounded_query.broker.ledger import Ledger
from bounded_query.broker.server import BrokerServer
from bounded_query.broker.service import Service
from tests.broker.helpers import RUN_ID, body_of, exchange, load, make_root, request_bytes
from tests.fakes.runner import ScriptedRunner

ERROR = b'{"status":"error"}'
OK_TRUE = b'{"status":"ok","result":true}'
GARBAGE = b"NOT HTTP AT ALL\r\n\r\n"


def _admitted(config) -> list[Admitted]:
    journal = JournalFile.open(config.journal_path, RUN_ID)
    try:
        return [r for r in journal.replayed if isinstance(r, Admitted)]
    finally:
        journal.close()


async def _until(predicate, limit_s: float = 10.0) -> None:
    """Wait (real time: real sockets and threads) until ``predicate()`` holds."""
    with trio.fail_after(limit_s):
        while not predicate():  # noqa: ASYNC110 - state changes in other tasks and threads
            await trio.sleep(0.005)


async def test_a_transport_refusal_counts_like_any_response(tmp_path):
    config, seed_map = load(make_root(tmp_path, max_invocations=3))
    runner = ScriptedRunner()
    server = BrokerServer(config, seed_map, runner)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        assert server.service is not None
        sock = config.socket_path
        assert body_of(await exchange(sock, GARBAGE)) == ERROR
        await _until(lambda: server.service.accounts.invocations == 1)
        assert body_of(await exchange(sock, request_bytes("write true"))) == OK_TRUE
        assert body_of(await exchange(sock, request_bytes("write true"))) == OK_TRUE
        # The garbage took a slot: the fourth response is past the cap.
        assert body_of(await exchange(sock, request_bytes("write true"))) == ERROR
        assert len(runner.calls) == 2
        # Past the cap, refusals are answered but journal nothing more.
        for _ in range(5):
            assert body_of(await exchange(sock, GARBAGE)) == ERROR
        assert server.service.accounts.invocations == 3
        server.stop()
    admitted = _admitted(config)
    assert [r.rejection for r in admitted] == ["http-malformed", None, None]


async def test_a_connection_cap_refusal_counts(tmp_path):
    config, seed_map = load(make_root(tmp_path, max_invocations=10))
    server = BrokerServer(config, seed_map, ScriptedRunner(), connection_cap=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        assert server.service is not None
        holder = await trio.open_unix_socket(os.fspath(config.socket_path))
        async with holder:
            await holder.send_all(b"POST /query HTTP/1.1\r\n")  # holds the only slot
            await _until(lambda: server.active == 1)
            assert body_of(await exchange(config.socket_path, request_bytes("x"))) == ERROR
            await _until(lambda: server.service.accounts.invocations == 1)
        # The holder's half head, cut short, is a refusal of its own.
        await _until(lambda: server.service.accounts.invocations == 2)
        server.stop()
    assert [r.rejection for r in _admitted(config)] == ["connection-cap", "http-malformed"]


async def test_concurrent_refusals_and_requests_never_count_past_the_cap(tmp_path):
    cap = 5
    config, seed_map = load(make_root(tmp_path, max_invocations=cap))
    runner = ScriptedRunner()
    server = BrokerServer(config, seed_map, runner)
    bodies: list[bytes] = []

    async def one(raw: bytes) -> None:
        bodies.append(body_of(await exchange(config.socket_path, raw)))

    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        assert server.service is not None
        async with trio.open_nursery() as clients:
            for index in range(30):
                raw = GARBAGE if index % 2 else request_bytes("write true")
                clients.start_soon(one, raw)
        await _until(lambda: server.service.accounts.invocations == cap)
        await trio.sleep(0.2)  # let any straggling refusal try to count
        assert server.service.accounts.invocations == cap
        server.stop()
    assert len(bodies) == 30
    assert bodies.count(OK_TRUE) == len(runner.calls) <= cap
    assert len(_admitted(config)) == cap


async def test_concurrent_refusals_are_counted_in_shared_appends(tmp_path):
    """Group commit: every refusal gets its own record, far fewer fsyncs, never past the cap."""
    cap = 150
    config, seed_map = load(make_root(tmp_path, max_invocations=cap))
    journal = JournalFile.open(config.journal_path, RUN_ID)
    appends: list[int] = []

    async def counting_run_sync(fn, *args):
        """The real thread runner, counting the journal's appends on the way."""
        if fn == journal.append:
            appends.append(len(args[0]))
        return await trio.to_thread.run_sync(fn, *args)

    accounts = Accounts(journal, Ledger(), cap, run_sync=counting_run_sync)
    audit = AuditLog(config.audit_path)
    service = Service(config, seed_map, ScriptedRunner(), accounts, audit)
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(200):
                nursery.start_soon(service.count_refusal, "http-malformed")
        await service.flush_refusals()
        assert service.accounts.invocations == cap
        assert sum(appends) == cap  # one record per counted refusal
        assert len(appends) < cap / 5  # but batched: far fewer appends
        assert dict(service.sink._tally.pending) == {"http-malformed": 50}  # past the cap
    finally:
        journal.close()
        audit.close()
    assert [r.rejection for r in _admitted(config)] == ["http-malformed"] * cap
    lines = config.audit_path.read_bytes().splitlines()
    assert len(lines) == cap
