"""Prepared query containers: one per repository, started while the lane is idle.

Theory of operation (spec 14.7; the slot life cycle is the table of
:mod:`.prepared`): a trivial query's time is mostly container start. So,
after an answer has left (the lane's idle hook,
:meth:`PreparedPool.prepare`) and at broker start-up, the runner prepares
the *next* invocation's container of that repository: a fresh slot workspace
of its own (its own tmpfs, ``sandbox/storage.py``, with the result file and
the overlay's upper and work directories), the per-invocation copy-on-write
overlay volume, and the container itself, created and started with the
launcher of ``sandbox/launcher.py`` blocked on stdin, to which the runner
attaches. A request takes its repository's ready container
(:meth:`PreparedPool.run`), sends the script on the attached stdin and
closes it, waits for the exit and destroys container, volume and slot
storage exactly like a cold run, before the broker picks the bucket; the
answer is moved into the invocation's workspace. A container serves exactly
one invocation and nothing of an earlier one is in it: everything it holds
was created at its preparation, from trusted values only
(:func:`~bounded_query.sandbox.spec.prepared_spec`), and the preparation
starts only after the previous answer left, whatever that query did.

Without a ready container (first use, the memory bound, a failed
preparation) the request prepares one on the spot and runs in it the same
way: the script sees the same layout either way, so whether a container was
waiting is no bit the script can read from its file system.

Channels (README, "Prepared containers"). A prepared container exists while
other invocations run, so two rules keep it out of them:

* *a preparation never overlaps a query*: it starts only after an answer
  has left (the broker's idle hook), and a request that arrives while one
  is under way (for any repository) waits for it inside its own lane time,
  which the bucket covers. So no query can slow or shape another
  repository's preparation, and no preparation shifts a query's timing
  outside its bucket;
* a slot is only ever prepared for the repository whose answer just left
  (or at start-up), and only that repository's next query takes it.

What the script can still read is *when* its container was prepared: the
launcher's start time (``/proc/1/stat``), the creation times of ``/dev``
nodes and of the engine's ``/etc/hostname``, the mount times of its tmpfs
roots, and under gVisor the sandbox's boot clock. That moment is the
previous answer's boundary of the same repository (a moment the agent
already knows) plus the idle preparation's own latency; the channel suite
measures that the previous query cannot modulate it
(``tests/sandbox/channels.py``, "prepared container age").

Never raises for an engine failure: a preparation that fails leaves the slot
``FAILED`` (the next request prepares on demand); a delivery that fails is
``query-launch-failed``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from bounded_query.broker.mounts import mount_tmpfs, unmount
from bounded_query.broker.protocol.policy import QUERY_GID, QUERY_UID
from bounded_query.broker.runner import RESULT_FILE_NAME, Invocation, RunReport
from bounded_query.broker.workspace import make_workspace, read_result_file, remove_tree

from .overlay import invocation_volume
from .phases import PhaseClock
from .prepared import MAX_PREPARED_SLOTS, SlotEvent, SlotState, evictions, step
from .spec import container_name, prepared_spec, translate_host_path
from .storage import tmpfs_quota

if TYPE_CHECKING:
    from .docker_runner import DockerRunner

__all__ = ["PreparedPool", "launcher_source", "prepare_slot_workspace"]

#: Slot workspaces and containers are named with this prefix and a random id
#: (an invocation id is plain hex, so the two never collide).
SLOT_PREFIX = "prep"
#: Overlay directories inside a slot workspace (as in a cold workspace).
UPPER_DIR_NAME = "upper"
WORK_DIR_NAME = "work"


def launcher_source() -> str:
    """The source text of ``sandbox/launcher.py``, sent as the container's ``-c`` argument."""
    return resources.files("bounded_query.sandbox").joinpath("launcher.py").read_text("utf-8")


def prepare_slot_workspace(workspace: Path, memory_bytes: int) -> bool:
    """Create a slot's workspace: own tmpfs, result file, overlay dirs; True when isolated.

    The same entries in the same order for every slot, so inode numbers and
    free-space figures a query starts with never vary (``storage.py``).
    Without mount privilege the workspace stays a plain directory (False).

    Raises:
        OSError: the workspace exists already or cannot be prepared.
    """
    make_workspace(workspace)
    try:
        mount_tmpfs(workspace, tmpfs_quota(memory_bytes).options)
        isolated = True
    except PermissionError:
        isolated = False
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(workspace / RESULT_FILE_NAME, flags, 0o600)
    try:
        try:
            os.fchown(fd, QUERY_UID, QUERY_GID)
        except PermissionError:
            os.fchmod(fd, 0o666)
    finally:
        os.close(fd)
    upper = workspace / UPPER_DIR_NAME
    os.mkdir(upper, 0o755)
    try:
        os.chown(upper, QUERY_UID, QUERY_GID, follow_symlinks=False)
    except PermissionError:
        os.chmod(upper, 0o777)
    os.mkdir(workspace / WORK_DIR_NAME, 0o700)
    return isolated


