"""Two real broker processes, one per subsystem: separate ledgers (spec 15.1).

Both brokers are the shipped ``run_server`` in their own process, each with
its own private root, journal and seed map naming the *same* repositories
with the same sensitivities; only the runner is a fake (the query side runs
the script in a subprocess, the agent side is the fake enclave runner,
which logs every call to a file). Everything is observed from the caller's
side, over the real sockets: spending a repository's whole budget on one
subsystem leaves the other's balance whole, in both directions and across a
restart; a balance shows in no response, byte for byte.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bounded_query.broker.http import response_bytes
from tests.broker.agent_helpers import CALLS_ENV, agent_doc, agent_request_bytes
from tests.broker.helpers import ERROR, exchange, make_root, request_bytes
from tests.broker.procs import start_broker, stderr_log

ENTRY = "tests.broker.subsystem_broker_main"
ENUM16 = json.dumps({"type": "enum", "values": [f"v{i}" for i in range(16)]}).encode()
BOOL = b'{"type":"boolean"}'
ERROR_RESPONSE = response_bytes(ERROR)
OK_V3 = response_bytes(b'{"status":"ok","result":"v3"}')
OK_TRUE = response_bytes(b'{"status":"ok","result":true}')


def _query_script(answer: str) -> str:
    return f"import os\nopen(os.environ['QUERY_OUT'], 'w').write({answer!r})\n"


@dataclass
class Side:
    name: str
    config: Path
    socket: Path
    proc: subprocess.Popen[bytes]

    def frame(self, repo: str, schema: bytes, answer: str) -> bytes:
        if self.name == "agent":
            return agent_request_bytes(f"answer {answer}", repo=repo, schema=schema)
        return request_bytes(_query_script(answer), repo=repo, schema=schema)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


@dataclass
class Pair:
    query: Side
    agent: Side
    calls: Path

    def side(self, name: str) -> Side:
        return self.query if name == "query" else self.agent

    def restart(self, name: str) -> Side:
        side = self.side(name)
        side.stop()
        proc = start_broker(side.config, module=ENTRY, env_extra={CALLS_ENV: str(self.calls)})
        fresh = Side(side.name, side.config, side.socket, proc)
        setattr(self, name, fresh)
        return fresh

    def agent_calls(self) -> int:
        return len(self.calls.read_text().splitlines()) if self.calls.exists() else 0


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    query_doc = make_root(tmp_path / "query", max_invocations=50)
    agent_doc_ = agent_doc(tmp_path / "agent", max_invocations=50)
    assert query_doc["privateRoot"] != agent_doc_["privateRoot"]
    calls = tmp_path / "agent-calls.log"
    env = {CALLS_ENV: str(calls)}
    sides: list[Side] = []
    built: Pair | None = None
    try:
        for name, base, doc in (
            ("query", tmp_path / "query", query_doc),
            ("agent", tmp_path / "agent", agent_doc_),
        ):
            config = base / "broker.json"
            proc = start_broker(config, module=ENTRY, env_extra=env)
            socket = doc["socketPath"]
            assert isinstance(socket, str)
            sides.append(Side(name, config, Path(socket), proc))
        built = Pair(sides[0], sides[1], calls)
        yield built
    finally:
        current = [built.query, built.agent] if built is not None else []
        for side in [*sides, *current]:
            side.stop()
    for side in current:
        # The entry point is the shipped run_server: it stopped cleanly.
        log = stderr_log(side.config).read_text()
        assert side.proc.returncode == 0, log
        # Its operator lines name the subsystem it served.
        events = [json.loads(line) for line in log.splitlines()]
        served = {e["event"]: e.get("subsystem") for e in events if "subsystem" in e}
        expected = f"bounded-{side.name}"
        assert served == {"broker-ready": expected, "broker-stopped": expected}


@pytest.mark.parametrize("spender", ["query", "agent"])
async def test_spending_on_one_subsystem_never_moves_the_others_balance(
    pair: Pair, spender: str
) -> None:
    other = "agent" if spender == "query" else "query"
    repo = "octo/confidential"  # 8 bits; a 16-value enum costs exactly 8
    spend = pair.side(spender)
    assert await exchange(spend.socket, spend.frame(repo, ENUM16, '"v3"')) == OK_V3
    assert await exchange(spend.socket, spend.frame(repo, BOOL, "true")) == ERROR_RESPONSE
    # The other subsystem's balance is whole: it can spend all 8 bits itself.
    keep = pair.side(other)
    assert await exchange(keep.socket, keep.frame(repo, ENUM16, '"v3"')) == OK_V3
    assert await exchange(keep.socket, keep.frame(repo, BOOL, "true")) == ERROR_RESPONSE
    # A restart replays each broker's own journal: still spent, still separate.
    spend = pair.restart(spender)
    assert await exchange(spend.socket, spend.frame(repo, BOOL, "true")) == ERROR_RESPONSE
    fresh = "octo/internal"
    assert await exchange(spend.socket, spend.frame(fresh, BOOL, "true")) == OK_TRUE
    # Only the agent broker's launches reached the enclave runner: one.
    assert pair.agent_calls() == 1 + (spender == "agent")


async def test_a_balance_is_never_disclosed(pair: Pair) -> None:
    agent = pair.agent
    repo = "octo/internal"  # 64 bits; a boolean costs 5: twelve answers, then none
    answers = [await exchange(agent.socket, agent.frame(repo, BOOL, "true")) for _ in range(13)]
    # Every answer is the same bytes whatever the balance left (59 bits ... 4 bits).
    assert answers[:12] == [OK_TRUE] * 12
    # Exhausted is byte for byte the error of a repository that is not configured.
    unknown = await exchange(agent.socket, agent.frame("octo/nowhere", BOOL, "true"))
    assert answers[12] == unknown == ERROR_RESPONSE
    assert pair.agent_calls() == 12
    # The query broker's balance of the same repository is whole.
    query = pair.query
    assert await exchange(query.socket, query.frame(repo, BOOL, "true")) == OK_TRUE


async def test_each_broker_refuses_the_others_frame(pair: Pair) -> None:
    agent, query = pair.agent, pair.query
    as_query = request_bytes(_query_script("true"), repo="octo/public")
    as_agent = agent_request_bytes("answer true", repo="octo/public")
    assert await exchange(agent.socket, as_query) == ERROR_RESPONSE
    assert await exchange(query.socket, as_agent) == ERROR_RESPONSE
    assert pair.agent_calls() == 0
    assert await exchange(agent.socket, as_agent) == OK_TRUE
    assert await exchange(query.socket, as_query) == OK_TRUE
