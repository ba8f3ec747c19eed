"""The wrapper against our real broker daemon (issue #3 items 6-7, end to end).

The broker runs as a real process (``tests.fakes.broker_main``: the shipped
entry point with the tests-only subprocess runner instead of containers), the
wrapper as a real process. Also pins the cost tool to the ledger: the number
of questions ``bounded-query-cost`` says a budget funds is exactly the number
the broker answers before its canonical refusals start.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bounded_query.broker import protocol
from bounded_query.wrapper import bounded_query_cost as cost
from tests.broker.helpers import make_root
from tests.wrapper.fakes import ERROR_LINE, REPO_ROOT, run_wrapper, socket_dir, wrapper_commands

#: Start-up safety net (never reached when the broker works).
READY_TIMEOUT_S = 30.0

ANSWER = b'import os\nwith open(os.environ["QUERY_OUT"], "w") as f:\n    f.write(%s)\n'


def answering(text: str) -> bytes:
    """A query script that writes ``text`` as its answer."""
    return ANSWER % json.dumps(text).encode()


@dataclass
class LiveBroker:
    socket: str
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def live_broker() -> Iterator[LiveBroker]:
    with socket_dir() as directory:
        doc = make_root(Path(directory))
        private = Path(str(doc["privateRoot"]))
        ready = private / "control" / "ready"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fakes.broker_main",
                "--config",
                f"{directory}/broker.json",
            ],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not ready.exists():
                if proc.poll() is not None:
                    assert proc.stderr is not None
                    pytest.fail(f"broker exited {proc.returncode}: {proc.stderr.read()!r}")
                if time.monotonic() > deadline:
                    pytest.fail("broker did not become ready")
                time.sleep(0.02)
            yield LiveBroker(str(doc["socketPath"]), proc)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


@pytest.fixture(scope="module")
def broker() -> Iterator[LiveBroker]:
    with live_broker() as live:
        yield live


@pytest.mark.parametrize("kind", sorted(wrapper_commands()))
def test_ok_answer_end_to_end(broker, kind):
    outcome = run_wrapper(
        wrapper_commands()[kind],
        ["--repo", "octo/public", "--schema", '{"type":"enum","values":["x","\u00e9\\"\u20ac"]}'],
        script=answering(' "\\u00e9\\"\u20ac" '),  # escaped and padded: re-serialized
        socket_path=broker.socket,
    )
    assert outcome.stdout == '{"status":"ok","result":"\u00e9\\"\u20ac"}\n'.encode()
    assert outcome.stderr == b""
    assert outcome.returncode == 0


@pytest.mark.parametrize(
    ("args", "script"),
    [
        (["--repo", "octo/public", "--schema", '{"type":"boolean"}'], answering("2")),
        (["--repo", "octo/public", "--schema", '{"type":"nope"}'], answering("true")),
        (["--repo", "octo/unknown", "--schema", '{"type":"boolean"}'], answering("true")),
        (["--repo", "octo/sealed", "--schema", '{"type":"const","value":1}'], answering("1")),
        (["--repo", "octo/public", "--schema", '{"type":"boolean"}'], b"\xff\xfe"),
        (["--repo", "octo/public", "--schema", '{"type":"boolean"}'], b"raise SystemExit(3)"),
    ],
    ids=["nonconformant", "bad-schema", "unknown-repo", "sealed", "non-utf8-script", "crash"],
)
def test_failures_end_to_end(broker, args, script):
    outcome = run_wrapper(
        wrapper_commands()["file"], args, script=script, socket_path=broker.socket
    )
    assert outcome.stdout == ERROR_LINE
    assert outcome.stderr == b""
    assert outcome.returncode == 0


@pytest.mark.parametrize(
    ("repo", "schema", "answer", "budget"),
    [
        ("octo/confidential", '{"type":"const","value":null}', "null", "confidential"),
        ("octo/confidential", '{"type":"boolean"}', "true", "confidential"),
        ("octo/confidential", '{"type":"integer","minimum":0,"maximum":15}', "7", "confidential"),
        ("octo/internal", '{"type":"integer","minimum":0,"maximum":4095}', "7", "internal"),
    ],
    ids=["confidential-const", "confidential-boolean", "confidential-16", "internal-4096"],
)
def test_cost_tool_predicts_what_the_ledger_funds(repo, schema, answer, budget):
    assessment = cost.assess(schema.encode(), protocol)
    expected = assessment.per_run(cost.run_budgets(protocol))[budget]
    ok_line = b'{"status":"ok","result":' + answer.encode() + b"}\n"
    with live_broker() as live:
        lines = [
            run_wrapper(
                wrapper_commands()["file"],
                ["--repo", repo, "--schema", schema],
                script=answering(answer),
                socket_path=live.socket,
            ).stdout
            for _ in range(expected + 1)
        ]
    assert lines == [ok_line] * expected + [ERROR_LINE]


def test_broker_killed_mid_request(tmp_path):
    marker = tmp_path / "started"
    script = f"import time\nopen({str(marker)!r}, 'w').close()\ntime.sleep(60)\n".encode()
    with live_broker() as live:
        env = {**os.environ, "AWF_BOUNDED_QUERY_SOCKET": live.socket}
        wrapper = subprocess.Popen(
            [
                *wrapper_commands()["file"],
                "--repo",
                "octo/public",
                "--schema",
                '{"type":"boolean"}',
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert wrapper.stdin is not None
        wrapper.stdin.write(script)
        wrapper.stdin.close()
        wrapper.stdin = None  # communicate() must not flush the closed pipe
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not marker.exists():
            assert time.monotonic() < deadline, "the query never started"
            time.sleep(0.02)
        started = time.monotonic()
        live.process.kill()
        stdout, stderr = wrapper.communicate(timeout=30)
        elapsed = time.monotonic() - started
    assert stdout == ERROR_LINE
    assert stderr == b""
    assert wrapper.returncode == 0
    assert elapsed < 30  # EOF ends the wait; the query would have slept 60 s