def release_slot_workspace(
    workspace: Path, isolated: bool, *, read_answer: bool
) -> tuple[bool, bytes | None]:
    """Remove a slot's workspace (after its container and volume): (whether it is
    gone, the answer).

    With ``read_answer`` (the slot served an invocation), the answer is the
    result file as the checked reader returns it (None when it refuses it),
    read before the storage goes; otherwise nothing is read.
    """
    answer = read_result_file(workspace / RESULT_FILE_NAME) if read_answer else None
    if isolated:
        try:
            unmount(workspace)
        except OSError:
            return False, None
    if not remove_tree(workspace):
        return False, None
    return True, answer


def _attach(api: Any, container_id: str) -> Any:
    """Attach to the container's stdin (at preparation: off the answer's path)."""
    return api.attach_socket(container_id, params={"stdin": 1, "stream": 1})


def _deliver(attached: Any, script: bytes) -> None:
    """Send the script on the attached stdin and close our sending side (EOF).

    The connection itself stays open until the container exited (the
    caller closes it): closing a hijacked connection early could cut data
    dockerd has not copied yet.
    """
    raw = _raw_socket(attached)
    raw.sendall(script)
    raw.shutdown(socket.SHUT_WR)


def _raw_socket(attached: Any) -> Any:
    """The socket under the SDK's hijacked-connection wrapper (``SocketIO``)."""
    return getattr(attached, "_sock", attached)


def _close_attached(attached: Any) -> None:
    """Close the wrapper and the socket under it (the wrapper alone leaves it open)."""
    for closable in (attached, _raw_socket(attached)):
        with contextlib.suppress(OSError):
            closable.close()


#: How long :meth:`PreparedPool.aclose` waits for a preparation under way
#: (create and start take well under a second; the engine's own timeouts
#: bound the rest).
PREPARING_WAIT_S = 30.0


@dataclass(eq=False)
class _Slot:
    """One repository's prepared container and the resources it holds."""

    slot_id: str
    workspace: Path
    state: SlotState = SlotState.EMPTY
    isolated: bool = False
    volume: str | None = None
    container_id: str | None = None
    #: The SDK's hijacked connection to the container's stdin (attached at preparation).
    attached: Any = None
    #: Seconds of each preparation step (``storage``, ``volume``, ``create``, ``start``).
    phases: dict[str, float] = field(default_factory=dict)
    #: Set when the preparation ended (ready or failed).
    done: trio.Event = field(default_factory=trio.Event)

    def move(self, event: SlotEvent) -> None:
        self.state = step(self.state, event)


