"""The enclave runner end to end: real engine, real proxy, real Claude Code (spec 15.5, 15.6).

Each test drives :class:`EnclaveRunner` as the agent broker does (an
:class:`Invocation` with the encoded payload, an empty 0700 workspace) on the
rig of ``runner_rig.py``: the real API proxy container at its fixed address
on an internal enclave network, the scripted fake Anthropic provider behind
it. The fake answers right only when the marker its tool call printed came
back in a tool result, so an answer proves the engine ran the tool in the
enclave and read the seed. Attacks come from inside the enclave (the
engine's own Bash tool) or from the network around it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from bounded_query.broker.protocol import check_output, parse_schema
from bounded_query.broker.protocol.policy import (
    CATEGORY_ENCLAVE_PROXY,
    CATEGORY_ENCLAVE_TOPOLOGY,
    CATEGORY_NONZERO_EXIT,
    CATEGORY_TIMEOUT,
    ENCLAVE_API_PROXY_ALIAS,
    LABEL_AGENT_RUN,
)
from bounded_query.broker.runner import RunnerUnavailable
from bounded_query.harness.configuration.apiproxy_image import ensure_apiproxy_image
from bounded_query.sandbox import proxy_control
from bounded_query.sandbox.enclave_runner import EnclaveRunner
from tests.enclave.helpers import FAKE_IMAGE, MODEL, TEST_LABEL, TEST_LABEL_VALUE
from tests.enclave.runner_rig import CREDENTIAL, PROXY_IMAGE, PROXY_PORT, ProxyRig, start_proxy_rig

pytestmark = pytest.mark.engine

PROBE = Path(__file__).with_name("probe.py")
SCHEMA = {"type": "object", "fields": {"found": {"type": "boolean"}}}
ANSWER = '```json\n{"found": true}\n```'
PHASES = {"prepare", "arm", "topology", "create", "start", "engine", "remove", "disarm", "result"}


def _script(marker: str, command: str, answer: str = ANSWER) -> dict[str, str]:
    return {"command": command, "marker": marker, "answer": answer, "wrong_answer": "null"}


@pytest.fixture(scope="module")
def proxy_rig(enclave_engine) -> Iterator[ProxyRig]:
    """The real proxy at its address on an enclave network of our own (built if stale)."""
    ensure_apiproxy_image("unix:///var/run/docker.sock", tag=PROXY_IMAGE)
    made = start_proxy_rig(enclave_engine)
    yield made
    made.close()


@pytest.fixture
async def make_runner(proxy_rig: ProxyRig) -> AsyncIterator[Callable[..., EnclaveRunner]]:
    """Runners for one test; each is reconciled (its enclaves removed) and closed afterwards."""
    made: list[EnclaveRunner] = []

    def make(**changes: Any) -> EnclaveRunner:
        settings = changes.pop("settings", None)
        runner = proxy_rig.runner(settings, **changes)
        made.append(runner)
        return runner

    yield make
    for runner in made:
        await runner.reconcile()
        await runner.aclose()


async def _status(rig: ProxyRig) -> proxy_control.ControlAnswer:
    return await proxy_control.status(rig.control_socket)


def _check_upstream(records: list[dict[str, Any]]) -> None:
    """The fake saw Messages requests only, each with the real credential and nothing else."""
    assert records, "the engine sent no request"
    for entry in records:
        assert (entry["method"], entry["path"].split("?")[0]) == ("POST", "/v1/messages")
        assert entry["model"] == MODEL
        headers = {k.lower(): v for k, v in entry["headers"]}
        assert headers["x-api-key"] == CREDENTIAL
        assert "authorization" not in headers
        assert headers["host"] == f"provider:{PROXY_PORT}"


async def test_a_run_answers_through_the_real_proxy(
    proxy_rig: ProxyRig, make_runner: Callable[..., EnclaveRunner]
) -> None:
    runner = make_runner()
    await runner.preflight()
    assert runner.expected.proxy_id == proxy_rig.proxy_id
    marker = secrets.token_hex(12)
    seed = proxy_rig.seed({"marker.txt": marker + "\n"})
    # The engine's tool also prints the placeholder it holds: the attacker's view of it.
    proxy_rig.set_script(_script(marker, "cat marker.txt; echo key=$ANTHROPIC_API_KEY"))
    invocation = proxy_rig.invocation(runner, seed, "Does marker.txt hold a marker?", SCHEMA)
    report = await runner.run(invocation)
    assert report.failure is None, runner.last_logs.decode()[-2000:]
    assert report.result is not None
    assert check_output(report.result, parse_schema(SCHEMA)) == '{"found":true}'
    assert set(report.phases) == PHASES
    records = proxy_rig.records()
    assert [e["reply"] for e in records] == ["tool_use", "end_turn"]
    _check_upstream(records)
    (placeholder,) = re.findall(r"key=([0-9a-f]+)", records[-1]["tool_results"][-1])
    assert len(placeholder) == 64
    assert placeholder != CREDENTIAL
    assert all(placeholder not in json.dumps(e["headers"]) for e in records)
    assert proxy_rig.run_containers(runner.settings.run_id) == []
    state = await _status(proxy_rig)
    assert (state.armed, state.invocation) == (False, None)
    # the invocation id is spent: it can never arm the proxy again
    again = await proxy_control.arm(
        proxy_rig.control_socket, invocation.invocation_id, secrets.token_hex(32)
    )
    assert (again.accepted, again.outcome) == (False, "invocation-spent")
    # the workspace holds only the planned files, with their modes
    modes = {p.name: stat.S_IMODE(p.lstat().st_mode) for p in invocation.workspace.iterdir()}
    assert modes == {
        "task.txt": 0o444,
        "schema.json": 0o444,
        "result.json": 0o600,
        "hosts": 0o444,
        "resolv.conf": 0o444,
    }
    assert (invocation.workspace / "result.json").stat().st_uid == 65534


async def test_a_later_invocation_sees_nothing_of_an_earlier_one(
    proxy_rig: ProxyRig, make_runner: Callable[..., EnclaveRunner]
) -> None:
    runner = make_runner()
    await runner.preflight()
    marker = secrets.token_hex(12)
    secret_task = f"first task {secrets.token_hex(8)}"
    leave = (
        "echo key=$ANTHROPIC_API_KEY; echo left > /tmp/left-by-first;"
        " mkdir -p /agent/home/left-dir; echo left > /agent/home/left-dir/left-by-first;"
        " cat marker.txt"
    )
    proxy_rig.set_script(_script(marker, leave))
    first = proxy_rig.invocation(
        runner, proxy_rig.seed({"marker.txt": marker}), secret_task, SCHEMA
    )
    report = await runner.run(first)
    assert report.failure is None, runner.last_logs.decode()[-2000:]
    (old_key,) = re.findall(r"key=([0-9a-f]+)", proxy_rig.records()[-1]["tool_results"][-1])

    marker = secrets.token_hex(12)
    address = f"{ENCLAVE_API_PROXY_ALIAS}:{PROXY_PORT}"
    command = f"python3 probe.py --later {address} {MODEL} {old_key} {marker}"
    proxy_rig.set_script(_script(marker, command))
    seed = proxy_rig.seed({"probe.py": PROBE.read_text()})
    second = proxy_rig.invocation(runner, seed, "second task", SECOND_SCHEMA)
    report = await runner.run(second)
    assert report.failure is None, runner.last_logs.decode()[-2000:]
    output = proxy_rig.records()[-1]["tool_results"][-1]
    found = json.loads(next(line for line in output.splitlines() if line.startswith("{")))
    assert found["task"] == "second task"
    assert json.loads(found["schema"]) == SECOND_SCHEMA
    assert found["result"] == ""  # the earlier answer is not there
    assert not [p for p in found["paths"] if "left" in p], found["paths"]
    assert found["old_key"].split()[1] in ("401", "403"), found["old_key"]
    assert found["own_key"].split()[1] == "200", found["own_key"]  # the control
    assert secret_task not in json.dumps(proxy_rig.records())


SECOND_SCHEMA = {
    "type": "object",
    "fields": {"found": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 3}},
}


BAD_RESULTS = [
    # (id, command before the marker, final answer, options, failure, result)
    (
        "bash-writes-non-json-and-no-answer",
        "printf 'not json' > /agent/result.json",
        "I think it is true.",
        {},
        CATEGORY_NONZERO_EXIT,
        None,
    ),
    (
        "bash-writes-oversize-and-no-answer",
        "head -c 20000 /dev/zero | tr '\\0' 1 > /agent/result.json",
        "I think it is true.",
        {},
        CATEGORY_NONZERO_EXIT,
        None,
    ),
    (
        "answer-over-max-output-bytes",
        "true",
        '{"found": true, "padding": "' + "x" * 40 + '"}',
        {"max_output_bytes": 32},
        None,
        None,
    ),
    (
        "bash-cannot-replace-the-result-by-a-symlink",
        "ln -sfn /etc/passwd /agent/result.json; echo ln=$?; rm -f /agent/result.json; echo rm=$?",
        ANSWER,
        {},
        None,
        b'{"found": true}',
    ),
]


@pytest.mark.parametrize(
    ("command", "answer", "changes", "failure", "result"),
    [case[1:] for case in BAD_RESULTS],
    ids=[case[0] for case in BAD_RESULTS],
)
async def test_a_bad_result_gives_no_answer(
    proxy_rig: ProxyRig,
    make_runner: Callable[..., EnclaveRunner],
    command: str,
    answer: str,
    changes: dict[str, Any],
    failure: str | None,
    result: bytes | None,
) -> None:
    runner = make_runner(**changes)
    marker = secrets.token_hex(12)
    proxy_rig.set_script(_script(marker, f"{command}; cat marker.txt", answer))
    seed = proxy_rig.seed({"marker.txt": marker})
    invocation = proxy_rig.invocation(runner, seed, "Does marker.txt hold a marker?", SCHEMA)
    report = await runner.run(invocation)
    assert (report.failure, report.result) == (failure, result), runner.last_logs[-2000:]
    assert marker in proxy_rig.records()[-1]["tool_results"][-1]
    info = (invocation.workspace / "result.json").lstat()
    assert stat.S_ISREG(info.st_mode)
    if "ln=" in command:
        output = proxy_rig.records()[-1]["tool_results"][-1]
        assert "ln=1" in output, output
        assert "rm=1" in output, output
    assert proxy_rig.run_containers(runner.settings.run_id) == []
    assert not (await _status(proxy_rig)).armed


async def test_a_timeout_kills_and_removes_the_enclave(
    proxy_rig: ProxyRig, make_runner: Callable[..., EnclaveRunner]
) -> None:
    runner = make_runner(settings=proxy_rig.settings(timeout_s=4))
    marker = secrets.token_hex(12)
    proxy_rig.set_script(
        _script(marker, "python3 -c 'import time; time.sleep(100)'; cat marker.txt")
    )
    seed = proxy_rig.seed({"marker.txt": marker})
    invocation = proxy_rig.invocation(runner, seed, "Does marker.txt hold a marker?", SCHEMA)
    started = time.monotonic()
    report = await runner.run(invocation)
    assert (report.failure, report.result) == (CATEGORY_TIMEOUT, None)
    assert time.monotonic() - started < 30
    assert 4 <= report.phases["engine"] < 10
    assert proxy_rig.run_containers(runner.settings.run_id) == []
    assert not (await _status(proxy_rig)).armed
    assert all(not e["tool_results"] for e in proxy_rig.records())  # it never answered


async def _refused_without_a_container(rig: ProxyRig, runner: EnclaveRunner, category: str) -> None:
    since = time.time()
    marker = secrets.token_hex(12)
    rig.set_script(_script(marker, "cat marker.txt"))
    invocation = rig.invocation(runner, rig.seed({"marker.txt": marker}), "task", SCHEMA)
    report = await runner.run(invocation)
    assert (report.failure, report.result) == (category, None)
    assert "create" not in report.phases
    assert rig.records() == []
    assert rig.created_since(since, runner.settings.run_id) == []
    assert rig.run_containers(runner.settings.run_id) == []


async def test_a_changed_topology_refuses_the_launch(
    proxy_rig: ProxyRig, make_runner: Callable[..., EnclaveRunner]
) -> None:
    runner = make_runner()
    await runner.preflight()
    subnet = proxy_rig.proxy_address.rsplit(".", 1)[0]
    # a stranger on the enclave network (it could talk to the enclave and the proxy)
    stranger = proxy_rig.extra_member(f"{subnet}.9")
    try:
        await _refused_without_a_container(proxy_rig, runner, CATEGORY_ENCLAVE_TOPOLOGY)
        assert not (await _status(proxy_rig)).armed
    finally:
        proxy_rig.remove(stranger)
    # the proxy gone from the network, then a stranger at its address
    proxy_rig.detach_proxy()
    try:
        await _refused_without_a_container(proxy_rig, runner, CATEGORY_ENCLAVE_TOPOLOGY)
        impostor = proxy_rig.extra_member(proxy_rig.proxy_address)
        try:
            await _refused_without_a_container(proxy_rig, runner, CATEGORY_ENCLAVE_TOPOLOGY)
        finally:
            proxy_rig.remove(impostor)
    finally:
        proxy_rig.attach_proxy()
    assert not (await _status(proxy_rig)).armed


async def test_after_a_failed_disarm_nothing_launches_until_the_proxy_is_disarmed(
    proxy_rig: ProxyRig, make_runner: Callable[..., EnclaveRunner]
) -> None:
    """The control socket vanishes mid-run: the run fails, the next refuses, then recovery."""
    runner = make_runner()
    run_id = runner.settings.run_id
    moved = proxy_rig.control_socket.with_name("control.sock.away")
    marker = secrets.token_hex(12)
    proxy_rig.set_script(_script(marker, "sleep 2; cat marker.txt"))
    first = proxy_rig.invocation(runner, proxy_rig.seed({"marker.txt": marker}), "t", SCHEMA)

    async def hide_socket_once_launched() -> None:
        with trio.fail_after(60):
            while not await trio.to_thread.run_sync(proxy_rig.run_containers, run_id):  # noqa: ASYNC110 - polling the engine, not a trio task
                await trio.sleep(0.05)
        os.rename(proxy_rig.control_socket, moved)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hide_socket_once_launched)
            report = await runner.run(first)
        assert (report.failure, report.result) == (CATEGORY_ENCLAVE_PROXY, None)
        assert runner.pending_disarm == first.invocation_id
        state = await proxy_control.status(moved)
        assert (state.armed, state.invocation) == (True, first.invocation_id)
        await _refused_without_a_container(proxy_rig, runner, CATEGORY_ENCLAVE_PROXY)
        assert (await proxy_control.status(moved)).armed
    finally:
        os.rename(moved, proxy_rig.control_socket)
    marker = secrets.token_hex(12)
    proxy_rig.set_script(_script(marker, "cat marker.txt"))
    third = proxy_rig.invocation(runner, proxy_rig.seed({"marker.txt": marker}), "t", SCHEMA)
    report = await runner.run(third)
    assert report.failure is None, runner.last_logs[-2000:]
    assert report.result == b'{"found": true}'
    assert runner.pending_disarm is None
    assert not (await _status(proxy_rig)).armed


async def test_reconcile_removes_only_this_runs_enclaves(
    proxy_rig: ProxyRig, make_runner: Callable[..., EnclaveRunner]
) -> None:
    runner = make_runner()
    other = proxy_rig.settings().run_id
    api = proxy_rig.client.api
    made = []
    for labels in (
        {LABEL_AGENT_RUN: runner.settings.run_id},
        {LABEL_AGENT_RUN: other},
        {},
    ):
        cid = api.create_container(
            FAKE_IMAGE,
            entrypoint=["/bin/sleep", "300"],
            labels={TEST_LABEL: TEST_LABEL_VALUE, **labels},
            host_config=api.create_host_config(network_mode="none"),
        )["Id"]
        proxy_rig.extra_containers.append(cid)
        api.start(cid)
        made.append(cid)
    assert await runner.reconcile() == 1
    alive = {c["Id"] for c in api.containers(all=True)}
    assert made[0] not in alive
    assert {made[1], made[2]} <= alive
    assert await runner.reconcile() == 0


async def test_preflight_fails_closed_with_the_operators_reason(
    proxy_rig: ProxyRig, make_runner: Callable[..., EnclaveRunner]
) -> None:
    cases: list[tuple[EnclaveRunner, str]] = [
        (make_runner(settings=proxy_rig.settings(image="bq-no-such-image:latest")), "never pulled"),
        (make_runner(settings=proxy_rig.settings(image=FAKE_IMAGE)), "labelled for engine None"),
        (make_runner(network="bq-no-such-network"), "bq-no-such-network"),
        (make_runner(control_socket=proxy_rig.root / "nothing.sock"), "control socket"),
        # gVisor with networking cannot start a container here: no fallback to runc
        (make_runner(settings=proxy_rig.settings("gvisor")), "runsc-net"),
    ]
    for runner, reason in cases:
        with pytest.raises(RunnerUnavailable, match=re.escape(reason)):
            await runner.preflight()
        assert proxy_rig.run_containers(runner.settings.run_id) == []
    runner = make_runner()
    invocation = secrets.token_hex(16)
    armed = await proxy_control.arm(proxy_rig.control_socket, invocation, secrets.token_hex(32))
    assert armed.accepted
    try:
        with pytest.raises(RunnerUnavailable, match="already armed"):
            await runner.preflight()
    finally:
        await proxy_control.disarm(proxy_rig.control_socket, invocation)
    await runner.preflight()
