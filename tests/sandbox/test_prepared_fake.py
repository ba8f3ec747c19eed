"""Prepared containers' control flow (sandbox/prepared_pool.py) against a fake Engine API.

Every test checks what was created was removed: a prepared container serves
one invocation and is gone (with its volume and slot workspace) before
``run`` returns; a failure anywhere is reported, never raised, and leaves
nothing behind.
"""

from __future__ import annotations

import os
from pathlib import Path

import docker.errors
import pytest
import trio

from bounded_query.broker.mounts import unmount
from bounded_query.broker.runner import Invocation
from bounded_query.sandbox import DockerRunner, RunnerOptions
from bounded_query.sandbox.prepared import SlotState
from tests.sandbox.test_runner_fake import FakeAPI, invocation, make

SCRIPT = b"print(1)"


class FakeAttached:
    """The hijacked stdin connection: records what the runner sent."""

    def __init__(self, api: PreparedAPI, cid: str) -> None:
        self.api, self.cid = api, cid
        self._sock = self
        self.data = b""
        self.shut = False
        self.closed = False

    def sendall(self, data: bytes) -> None:
        if self.api.fail_send:
            raise BrokenPipeError("the container's stdin is gone")
        self.data += data

    def shutdown(self, how: int) -> None:
        self.shut = True
        self.api.delivered[self.cid] = self.data

    def close(self) -> None:
        self.closed = True


class PreparedAPI(FakeAPI):
    def __init__(self) -> None:
        super().__init__()
        self.delivered: dict[str, bytes] = {}
        self.attached: list[FakeAttached] = []
        self.fail_attach = False
        self.fail_send = False
        self.bodies: dict[str, dict] = {}
        self.fail_create_prepared = False

    def create_container_from_config(self, body, name):
        if self.fail_create_prepared and body.get("OpenStdin"):
            self.calls.append(("create", name))
            raise docker.errors.APIError("engine refused")
        created = super().create_container_from_config(body, name)
        self.bodies[created["Id"]] = body
        return created

    def attach_socket(self, cid, params=None):
        self.calls.append(("attach", cid))
        assert params == {"stdin": 1, "stream": 1}
        if self.fail_attach:
            raise docker.errors.APIError("attach refused")
        attached = FakeAttached(self, cid)
        self.attached.append(attached)
        return attached

    def wait(self, cid, timeout=None):
        result = super().wait(cid, timeout)
        body = self.bodies.get(cid, {})
        if body.get("OpenStdin") and self.answer is not None:
            # the "script" ran: its answer is in the slot's result file
            source = body["HostConfig"]["Mounts"][1]["Source"]
            Path(source).write_bytes(self.answer)
        return result


@pytest.fixture(autouse=True)
def _unmount_slots(tmp_path):
    """As root a slot workspace is a tmpfs: unmount what a test left prepared."""
    yield
    root = tmp_path / "work"
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith("prep") and child.is_mount():
                unmount(child)


def prepared_runner(*, limit: int | None = None):
    runner, _ = make(options=RunnerOptions(materialize="overlay", pin_page_cache=False))
    api = PreparedAPI()
    runner._client_factory = lambda: api
    runner._client = None
    if limit is not None:
        runner.prepared.limit = limit
    return runner, api


def seed(tmp_path: Path, name: str = "seed") -> Path:
    return tmp_path / name