class PreparedPool:
    """The prepared slots of one :class:`~.docker_runner.DockerRunner` (module docstring).

    Part of the runner: it drives the engine through the runner's own
    helpers (client, volume and container removal, the wait for exit).
    """

    def __init__(self, runner: DockerRunner, *, limit: int = MAX_PREPARED_SLOTS) -> None:
        self._runner = runner
        self.limit = limit
        #: seed host path -> its slot
        self._slots: dict[str, _Slot] = {}
        #: seed host paths, least recently prepared for first
        self._recency: list[str] = []
        self._launcher = launcher_source()
        #: queries in the runner right now (:meth:`query_running`)
        self.queries_running = 0

    @contextlib.contextmanager
    def query_running(self) -> Iterator[None]:
        """Mark a query as running (any path of the runner): no preparation starts meanwhile."""
        self.queries_running += 1
        try:
            yield
        finally:
            self.queries_running -= 1

    def state(self, seed_dir: Path) -> SlotState:
        """The slot state of a seed (EMPTY when it has none); for tests and benchmarks."""
        seed_host = translate_host_path(str(seed_dir), self._runner.settings.host_path_map)
        slot = self._slots.get(seed_host)
        return SlotState.EMPTY if slot is None else slot.state

    @property
    def containers(self) -> int:
        """How many slots hold (or are about to hold) a container."""
        holding = (SlotState.PREPARING, SlotState.READY, SlotState.TAKEN)
        return sum(1 for slot in self._slots.values() if slot.state in holding)

    # -- preparing ---------------------------------------------------------

    async def prepare(self, seed_dir: Path, work_root: Path) -> None:
        """Prepare the seed's next container unless one is ready or on its way.

        The idle hook: called after an answer of that seed has left, and at
        start-up. Evicts the least recently prepared ready containers beyond
        the memory bound first. Never raises for an engine or storage fault.
        """
        runner = self._runner
        seed_host = translate_host_path(str(seed_dir), runner.settings.host_path_map)
        view = await runner._ensure_view(seed_host)
        if view is None:
            return  # no copy-on-write view: this seed runs cold (tmpfs copy)
        if not self._may_prepare(seed_host):
            return
        states = {key: slot.state for key, slot in self._slots.items()}
        states[seed_host] = SlotState.PREPARING
        order = [key for key in self._recency if key != seed_host] + [seed_host]
        for key in evictions(order, states, self.limit):
            await self._discard(key)
        if self._may_prepare(seed_host):  # again: a request may have come meanwhile
            await self._prepare(seed_host, view, work_root)

    def _may_prepare(self, seed_host: str) -> bool:
        """No container ready or on its way for the seed, and no query running.

        A request that took the lane meanwhile wins: never prepare during a
        query (module docstring); that seed's next query prepares on demand.
        """
        current = self._slots.get(seed_host)
        if current is not None and current.state not in (SlotState.EMPTY, SlotState.FAILED):
            return False
        return not self.queries_running

    async def _prepare(self, seed_host: str, view: str, work_root: Path) -> _Slot:
        """Register a new slot for ``seed_host`` and prepare it (READY or FAILED)."""
        slot_id = f"{SLOT_PREFIX}{secrets.token_hex(16)}"
        slot = _Slot(slot_id, work_root / slot_id)
        slot.move(SlotEvent.BEGIN)
        self._slots[seed_host] = slot
        with contextlib.suppress(ValueError):
            self._recency.remove(seed_host)
        self._recency.append(seed_host)
        try:
            await self._build(slot, seed_host, view)
        except Exception:
            # e.g. the view volume was removed behind our back: prepare it
            # again for the next attempt (as the cold path does)
            self._runner._views.pop(seed_host, None)
            with trio.CancelScope(shield=True):
                await self._destroy(slot, read_answer=False)
            slot.move(SlotEvent.FAIL)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._destroy(slot, read_answer=False)
            slot.move(SlotEvent.FAIL)
            raise
        else:
            slot.move(SlotEvent.SUCCEED)
        finally:
            slot.done.set()
        return slot

    async def _build(self, slot: _Slot, seed_host: str, view: str) -> None:
        """Storage, overlay volume, container create and start; raises on any fault."""
        runner = self._runner
        settings = runner.settings
        clock = PhaseClock(slot.phases)
        with clock("storage"):
            slot.isolated = await trio.to_thread.run_sync(
                prepare_slot_workspace, slot.workspace, settings.memory_bytes
            )
        runner.isolated_storage = slot.isolated
        hmap = settings.host_path_map
        workspace_host = translate_host_path(str(slot.workspace), hmap)
        volume = invocation_volume(
            settings,
            slot.slot_id,
            view_dir=view,
            seed_host_path=seed_host,
            upper_dir=f"{workspace_host}/{UPPER_DIR_NAME}",
            work_dir=f"{workspace_host}/{WORK_DIR_NAME}",
        )
        spec = prepared_spec(
            settings,
            slot.slot_id,
            runner._seccomp,
            self._launcher,
            workspace=str(slot.workspace),
            repo_volume=volume.name,
            host_cpus=runner.host_cpus,
        )
        with clock("volume"):
            await runner._create_volume(volume)
        slot.volume = volume.name
        with clock("create"):
            created = await runner._call(
                runner.api.create_container_from_config, spec.body, spec.name
            )
        slot.container_id = str(created["Id"])
        # attached before the start, as the docker CLI does for `run -i`
        with clock("attach"):
            slot.attached = await runner._call(_attach, runner.api, slot.container_id)
        with clock("start"):
            await runner._call(runner.api.start, slot.container_id)

    # -- running -----------------------------------------------------------

    async def run(
        self, invocation: Invocation, view: str, seed_host: str, phases: dict[str, float]
    ) -> RunReport:
        """Run ``invocation`` in its seed's prepared container (or one prepared now)."""
        runner = self._runner
        clock = PhaseClock(phases)
        with clock("take"):
            # No query overlaps a preparation (module docstring, channels).
            for pending in [s for s in self._slots.values() if s.state is SlotState.PREPARING]:
                await pending.done.wait()
        slot = self._slots.get(seed_host)
        if slot is None or slot.state is not SlotState.READY:
            with clock("cold"):
                slot = await self._prepare(seed_host, view, invocation.workspace.parent)
            phases.update(slot.phases)
            if slot.state is not SlotState.READY:
                self._forget(seed_host, slot)
                return RunReport("query-launch-failed", phases)
        slot.move(SlotEvent.TAKE)
        runner.isolated_storage = slot.isolated
        failure: str | None = None
        try:
            assert slot.container_id is not None
            assert slot.attached is not None
            try:
                with clock("deliver"):
                    await runner._call(_deliver, slot.attached, invocation.script)
            except Exception:
                failure = "query-launch-failed"
            else:
                failure = await runner._wait(slot.container_id, phases)
        finally:
            with trio.CancelScope(shield=True), clock("remove"):
                removed, answer = await self._destroy(slot, read_answer=failure is None)
            slot.move(SlotEvent.FINISH)
            self._forget(seed_host, slot)
        if not removed:
            failure = "cleanup-failed"
        return RunReport(failure, phases, result=answer if failure is None else None)

    # -- destroying ----------------------------------------------------------

    async def _destroy(self, slot: _Slot, *, read_answer: bool) -> tuple[bool, bytes | None]:
        """Remove the slot's container, volume and workspace: (whether all are
        gone, the answer when ``read_answer``)."""
        runner = self._runner
        removed = True
        if slot.attached is not None:
            _close_attached(slot.attached)
            slot.attached = None
        if slot.container_id is not None:
            removed = await runner._remove(slot.container_id)
        else:
            # created under its name, or not at all: removing by name is safe
            removed = await runner._remove(container_name(runner.settings.run_id, slot.slot_id))
        if slot.volume is not None:
            removed = await runner._remove_volume(slot.volume) and removed
        if not removed:
            return False, None  # the storage may still be in use: leave it to reconcile
        return await trio.to_thread.run_sync(
            partial(release_slot_workspace, slot.workspace, slot.isolated, read_answer=read_answer)
        )

    async def _discard(self, seed_host: str) -> None:
        """Destroy a ready slot (memory bound); it is forgotten either way."""
        slot = self._slots[seed_host]
        slot.move(SlotEvent.DISCARD)
        with trio.CancelScope(shield=True):
            await self._destroy(slot, read_answer=False)
        self._forget(seed_host, slot)

    def _forget(self, seed_host: str, slot: _Slot) -> None:
        # Whatever path forgets a slot (a reconcile removed its container, a
        # failed preparation, shutdown), its hijacked stdin connection goes too.
        if slot.attached is not None:
            _close_attached(slot.attached)
            slot.attached = None
        if self._slots.get(seed_host) is slot:
            del self._slots[seed_host]
            with contextlib.suppress(ValueError):
                self._recency.remove(seed_host)

    async def forget_all(self) -> None:
        """After a reconcile removed every container and volume: drop storage and slots."""
        for seed_host, slot in list(self._slots.items()):
            if slot.state is SlotState.READY:
                slot.move(SlotEvent.DISCARD)
            with trio.CancelScope(shield=True), contextlib.suppress(OSError):
                release = partial(
                    release_slot_workspace, slot.workspace, slot.isolated, read_answer=False
                )
                await trio.to_thread.run_sync(release)
            self._forget(seed_host, slot)

    async def aclose(self) -> None:
        """Destroy every ready slot, and one being built once it is (shutdown, halt).

        Never raises on an engine failure.
        """
        for seed_host, slot in list(self._slots.items()):
            if slot.state is SlotState.PREPARING:
                with trio.move_on_after(PREPARING_WAIT_S):
                    await slot.done.wait()
            if slot.state is SlotState.READY:
                with contextlib.suppress(Exception):
                    await self._discard(seed_host)
            elif slot.attached is not None:  # a preparation cut short: its connection
                _close_attached(slot.attached)
                slot.attached = None
