"""What confinement costs at agent start (issue 8): prints a table, asserts nothing.

For each mode, N times: start the agent command ``python3 -c pass`` the way
``run`` does (``harness/agent/launch.py``) and wait for its exit. Modes: a host
child as root (the old behaviour; ``--unconfined-agent``), a host child as an
unprivileged uid (``--agent-on-host --agent-user``), and the agent container
(default; ``bridge`` network, and ``none``). The container needs the engine
and ``bounded-query-agent:latest``; run as root:

    python3 tests/bench/bench_agent_start.py [N]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

from bounded_query.harness.agent.launch import start_container_agent, start_host_agent
from bounded_query.harness.agent.spec import AgentContainer, AgentUser

HOST = "unix:///var/run/docker.sock"
ARGV = ("python3", "-c", "pass")


async def host(user: AgentUser | None) -> float:
    started = time.perf_counter()
    agent = await start_host_agent(
        ("/usr/bin/python3", "-c", "pass"), {"PATH": "/usr/bin"}, "/", user
    )
    await agent.wait()
    return time.perf_counter() - started


async def container(directory: Path, network: str) -> float:
    for name in ("ws", "run", "skill"):
        (directory / name).mkdir(exist_ok=True)
    spec = AgentContainer(
        image="bounded-query-agent:latest",
        argv=ARGV,
        workspace=str(directory / "ws"),
        socket_dir=str(directory / "run"),
        skill_dir=str(directory / "skill"),
        env={},
        user=AgentUser(20000, 20000),
        run_id="bench" + "0" * 27,
        owner="{}",
        network=network,
    )
    started = time.perf_counter()
    agent = await start_container_agent(HOST, spec)
    try:
        status = await agent.wait()
    finally:
        await agent.close()
    elapsed = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"agent container exited {status}")
    return elapsed


async def main(n: int) -> None:
    rows = []
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        modes = [
            ("host, harness uid (unconfined)", lambda: host(None)),
            ("host, uid 20000 (--agent-on-host)", lambda: host(AgentUser(20000, 20000))),
            ("container, bridge (default)", lambda: container(Path(tmp), "bridge")),
            ("container, --agent-network none", lambda: container(Path(tmp), "none")),
        ]
        for name, fn in modes:
            await fn()  # warm-up
            times = [await fn() for _ in range(n)]
            rows.append((name, statistics.median(times), min(times), max(times)))
    base = rows[0][1]
    print(f"agent start + exit of `python3 -c pass`, N={n} (seconds)")
    print(f"{'mode':36} {'median':>8} {'min':>8} {'max':>8} {'x host':>7}")
    for name, median, low, high in rows:
        print(f"{name:36} {median:8.3f} {low:8.3f} {high:8.3f} {median / base:7.1f}")


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 10)