def work(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    root.mkdir(exist_ok=True)
    return root


def request(tmp_path: Path, name: str, seed_name: str = "seed") -> Invocation:
    """An invocation of ``tmp_path/seed_name`` with its workspace under the work root."""
    made = invocation(work(tmp_path), name)
    return Invocation(made.run_id, name, tmp_path / seed_name, made.workspace, SCRIPT)


def prepared_ids(api: PreparedAPI) -> list[str]:
    return [cid for cid, body in api.bodies.items() if body.get("OpenStdin")]


def assert_nothing_left(runner: DockerRunner, api: PreparedAPI, tmp_path: Path) -> None:
    assert api.containers_alive == set()
    assert [n for n in api.volumes_alive if not n.endswith("-view")] == []
    assert [p.name for p in work(tmp_path).iterdir() if p.name.startswith("prep")] == []
    assert runner.prepared.containers == 0


async def test_a_request_takes_the_prepared_container(tmp_path):
    runner, api = prepared_runner()
    await runner.prepare(seed(tmp_path), work(tmp_path))
    assert runner.prepared.state(seed(tmp_path)) is SlotState.READY
    (cid,) = prepared_ids(api)
    assert cid in api.containers_alive
    slot_dirs = [p for p in work(tmp_path).iterdir() if p.name.startswith("prep")]
    assert len(slot_dirs) == 1
    assert sorted(os.listdir(slot_dirs[0])) == ["out", "upper", "work"]
    assert (slot_dirs[0] / "out").read_bytes() == b""
    assert cid not in api.delivered  # nothing ran before the request
    api.answer = b"true"
    inv = request(tmp_path, "0a")
    creates_before = len([c for c in api.calls if c[0] == "create"])
    report = await runner.run(inv)
    assert report.failure is None, report
    assert api.delivered == {cid: SCRIPT}
    assert api.attached[0].shut
    assert api.attached[0].closed
    # attached at preparation (before the start), not on the request's path
    assert api.calls.index(("attach", cid)) < api.calls.index(("start", cid))
    # no container was created for the request itself
    assert len([c for c in api.calls if c[0] == "create"]) == creates_before
    assert "cold" not in report.phases
    assert {"deliver", "wait", "remove"} <= set(report.phases)
    assert report.result == b"true"
    assert os.listdir(inv.workspace) == []  # the answer is in the report, not a file
    assert runner.prepared.state(seed(tmp_path)) is SlotState.EMPTY
    assert_nothing_left(runner, api, tmp_path)


async def test_without_a_prepared_container_the_request_prepares_one(tmp_path):
    runner, api = prepared_runner()
    api.answer = b"false"
    inv = request(tmp_path, "0b")
    report = await runner.run(inv)
    assert report.failure is None
    assert "cold" in report.phases
    assert "start" in report.phases
    (cid,) = prepared_ids(api)
    assert api.delivered == {cid: SCRIPT}
    assert report.result == b"false"
    assert_nothing_left(runner, api, tmp_path)


async def test_each_container_serves_exactly_one_invocation(tmp_path):
    runner, api = prepared_runner()
    for name in ("01", "02", "03"):
        await runner.prepare(tmp_path / "seed", work(tmp_path))
        assert (await runner.run(request(tmp_path, name))).failure is None
    ids = prepared_ids(api)
    assert len(ids) == 3
    assert sorted(api.delivered) == sorted(ids)  # one delivery each, into a new container
    assert [c for c in api.calls if c[0] == "attach"] == [("attach", cid) for cid in ids]
    assert_nothing_left(runner, api, tmp_path)


async def test_a_failed_delivery_is_a_launch_failure(tmp_path):
    runner, api = prepared_runner()
    await runner.prepare(tmp_path / "seed", work(tmp_path))
    api.fail_send = True
    inv = request(tmp_path, "0c")
    report = await runner.run(inv)
    assert report.failure == "query-launch-failed"
    assert report.result is None  # nothing ran
    assert_nothing_left(runner, api, tmp_path)


@pytest.mark.parametrize(("code", "failure"), [(0, None), (3, "query-nonzero-exit")])
async def test_exit_status_is_classified_as_cold(tmp_path, code, failure):
    runner, api = prepared_runner()
    await runner.prepare(tmp_path / "seed", work(tmp_path))
    api.exit_code = code
    assert (await runner.run(request(tmp_path, "0d"))).failure == failure
    assert_nothing_left(runner, api, tmp_path)


async def test_a_failed_preparation_leaves_nothing_and_the_request_fails_closed(tmp_path):
    runner, api = prepared_runner()
    api.fail_create_prepared = True
    await runner.prepare(tmp_path / "seed", work(tmp_path))
    assert runner.prepared.state(tmp_path / "seed") is SlotState.FAILED
    assert_nothing_left(runner, api, tmp_path)
    report = await runner.run(request(tmp_path, "0e"))
    assert report.failure == "query-launch-failed"
    assert api.delivered == {}
    assert_nothing_left(runner, api, tmp_path)
    api.fail_create_prepared = False  # the next idle moment tries again
    await runner.prepare(tmp_path / "seed", work(tmp_path))
    assert runner.prepared.state(tmp_path / "seed") is SlotState.READY


async def test_a_failed_attach_fails_the_preparation(tmp_path):
    runner, api = prepared_runner()
    api.fail_attach = True
    await runner.prepare(tmp_path / "seed", work(tmp_path))
    assert runner.prepared.state(tmp_path / "seed") is SlotState.FAILED
    assert_nothing_left(runner, api, tmp_path)
    report = await runner.run(request(tmp_path, "12"))
    assert report.failure == "query-launch-failed"
    assert_nothing_left(runner, api, tmp_path)


async def test_a_removal_failure_is_cleanup_failed(tmp_path):
    runner, api = prepared_runner()
    await runner.prepare(tmp_path / "seed", work(tmp_path))
    api.fail_remove = 3
    report = await runner.run(request(tmp_path, "0f"))
    assert report.failure == "cleanup-failed"
    assert runner.prepared.state(tmp_path / "seed") is SlotState.EMPTY


async def test_the_memory_bound_evicts_the_least_recent(tmp_path):
    runner, api = prepared_runner(limit=2)
    for name in ("a", "b", "c"):
        await runner.prepare(tmp_path / name, work(tmp_path))
    states = [runner.prepared.state(tmp_path / n) for n in ("a", "b", "c")]
    assert states == [SlotState.EMPTY, SlotState.READY, SlotState.READY]
    assert len(api.containers_alive) == 2
    assert runner.prepared.containers == 2
    await runner.prepare(tmp_path / "a", work(tmp_path))
    assert runner.prepared.state(tmp_path / "b") is SlotState.EMPTY
    assert len(api.containers_alive) == 2


async def test_preparing_twice_keeps_one_container(tmp_path):
    runner, api = prepared_runner()
    await runner.prepare(tmp_path / "seed", work(tmp_path))
    await runner.prepare(tmp_path / "seed", work(tmp_path))
    assert len(prepared_ids(api)) == 1


async def test_nothing_is_prepared_while_a_query_runs(tmp_path):
    runner, api = prepared_runner()
    with runner.prepared.query_running():
        await runner.prepare(tmp_path / "seed", work(tmp_path))
    assert prepared_ids(api) == []
    assert runner.prepared.state(tmp_path / "seed") is SlotState.EMPTY


async def test_a_request_waits_for_any_preparation_under_way(tmp_path):
    """No query overlaps a preparation, of its own seed or another one."""
    runner, api = prepared_runner()
    gate, reached = trio.Event(), trio.Event()
    order: list[str] = []
    real_start = api.start

    def slow_start(cid):
        if api.bodies[cid].get("OpenStdin"):
            trio.from_thread.run_sync(reached.set)
            trio.from_thread.run(gate.wait)
            order.append("prepared-started")
        real_start(cid)

    api.start = slow_start
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runner.prepare, tmp_path / "other", work(tmp_path))
        await reached.wait()
        assert runner.prepared.state(tmp_path / "other") is SlotState.PREPARING

        async def query() -> None:
            report = await runner.run(request(tmp_path, "10"))
            order.append(f"ran:{report.failure}")

        nursery.start_soon(query)
        await trio.testing.wait_all_tasks_blocked()
        assert api.delivered == {}
        api.start = real_start
        gate.set()
    assert order == ["prepared-started", "ran:None"]
    assert runner.prepared.state(tmp_path / "other") is SlotState.READY


async def test_reconcile_and_close_leave_no_slot(tmp_path):
    runner, api = prepared_runner()
    await runner.prepare(tmp_path / "a", work(tmp_path))
    api.listed = [{"Id": cid} for cid in sorted(api.containers_alive)]
    await runner.reconcile()
    assert runner.prepared.containers == 0
    assert [p for p in work(tmp_path).iterdir() if p.name.startswith("prep")] == []
    await runner.prepare(tmp_path / "b", work(tmp_path))
    assert runner.prepared.containers == 1
    await runner.aclose()
    assert_nothing_left(runner, api, tmp_path)


async def test_cancellation_still_removes(tmp_path, autojump_clock):
    runner, api = prepared_runner()
    await runner.prepare(tmp_path / "seed", work(tmp_path))
    api.block_wait = True
    with trio.move_on_after(5):
        await runner.run(request(tmp_path, "11"))
    assert_nothing_left(runner, api, tmp_path)
