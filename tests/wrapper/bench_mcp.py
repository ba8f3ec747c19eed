"""Benchmark: what ``bounded-query-mcp`` adds (prints a table; never asserts).

``python -m tests.wrapper.bench_mcp [N]`` from the repository root. Against the
recorded-bytes broker (which answers at once), so the times are the server's
own work: start-up to the ``initialize`` answer, ``ping`` and ``tools/list``
round trips, a ``bounded_query`` call (one broker connection each) and a
``bounded_query_cost`` call, next to the CLI wrapper's per-query process.
"""

from __future__ import annotations

import statistics
import sys
import time

from tests.wrapper.fakes import Reply, http_reply, recorded_server, run_wrapper, wrapper_commands
from tests.wrapper.mcp_fixtures import BOOLEAN, call, initialize, raw_server, request, server_env

OK = b'{"status":"ok","result":true}'
QUESTION = {"repo": "octo/alpha", "schema": BOOLEAN, "script": "print(1)\n"}


def timed(server, line: bytes) -> float:
    started = time.perf_counter()
    reply = server.ask(line)
    assert "result" in reply, reply
    return (time.perf_counter() - started) * 1000


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    rows: dict[str, list[float]] = {
        k: []
        for k in (
            "start-up to initialize answer",
            "ping",
            "tools/list",
            "bounded_query (MCP)",
            "bounded_query_cost (MCP)",
            "bounded-query CLI process",
        )
    }
    with recorded_server(Reply([http_reply(OK)])) as broker:
        env = server_env(broker.path, None)
        for _ in range(max(5, n // 5)):
            started = time.perf_counter()
            with raw_server(env=env) as server:
                server.ask(initialize(0))
                rows["start-up to initialize answer"].append((time.perf_counter() - started) * 1000)
                server.close()
        with raw_server(env=env) as server:
            server.ask(initialize(0))
            for i in range(n):
                rows["ping"].append(timed(server, request(i, "ping")))
                rows["tools/list"].append(timed(server, request(i, "tools/list")))
                rows["bounded_query (MCP)"].append(
                    timed(server, call(i, "bounded_query", QUESTION))
                )
                rows["bounded_query_cost (MCP)"].append(
                    timed(server, call(i, "bounded_query_cost", {"schema": BOOLEAN}))
                )
            server.close()
        args = ["--repo", "octo/alpha", "--schema", BOOLEAN]
        for _ in range(max(5, n // 5)):
            outcome = run_wrapper(wrapper_commands()["file"], args, socket_path=broker.path)
            rows["bounded-query CLI process"].append(outcome.elapsed * 1000)
    print(f"bounded-query-mcp against an instant fake broker ({n} calls per row)")
    print(f"{'what':34} {'median ms':>10} {'p90 ms':>8} {'max ms':>8}")
    for name, times in rows.items():
        ordered = sorted(times)
        p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
        print(f"{name:34} {statistics.median(times):10.2f} {p90:8.2f} {max(times):8.2f}")


if __name__ == "__main__":
    main()
