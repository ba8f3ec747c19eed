"""The refusal gate against real queries on runc and runsc (issue 9 part 5), attacker's side.

A real in-process broker with the real sandbox runner; a query that creates
files and burns CPU for about half a second runs while five "agent" tasks
send malformed requests back to back and note when each answer arrives.
Before the gate, hundreds of refusals came back during the query, their
latency following its load (``tests/bench/bench_refusal_clock_engine.py``);
now none may arrive before the query's own bucketed answer.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
import trio

from bounded_query.broker.config import parse_config, parse_seed_map
from bounded_query.broker.server import BrokerServer
from tests.broker.helpers import ERROR, body_of, exchange, request_bytes
from tests.conftest import require_engine

pytestmark = [pytest.mark.engine]

REPO = "octo/gate"
GARBAGE = b"NOT HTTP AT ALL\r\n\r\n"
ENCODER = (
    "import os, time\n"
    "os.makedirs('/query/t', exist_ok=True)\n"
    "end = time.monotonic() + 0.5\n"
    "n = 0\n"
    "while time.monotonic() < end:\n"
    "    open(f'/query/t/{n % 3000}', 'w').close(); n += 1\n"
    "open('/query/out', 'w').write('true')\n"
)


def _config(base: Path, runtime: str) -> dict[str, object]:
    private = base / "private"
    seed_id = secrets.token_hex(8)
    (private / "seeds" / seed_id).mkdir(parents=True)
    (private / "seeds" / seed_id / "README").write_text("gate\n")
    seed_map = private / "seed-map.json"
    entry = {"repo": REPO, "seedId": seed_id, "sensitivity": "public", "commit": "a" * 40}
    seed_map.write_text(json.dumps({"version": 1, "repos": [entry]}))
    return {
        "version": 1,
        "runId": secrets.token_hex(16),
        "socketPath": str(base / "run" / "broker.sock"),
        "socketUid": None,
        "socketGid": None,
        "privateRoot": str(private),
        "seedMap": str(seed_map),
        "runtime": runtime,
        "timeout": 30,
        "memoryLimit": "256m",
        "maxInvocations": 1000,
        "image": "bounded-query-python:latest",
        "dockerHost": "unix:///var/run/docker.sock",
        "hostPathMap": {},
    }


@pytest.mark.parametrize("runtime", ["docker", "gvisor"])
async def test_no_refusal_leaves_before_a_real_querys_answer(tmp_path, runtime):
    require_engine()
    from bounded_query.sandbox import create_runner

    config = parse_config(_config(tmp_path, runtime))
    seed_map = parse_seed_map(json.loads(config.seed_map_path.read_text()))
    runner = create_runner(config.runner_settings())
    server = BrokerServer(config, seed_map, runner)
    sock = config.socket_path
    arrivals: dict[int, list[float]] = {index: [] for index in range(5)}
    answer: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        # Warm-up, so the measured query lands in its usual bucket.
        assert body_of(await exchange(sock, request_bytes(ENCODER, repo=REPO))) != ERROR
        origin = trio.current_time()

        async def query() -> None:
            got = body_of(await exchange(sock, request_bytes(ENCODER, repo=REPO), limit_s=120))
            assert got == b'{"status":"ok","result":true}'
            answer["at"] = trio.current_time() - origin

        async def agent(index: int) -> None:
            await trio.sleep(0.1)  # the query is in the lane by now
            while "at" not in answer:
                assert body_of(await exchange(sock, GARBAGE, limit_s=120)) == ERROR
                arrivals[index].append(trio.current_time() - origin)

        async with trio.open_nursery() as inner:
            inner.start_soon(query)
            for index in arrivals:
                inner.start_soon(agent, index)
        server.stop()
    runner.close()  # type: ignore[attr-defined]  # DockerRunner
    at = answer["at"]
    print(f"\n{runtime}: answer at {at:.3f}s; refusal arrivals {arrivals}")
    assert at >= 1.0  # the query's own bucket
    for index, times in arrivals.items():
        # The first refusal of each sender was held until the answer; the
        # sender saw nothing at all while the query ran.
        assert times, index
        assert times[0] >= at - 0.05, (index, times[0], at)
