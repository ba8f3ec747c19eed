"""Builders for bounded-agent broker tests: agent configs, agent frames, a fake enclave runner.

The fake runner stands in for the enclave runner (``sandbox/enclave_runner.py``)
at the runner boundary: it decodes the payload exactly as the real one does
(``decode_agent_payload``), and the *task* is a tiny command language, so a
test controls what the "engine" answers and how long it takes:

* ``answer <bytes>``: the result file holds these bytes (verbatim, UTF-8);
* ``sleep <seconds>``: take that long (trio's clock);
* ``fail <category>``: report that runner failure;
* ``none``: no result (the file was missing or refused);
* anything else: the answer ``true``.

Like the real runner it returns the answer in ``RunReport.result`` and never
leaves it in the workspace, so a broker that re-read the file would find
nothing. ``AGENT_FAKE_CALLS`` (an environment variable naming a file) makes
the subprocess variant append one line per call, so tests of a real broker
process can prove that a refused request never reached the runner.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from bounded_query.broker.agent_payload import AgentPayload, decode_agent_payload
from bounded_query.broker.protocol import encode_schema_header, policy
from bounded_query.broker.runner import Degradation, Invocation, RunReport
from tests.broker.helpers import make_root

#: Where the subprocess fake logs its calls (one line each).
CALLS_ENV = "AGENT_FAKE_CALLS"

ENCLAVE: dict[str, object] = {
    "engine": "claude",
    "model": "claude-haiku-4-5",
    "network": "awf-bounded-agent-0123456789abcdef",
    "proxyAddress": "172.30.0.2",
    "proxyPort": 8080,
    "controlSocket": "/var/tmp/awf-bounded-agent-private-0-x/control/proxy.sock",
    "nanoCpus": 1_000_000_000,
    "pidsLimit": 128,
    "tmpfsBytes": 64 * 1024**2,
    "maxOutputBytes": 8192,
    "maxTaskBytes": 4096,
}


def agent_doc(base: Path, *, max_invocations: int = 8, **enclave: object) -> dict[str, object]:
    """A private root like ``make_root``'s with a bounded-agent broker config."""
    doc = make_root(base, max_invocations=max_invocations, timeout=120)
    doc["subsystem"] = policy.SUBSYSTEM_AGENT
    doc["image"] = policy.ENCLAVE_IMAGES["claude"]
    options = copy.deepcopy(ENCLAVE)
    options.update(enclave)
    doc["enclave"] = options
    (base / "broker.json").write_text(json.dumps(doc))
    return doc


def agent_request_bytes(
    task: bytes | str,
    *,
    repo: str = "octo/public",
    schema: bytes = b'{"type":"boolean"}',
    extra: list[tuple[str, str]] | None = None,
    version: str = "1",
) -> bytes:
    """A bounded-agent request as a curl-style client frames it."""
    body = task.encode() if isinstance(task, str) else task
    headers = [
        ("Host", "localhost"),
        ("User-Agent", "curl/7.88.1"),
        ("X-AWF-Agent-Version", version),
        ("X-AWF-Repo", repo),
        ("X-AWF-Schema-B64", encode_schema_header(schema).decode()),
        ("Content-Type", "text/plain; charset=utf-8"),
        ("Content-Length", str(len(body))),
        *(extra or []),
    ]
    head = "POST /query HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
    return head.encode() + b"\r\n" + body


def _obey(payload: AgentPayload) -> tuple[str | None, bytes | None, float]:
    """(failure, result, seconds) for one task of the command language."""
    word, _, arg = payload.task.partition(" ")
    if word == "answer":
        return None, arg.encode(), 0.0
    if word == "sleep":
        return None, b"true", float(arg)
    if word == "fail":
        return arg, None, 0.0
    if word == "none":
        return None, None, 0.0
    return None, b"true", 0.0


@dataclass
class FakeEnclaveRunner:
    """The enclave runner's contract with the broker, without an engine."""

    calls: list[AgentPayload] = field(default_factory=list)
    invocations: list[Invocation] = field(default_factory=list)
    reconciled: int = 0
    closed: int = 0
    calls_file: Path | None = None

    def degradations(self) -> tuple[Degradation, ...]:
        return ()

    async def watch(self) -> Degradation:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self.closed += 1

    async def preflight(self) -> None:
        return None

    async def reconcile(self) -> int:
        self.reconciled += 1
        return 0

    async def warm(self, seed_dirs: Iterable[Path]) -> dict[str, bool]:
        del seed_dirs
        return {}

    async def prepare(self, seed_dir: Path, work_root: Path) -> None:
        del seed_dir, work_root

    async def run(self, invocation: Invocation) -> RunReport:
        payload = decode_agent_payload(invocation.script)
        self.calls.append(payload)
        self.invocations.append(invocation)
        if self.calls_file is not None:
            with self.calls_file.open("a", encoding="utf-8") as log:
                log.write(json.dumps({"seed": invocation.seed_dir.name}) + "\n")
        failure, result, seconds = _obey(payload)
        if seconds:
            await trio.sleep(seconds)
        # A decoy in the workspace: a broker that re-read the file would answer it.
        (invocation.workspace / "out").write_bytes(b"false")
        return RunReport(failure=failure, result=None if failure else result)


def fake_enclave_runner_factory(config: object) -> FakeEnclaveRunner:
    """For ``run_server(..., runner_factory=...)`` in the agent test entry point."""
    del config
    calls = os.environ.get(CALLS_ENV)
    return FakeEnclaveRunner(calls_file=Path(calls) if calls else None)
