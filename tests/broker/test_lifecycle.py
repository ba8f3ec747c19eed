"""Start-up recovery, SIGTERM, SIGKILL-and-restart (a real broker subprocess)."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import trio

from bounded_query.broker.journal import (
    Admitted,
    Debit,
    Header,
    JournalFile,
    Launched,
    Outcome,
    Record,
    decode_journal,
    encode_record,
)
from bounded_query.broker.ledger import Ledger
from bounded_query.broker.server import BrokerServer
from tests.broker.helpers import (
    ERROR,
    RUN_ID,
    body_of,
    exchange,
    load,
    make_root,
    request_bytes,
)
from tests.broker.procs import query_processes, start_broker, stderr_log
from tests.fakes.runner import ScriptedRunner

CONST = b'{"type":"const","value":1}'
SCRIPT_OK = "import os\nopen(os.environ['QUERY_OUT'], 'w').write('true')\n"


def _sync_exchange(path: Path, data: bytes, timeout: float = 30.0) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


# -- in-process start-up recovery --------------------------------------------


async def test_startup_closes_in_flight_and_clears_stale_work(tmp_path):
    config, seed_map = load(make_root(tmp_path))
    journal = JournalFile.open(config.journal_path, RUN_ID)
    journal.append(
        [
            Admitted("aa", repo="octo/internal", charge=5),
            Debit("aa", "octo/internal", 5),
            Launched("aa"),
            Admitted("bb", repo="octo/internal", charge=9),
            Debit("bb", "octo/internal", 9),
            Admitted("cc", rejection="invalid-request"),
        ]
    )
    journal.close()
    stale = config.work_root / "aa"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "f").write_text("x")
    os.symlink("/etc", stale / "link")
    runner = ScriptedRunner()
    server = BrokerServer(config, seed_map, runner)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        assert server.recovery is not None
        assert server.recovery.interrupted == ["aa", "bb"]
        assert not stale.exists()
        assert runner.reconciled == 1
        assert runner.preflights == 1
        assert runner.calls == []  # interrupted invocations are never re-run
        assert server.service is not None
        ledger = server.service.accounts.ledger
        assert ledger.spent("octo/internal") == 14  # never refunded
        assert ledger.invocations == 3
        # 64 - 14 = 50 left: a 5-bit boolean runs.
        response = await exchange(
            config.socket_path, request_bytes("write true", repo="octo/internal")
        )
        assert body_of(response) == b'{"status":"ok","result":true}'
        server.stop()
    assert runner.reconciled == 2  # once at start-up, once at shutdown
    assert not config.ready_path.exists()
    assert not config.socket_path.exists()
    replayed = JournalFile.open(config.journal_path, RUN_ID)
    outcomes = [r for r in replayed.replayed if isinstance(r, Outcome)]
    replayed.close()
    assert outcomes[:2] == [
        Outcome("aa", "interrupted", "broker-restart"),
        Outcome("bb", "interrupted", "broker-restart"),
    ]


async def test_startup_refuses_corrupt_journal(tmp_path):
    from bounded_query.broker.journal import JournalCorrupt

    config, seed_map = load(make_root(tmp_path))
    records: list[Record] = [
        Header(RUN_ID),
        Admitted("aa", rejection="x"),
        Admitted("bb", rejection="x"),
    ]
    data = bytearray(b"".join(encode_record(r) for r in records))
    data[len(encode_record(records[0])) + 10] ^= 0xFF  # damage the middle record
    config.journal_path.parent.mkdir(parents=True)
    config.journal_path.write_bytes(bytes(data))
    server = BrokerServer(config, seed_map, ScriptedRunner())
    with pytest.raises(JournalCorrupt):
        await server.serve()
    assert not config.socket_path.exists()
    assert not config.ready_path.exists()


async def test_startup_refuses_inconsistent_journal(tmp_path):
    from bounded_query.broker.ledger import JournalInconsistent

    config, seed_map = load(make_root(tmp_path))
    journal = JournalFile.open(config.journal_path, RUN_ID)
    journal.append([Launched("aa")])
    journal.close()
    with pytest.raises(JournalInconsistent):
        await BrokerServer(config, seed_map, ScriptedRunner()).serve()


async def test_stop_interrupts_a_long_invocation_within_grace(tmp_path):
    config, seed_map = load(make_root(tmp_path))
    runner = ScriptedRunner()
    server = BrokerServer(config, seed_map, runner, grace_s=0.2)
    responses: list[bytes] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)

        async def client() -> None:
            responses.append(await exchange(config.socket_path, request_bytes("sleep 30")))

        nursery.start_soon(client)
        while not runner.calls:  # noqa: ASYNC110 - wait for the invocation to start
            await trio.sleep(0.01)
        started = trio.current_time()
        server.stop()
    assert trio.current_time() - started < 5
    assert responses == [b""]  # the connection was closed without an answer
    journal = JournalFile.open(config.journal_path, RUN_ID)
    last = journal.replayed[-1]
    journal.close()
    assert last == Outcome(runner.calls[0].invocation_id, "interrupted", "shutdown")
    assert not any(config.work_root.iterdir())


async def test_stop_lets_a_short_invocation_finish(tmp_path):
    config, seed_map = load(make_root(tmp_path))
    runner = ScriptedRunner()
    server = BrokerServer(config, seed_map, runner, grace_s=30)
    responses: list[bytes] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)

        async def client() -> None:
            raw = request_bytes("sleep 0.3\nwrite true")
            responses.append(await exchange(config.socket_path, raw))

        nursery.start_soon(client)
        while not runner.calls:  # noqa: ASYNC110 - wait for the invocation to start
            await trio.sleep(0.01)
        server.stop()
    assert [body_of(r) for r in responses] == [b'{"status":"ok","result":true}']


# -- a real broker process ---------------------------------------------------


def test_sigterm_exits_zero_and_cleans_up(tmp_path):
    make_root(tmp_path)
    config_path = tmp_path / "broker.json"
    doc = json.loads(config_path.read_text())
    proc = start_broker(config_path)
    sock = Path(doc["socketPath"])
    response = _sync_exchange(sock, request_bytes(SCRIPT_OK))
    assert body_of(response) == b'{"status":"ok","result":true}'
    assert (sock.stat().st_mode & 0o777) == 0o660
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert not sock.exists()
    assert not (Path(doc["privateRoot"]) / "control" / "ready").exists()


def test_refuses_to_start_on_bad_config(tmp_path):
    make_root(tmp_path)
    config_path = tmp_path / "broker.json"
    doc = json.loads(config_path.read_text())
    doc["surprise"] = 1
    config_path.write_text(json.dumps(doc))
    proc = start_broker(config_path, wait=False)
    assert proc.wait(timeout=20) == 2
    assert "unknown keys" in stderr_log(config_path).read_text()


def test_refuses_to_start_on_corrupt_journal_with_exit_2(tmp_path):
    """The real process: one JSON line and exit 2, not a traceback (exit 1)."""
    doc = make_root(tmp_path)
    journal = Path(str(doc["privateRoot"])) / "state" / "journal"
    journal.parent.mkdir(parents=True, exist_ok=True)
    journal.write_bytes(b"\x00\x00\x00\x05\x00\x00\x00\x00hello" * 2)  # bad checksum
    config_path = tmp_path / "broker.json"
    proc = start_broker(config_path, wait=False)
    assert proc.wait(timeout=20) == 2
    lines = stderr_log(config_path).read_text().splitlines()
    assert [json.loads(line)["reason"] for line in lines] == ["journal"]


def _ledger_of(journal_path: Path) -> Ledger:
    scan = decode_journal(journal_path.read_bytes() if journal_path.exists() else b"")
    return Ledger.from_records(scan.records)


def test_sigkill_during_50_invocations(tmp_path):
    """SIGKILL at random points; budget never grows, count never shrinks, nothing survives."""
    make_root(tmp_path, max_invocations=10000)
    config_path = tmp_path / "broker.json"
    doc = json.loads(config_path.read_text())
    sock = Path(doc["socketPath"])
    private = Path(doc["privateRoot"])
    journal_path = private / "state" / "journal"
    rng = random.Random(20261130)
    proc = start_broker(config_path)
    previous_count, previous_spent = 0, 0
    kills = answered = 0
    for index in range(50):
        sleep_ms = rng.choice([0, 5, 20, 60, 150])
        script = (
            f"import os, time\ntime.sleep({sleep_ms / 1000})\n"
            "open(os.environ['QUERY_OUT'], 'w').write('1')\n"
        )
        repo = "octo/internal" if index % 2 else "octo/public"
        raw = request_bytes(script, repo=repo, schema=CONST)
        kill_after = rng.uniform(0, 0.4)
        client = subprocess.Popen(
            [
                "python3",
                "-c",
                "import socket,sys\n"
                "s=socket.socket(socket.AF_UNIX);s.settimeout(30);s.connect(sys.argv[1])\n"
                "s.sendall(sys.stdin.buffer.read());s.shutdown(1)\n"
                "d=b''\n"
                "while True:\n"
                " try: c=s.recv(65536)\n"
                " except OSError: break\n"
                " if not c: break\n"
                " d+=c\n"
                "sys.stdout.buffer.write(d)\n",
                str(sock),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert client.stdin is not None
        client.stdin.write(raw)
        client.stdin.close()
        client.stdin = None  # communicate() must not flush it again
        time.sleep(kill_after)
        killed = proc.poll() is None and rng.random() < 0.8
        if killed:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            kills += 1
        out, _ = client.communicate(timeout=30)
        if out:
            assert body_of(out) in (ERROR, b'{"status":"ok","result":1}')
            answered += 1
        ledger = _ledger_of(journal_path)
        assert ledger.invocations >= previous_count
        assert ledger.spent("octo/internal") >= previous_spent
        assert ledger.spent("octo/internal") <= 64
        previous_count = ledger.invocations
        previous_spent = ledger.spent("octo/internal")
        if killed:
            proc = start_broker(config_path)
            # After replay nothing is in flight, no workspace and no query survives.
            replayed = _ledger_of(journal_path)
            assert replayed.in_flight() == []
            assert replayed.invocations == previous_count
            assert replayed.spent("octo/internal") == previous_spent
            assert list((private / "work").iterdir()) == []
            time.sleep(0.05)
            assert query_processes(str(private)) == []
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    final = _ledger_of(journal_path)
    assert final.in_flight() == []
    assert final.invocations >= previous_count
    assert list((private / "work").iterdir()) == []
    assert kills >= 20
    print(
        f"\nSIGKILL test: {kills} kills, {answered} answered, {final.invocations} counted, "
        f"{final.spent('octo/internal')} internal bits spent"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
async def test_socket_owner_is_configurable(tmp_path):
    doc = make_root(tmp_path)
    doc["socketUid"] = 4321
    doc["socketGid"] = 1234
    config, seed_map = load(doc)
    server = BrokerServer(config, seed_map, ScriptedRunner())
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        info = os.stat(config.socket_path)
        assert (info.st_uid, info.st_gid) == (4321, 1234)
        assert (info.st_mode & 0o777) == 0o660
        parent = os.stat(config.socket_path.parent)
        assert (parent.st_uid, parent.st_gid, parent.st_mode & 0o777) == (4321, 1234, 0o770)
        server.stop()


class WarmingRunner(ScriptedRunner):
    """A fake with the sandbox runner's optional ``warm(seed_dirs)``."""

    def __init__(self) -> None:
        super().__init__()
        self.warmed: list[Path] = []

    async def warm(self, seed_dirs):
        assert self.reconciled == 1  # after reconcile, before listening
        self.warmed.extend(seed_dirs)
        return {str(seed): True for seed in seed_dirs}


async def test_startup_warms_every_seed_but_sealed(tmp_path):
    config, seed_map = load(make_root(tmp_path))
    runner = WarmingRunner()
    server = BrokerServer(config, seed_map, runner)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        server.stop()
    seeds = config.private_root / "seeds"
    # helpers.make_root numbers seeds in REPOS order; 0004 is octo/sealed.
    assert sorted(runner.warmed) == [seeds / "0001", seeds / "0002", seeds / "0003"]


async def test_the_ready_file_names_what_the_runner_could_not_set_up(tmp_path):
    from bounded_query.broker.readiness import decode_ready
    from bounded_query.broker.runner import Degradation

    missing = Degradation("page-cache pin", "the pin container could not start")
    config, seed_map = load(make_root(tmp_path))
    for degraded in ((), (missing,)):
        runner = ScriptedRunner(degraded=degraded)
        server = BrokerServer(config, seed_map, runner)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            text = config.ready_path.read_text()
            assert (config.ready_path.stat().st_mode & 0o777) == 0o600
            server.stop()
        assert json.loads(text)["pid"] == os.getpid()
        assert decode_ready(text) == degraded
