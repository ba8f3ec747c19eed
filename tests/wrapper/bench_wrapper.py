"""Benchmark: the wrapper's own cost per query (prints a table; never asserts).

``python -m tests.wrapper.bench_wrapper [N]`` from the repository root. Each
row runs the wrapper N times against the recorded-bytes server (which answers
at once), so the time is process start-up plus the wrapper's own work: the
floor every bounded query pays on top of the broker's timing bucket.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bounded_query.broker.protocol import policy
from bounded_query.harness.staging.outputs import install_agent_wrapper_dir, install_wrapper_dir
from tests.wrapper.fakes import (
    COST_FILE,
    Reply,
    http_reply,
    recorded_server,
    run_wrapper,
    wrapper_commands,
)

ARGS = ["--repo", "octo/alpha", "--schema", '{"type":"boolean"}']


def measure(
    command: list[str], args: list[str], script: bytes, n: int, agent: bool = False
) -> list[float]:
    reply = Reply([http_reply(b'{"status":"ok","result":true}')])
    times = []
    with recorded_server(reply) as server:
        for _ in range(n):
            if agent:  # bounded-agent reads its own socket variable
                env = {policy.ENV_AGENT_SOCKET: server.path}
                outcome = run_wrapper(command, args, script=script, env=env)
            else:
                outcome = run_wrapper(command, args, script=script, socket_path=server.path)
            assert outcome.stdout == b'{"status":"ok","result":true}\n', outcome
            times.append(outcome.elapsed * 1000)
    return times


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    commands = wrapper_commands()
    installed = Path(tempfile.mkdtemp(prefix="bqw-bench-"))
    (installed / "q").mkdir()
    (installed / "a").mkdir()
    install_wrapper_dir(installed / "q")
    install_agent_wrapper_dir(installed / "a", policy.DEFAULT_AGENT_MAX_TASK_BYTES)
    rows = [
        (
            "installed bounded-query, 10 B",
            [str(installed / "q" / "bounded-query")],
            ARGS,
            b"print(1)\n",
        ),
        (
            "installed bounded-agent, 10 B task",
            [str(installed / "a" / "bounded-agent")],
            ARGS,
            b"task text\n",
        ),
        ("file, 10 B script", commands["file"], ARGS, b"print(1)\n"),
        ("file, 64 KiB script", commands["file"], ARGS, b"#" * 65536),
        ("console script, 10 B", commands["console-script"], ARGS, b"print(1)\n"),
        (
            "python3 -I -S file, 10 B",
            [sys.executable, "-I", "-S", *commands["file"][1:]],
            ARGS,
            b"print(1)\n",
        ),
        ("python3 -c pass (floor)", [sys.executable, "-c", "pass"], [], b""),
        (
            "cost tool (installed protocol)",
            [sys.executable, str(COST_FILE)],
            ["--schema", '{"type":"boolean"}'],
            b"",
        ),
    ]
    print(f"{'variant':34} {'median ms':>10} {'p90 ms':>8} {'max ms':>8}   (n={n})")
    for name, command, args, script in rows:
        if command[-1] == "pass" or "cost" in name:
            times = []
            for _ in range(n):
                outcome = run_wrapper(command, args, script=script)
                times.append(outcome.elapsed * 1000)
        else:
            times = measure(command, args, script, n, agent="bounded-agent" in name)
        times.sort()
        p90 = times[int(0.9 * (len(times) - 1))]
        print(f"{name:34} {statistics.median(times):10.1f} {p90:8.1f} {times[-1]:8.1f}")
    for directory in (installed / "q", installed / "a"):
        for root, dirs, _files in os.walk(directory):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)
    shutil.rmtree(installed)


if __name__ == "__main__":
    main()
