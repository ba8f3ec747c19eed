"""``bounded-agent`` against the real agent broker process (spec 15.3, 15.8).

The broker is the shipped ``run_server`` serving the ``bounded-agent``
subsystem in its own process (``tests.broker.subsystem_broker_main``); only the
enclave runner is the fake of ``tests/broker/agent_helpers.py``, whose task is
a tiny command language (``answer <json>``) and which logs every call. The
wrapper is the installed agent ingress copy. Checked from the caller's side:
the canonical answers, a non-conforming answer, the budget and the invocation
cap; that a locally refused task reaches neither the runner nor the
invocation count; and that the query program's frame is refused by the agent
broker (the two protocols never cross).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bounded_query.broker.protocol import policy
from bounded_query.harness.staging.outputs import install_agent_wrapper_dir, install_wrapper_dir
from tests.broker.agent_helpers import CALLS_ENV, agent_doc
from tests.broker.procs import start_broker
from tests.wrapper.fakes import ERROR_LINE

ENTRY = "tests.broker.subsystem_broker_main"
BOOLEAN = '{"type":"boolean"}'
#: The agent broker's maxTaskBytes in these tests (and the ingress's).
LIMIT = 64
MAX_INVOCATIONS = 4


@dataclass
class Live:
    socket: str
    calls: Path
    bin_dir: Path
    query_bin: Path

    def ask(self, repo: str, schema: str, task: bytes, program: str = "bounded-agent") -> bytes:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWF_BOUNDED_")}
        env[policy.ENV_AGENT_SOCKET] = self.socket
        env[policy.ENV_SOCKET] = self.socket  # the query program aimed at the agent broker
        directory = self.bin_dir if program == "bounded-agent" else self.query_bin
        done = subprocess.run(
            [str(directory / program), "--repo", repo, "--schema", schema],
            input=task,
            capture_output=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert (done.stderr, done.returncode) == (b"", 0)
        return done.stdout

    def runner_calls(self) -> int:
        return len(self.calls.read_text().splitlines()) if self.calls.exists() else 0


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    doc = agent_doc(tmp_path / "agent", max_invocations=MAX_INVOCATIONS, maxTaskBytes=LIMIT)
    calls = tmp_path / "calls.log"
    proc = start_broker(
        tmp_path / "agent" / "broker.json", module=ENTRY, env_extra={CALLS_ENV: str(calls)}
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    install_agent_wrapper_dir(bin_dir, LIMIT)
    query_bin = tmp_path / "query-bin"
    query_bin.mkdir()
    install_wrapper_dir(query_bin)
    try:
        yield Live(str(doc["socketPath"]), calls, bin_dir, query_bin)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_answers_refusals_and_the_cap_from_the_callers_side(live: Live) -> None:
    # A conforming answer passes through; a non-conforming one is the canonical error.
    assert live.ask("octo/public", BOOLEAN, b"answer true") == b'{"status":"ok","result":true}\n'
    assert live.ask("octo/public", BOOLEAN, b'answer "maybe"') == ERROR_LINE
    assert live.runner_calls() == 2
    # Local refusals: oversize, empty and non-UTF-8 tasks reach neither the
    # runner nor the invocation count.
    for task in (b"answer true" + b" " * LIMIT, b"", b"answer \xff"):
        assert live.ask("octo/public", BOOLEAN, task) == ERROR_LINE
    assert live.runner_calls() == 2
    # The broker's own refusal of the query frame (X-AWF-Query-Version is an
    # unknown header to it) counts toward maxInvocations: the third response.
    assert live.ask("octo/public", BOOLEAN, b"answer true", program="bounded-query") == ERROR_LINE
    assert live.runner_calls() == 2
    # Fourth response, the last the cap allows: it would be refused had the
    # three local refusals above counted.
    enum = json.dumps({"type": "enum", "values": ["a", "b", "c"]})
    assert live.ask("octo/public", enum, b'answer "c"') == b'{"status":"ok","result":"c"}\n'
    assert live.runner_calls() == 3
    # Past maxInvocations (4 responses so far): refused, the runner not called.
    assert live.ask("octo/public", BOOLEAN, b"answer true") == ERROR_LINE
    assert live.runner_calls() == 3


def test_the_budget_is_charged_before_the_run(live: Live) -> None:
    """``confidential`` has 8 bits: one boolean (5 bits) is answered, the
    second is refused without reaching the runner (nothing says why)."""
    assert live.ask("octo/confidential", BOOLEAN, b"answer false") == (
        b'{"status":"ok","result":false}\n'
    )
    assert live.ask("octo/confidential", BOOLEAN, b"answer false") == ERROR_LINE
    assert live.ask("octo/sealed", BOOLEAN, b"answer true") == ERROR_LINE
    assert live.runner_calls() == 1


def test_a_smuggled_request_in_the_task_is_one_task(live: Live) -> None:
    """Header lines and a second request inside the task reach the (fake) runner
    as one task; the broker answers once and nothing else is served."""
    task = b"t\r\nX-AWF-Image: evil\r\n\r\nPOST /query HTTP/1.1\r\nHost: x\r\n\r\n"
    assert len(task) <= LIMIT
    assert live.ask("octo/public", BOOLEAN, task) == b'{"status":"ok","result":true}\n'
    assert live.runner_calls() == 1
