"""The enclave runner's trio layer without an engine: a fake Engine API, the real proxy control.

The fake (:class:`FakeEngine`) is an in-memory Engine API with the few calls
the runner makes (the docker SDK ``APIClient`` method names); each test can
make one call fail or an enclave never exit. The API proxy is the real one,
in-process (``tests/apiproxy/helpers.running_proxy``), so arming and
disarming are real. Time is trio's autojump clock: a timeout costs nothing.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import trio

from bounded_query.broker.agent_payload import AgentPayload, encode_agent_payload
from bounded_query.broker.protocol import policy
from bounded_query.broker.runner import EnclaveOptions, Invocation, RunnerSettings
from bounded_query.sandbox import proxy_control
from bounded_query.sandbox.enclave_plan import INHIBIT_IPV4_OPTION
from bounded_query.sandbox.enclave_runner import EnclaveRunner
from tests.apiproxy.helpers import running_proxy

RUN_ID = "0123456789abcdef" * 2
NETWORK = "awf-bounded-agent-unit"
PROXY_ADDRESS = "10.88.0.2"
PROXY_ID = "p" * 64


class FakeEngine:
    """An in-memory Engine API: one network with the proxy, the containers the runner makes."""

    def __init__(self) -> None:
        self.containers: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.fail: set[str] = set()
        self.exit_code: int | None = 0  # None: the enclave never exits by itself
        self.members: dict[str, dict[str, str]] = {
            PROXY_ID: {"IPv4Address": f"{PROXY_ADDRESS}/24", "IPv6Address": ""}
        }
        self._lock = threading.Lock()

    def _call(self, name: str) -> None:
        with self._lock:
            self.calls.append(name)
        if name in self.fail:
            raise docker.errors.APIError(f"{name} refused by the fake engine")

    def _get(self, ident: str) -> dict[str, Any]:
        for cid, container in self.containers.items():
            if ident in (cid, container["name"]):
                return container
        raise docker.errors.NotFound(f"no such container {ident}")

    def inspect_network(self, name: str) -> dict[str, Any]:
        self._call("inspect_network")
        return {
            "Name": NETWORK,
            "Id": "n" * 64,
            "Driver": "bridge",
            "Internal": True,
            "EnableIPv6": False,
            "Options": {INHIBIT_IPV4_OPTION: "true"},
            "Containers": dict(self.members),
        }

    def create_container_from_config(self, body: dict[str, Any], name: str) -> dict[str, str]:
        self._call("create")
        cid = f"{len(self.containers):064x}"
        exited = threading.Event()
        self.containers[cid] = {"id": cid, "name": name, "exited": exited, "code": None}
        return {"Id": cid}

    def start(self, ident: str) -> None:
        self._call("start")
        container = self._get(ident)
        self.members[container["id"]] = {"IPv4Address": "10.88.0.3/24"}
        if self.exit_code is not None:
            container["code"] = self.exit_code
            container["exited"].set()

    def wait(self, ident: str, timeout: float | None = None) -> dict[str, int]:
        self._call("wait")
        container = self._get(ident)
        container["exited"].wait()
        return {"StatusCode": container["code"] if container["code"] is not None else 137}

    def kill(self, ident: str) -> None:
        self._call("kill")
        container = self._get(ident)
        container["code"] = 137
        container["exited"].set()

    def inspect_container(self, ident: str) -> dict[str, Any]:
        container = self._get(ident)
        return {"State": {"ExitCode": container["code"], "OOMKilled": False}}

    def remove_container(self, ident: str, v: bool = False, force: bool = False) -> None:
        self._call("remove")
        container = self._get(ident)
        container["exited"].set()
        self.members.pop(container["id"], None)
        del self.containers[container["id"]]

    def close(self) -> None:
        self.calls.append("close")


SETTINGS = RunnerSettings("docker", RUN_ID, policy.ENCLAVE_IMAGES["claude"], 30, 512 * 1024**2)


def _runner(fake: FakeEngine, control_socket: Path) -> EnclaveRunner:
    options = EnclaveOptions(
        engine="claude",
        model="claude-test-model",
        network=NETWORK,
        proxy_address=PROXY_ADDRESS,
        proxy_port=8080,
        control_socket=control_socket,
        nano_cpus=1_000_000_000,
        pids_limit=policy.ENCLAVE_PIDS_LIMIT,
        tmpfs_bytes=policy.ENCLAVE_TMPFS_BYTES,
        max_output_bytes=policy.ENCLAVE_MAX_OUTPUT_BYTES,
        max_task_bytes=4096,
    )
    return EnclaveRunner(SETTINGS, options, client_factory=lambda: fake)


def _invocation(tmp: Path, script: bytes | None = None) -> Invocation:
    workspace = tmp / f"ws-{len(list(tmp.iterdir()))}"
    workspace.mkdir(mode=0o700)
    payload = AgentPayload(task="t", schema='{"type":"boolean"}')
    return Invocation(
        run_id=RUN_ID,
        invocation_id="ab" * 16,
        seed_dir=tmp,
        workspace=workspace,
        script=encode_agent_payload(payload) if script is None else script,
    )


async def _disarmed(path: Path) -> bool:
    return not (await proxy_control.status(path)).armed


async def test_a_clean_run_reads_the_answer_after_removal(tmp_path: Path) -> None:
    fake = FakeEngine()
    async with running_proxy(tmp_path / "proxy") as proxy:
        runner = _runner(fake, proxy.config.control_socket)
        invocation = _invocation(tmp_path)
        # what the enclave would have written through its bind mount
        original_start = fake.start

        def start_and_answer(ident: str) -> None:
            (invocation.workspace / "result.json").write_bytes(b"true")
            original_start(ident)

        fake.start = start_and_answer  # type: ignore[method-assign]
        report = await runner.run(invocation)
        assert (report.failure, report.result) == (None, b"true")
        assert fake.containers == {}
        assert fake.calls.index("remove") > fake.calls.index("wait")
        assert await _disarmed(proxy.config.control_socket)


@pytest.mark.parametrize(
    ("failing", "category"),
    [
        ("create", policy.CATEGORY_LAUNCH_FAILED),
        ("start", policy.CATEGORY_LAUNCH_FAILED),
        ("inspect_network", policy.CATEGORY_RUNNER_INTERNAL),
        ("remove", policy.CATEGORY_CLEANUP_FAILED),
    ],
)
async def test_an_engine_failure_is_reported_and_the_proxy_disarmed(
    tmp_path: Path, failing: str, category: str
) -> None:
    fake = FakeEngine()
    fake.fail.add(failing)
    async with running_proxy(tmp_path / "proxy") as proxy:
        runner = _runner(fake, proxy.config.control_socket)
        report = await runner.run(_invocation(tmp_path))
        assert (report.failure, report.result) == (category, None)
        if failing == "inspect_network":
            assert "create" not in fake.calls
        if failing != "remove":
            assert fake.containers == {}
        assert await _disarmed(proxy.config.control_socket)
        assert runner.pending_disarm is None


async def test_a_timeout_kills_and_removes(tmp_path: Path, autojump_clock) -> None:
    fake = FakeEngine()
    fake.exit_code = None
    async with running_proxy(tmp_path / "proxy") as proxy:
        runner = _runner(fake, proxy.config.control_socket)
        started = trio.current_time()
        report = await runner.run(_invocation(tmp_path))
        assert (report.failure, report.result) == (policy.CATEGORY_TIMEOUT, None)
        assert trio.current_time() - started >= SETTINGS.timeout_s
        assert "kill" in fake.calls
        assert fake.containers == {}
        assert await _disarmed(proxy.config.control_socket)


async def test_a_cancelled_run_still_removes_and_disarms(tmp_path: Path) -> None:
    """The broker shutting down mid-invocation: the shielded cleanup runs to the end."""
    fake = FakeEngine()
    fake.exit_code = None
    original_wait = fake.wait
    async with running_proxy(tmp_path / "proxy") as proxy:
        runner = _runner(fake, proxy.config.control_socket)
        with trio.CancelScope() as scope:

            def wait_then_shut_down(ident: str, timeout: float | None = None) -> dict[str, int]:
                trio.from_thread.run_sync(scope.cancel)
                return original_wait(ident, timeout)

            fake.wait = wait_then_shut_down  # type: ignore[method-assign]
            await runner.run(_invocation(tmp_path))
        assert scope.cancelled_caught
        assert "wait" in fake.calls
        assert fake.containers == {}
        assert await _disarmed(proxy.config.control_socket)


async def test_a_payload_that_is_not_one_launches_nothing(tmp_path: Path) -> None:
    fake = FakeEngine()
    async with running_proxy(tmp_path / "proxy") as proxy:
        runner = _runner(fake, proxy.config.control_socket)
        report = await runner.run(_invocation(tmp_path, b"print('a script')"))
        assert report.failure == policy.CATEGORY_RUNNER_INTERNAL
        assert fake.calls == []
        assert await _disarmed(proxy.config.control_socket)


async def test_an_enclave_that_joined_late_is_caught_by_the_second_check(tmp_path: Path) -> None:
    fake = FakeEngine()
    original_start = fake.start

    def start_with_a_stranger(ident: str) -> None:
        original_start(ident)
        fake.members["s" * 64] = {"IPv4Address": "10.88.0.9/24"}

    fake.start = start_with_a_stranger  # type: ignore[method-assign]
    async with running_proxy(tmp_path / "proxy") as proxy:
        runner = _runner(fake, proxy.config.control_socket)
        report = await runner.run(_invocation(tmp_path))
        assert (report.failure, report.result) == (policy.CATEGORY_ENCLAVE_TOPOLOGY, None)
        assert "wait" not in fake.calls
        assert fake.containers == {}
        assert await _disarmed(proxy.config.control_socket)


async def test_aclose_closes_the_client_once(tmp_path: Path) -> None:
    fake = FakeEngine()
    runner = _runner(fake, tmp_path / "none.sock")
    assert runner.api is fake
    await runner.aclose()
    await runner.aclose()
    assert fake.calls == ["close"]
    assert runner.degradations() == ()
    assert await runner.warm([tmp_path]) == {}
    with trio.move_on_after(1) as scope:
        await runner.watch()
    assert scope.cancelled_caught
