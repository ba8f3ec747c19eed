"""Query runner on the Docker Engine API: runc ("docker") and runsc ("gvisor").

Theory of operation (spec 14.7; docs/architecture.md decisions 3 and 4): one invocation
is one fresh container, created from the fixed body of :mod:`.spec`, started,
waited for with the configured wall-clock timeout, and force-removed
(``force=True, v=True``) whatever happened. The workspace is prepared on the
host first: the script is written read-only (``script.py``) and the result
file ``out`` is pre-created and handed to uid 65534, so the container can
bind both without any host-side copy of the seed. By default an
overlay query instead runs in its seed's *prepared* container, created and
started while the lane was idle and handed the script on stdin
(:mod:`.prepared_pool`); this body is then the cold path of ``prepared=False``
and of the tmpfs fallback.

Every Engine API call is a blocking docker SDK call made in a worker thread
(``trio.to_thread.run_sync``) so the trio loop never blocks. We use the
low-level ``APIClient`` and send the create body as is, which avoids the
high-level client's extra inspect round trips.

Error attribution: anything the query can cause (timeout, non-zero exit, OOM)
and any engine refusal is *reported* in :class:`RunReport` with a category of
``FAILURE_CATEGORIES``; cleanup is shielded from cancellation and a failed
removal is ``cleanup-failed``. Only a bug in this module raises.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import trio

from bounded_query.broker.fdio import write_all
from bounded_query.broker.mounts import mount_tmpfs, unmount
from bounded_query.broker.protocol import policy
from bounded_query.broker.protocol.policy import LABEL_RUN, OCI_RUNTIMES, QUERY_GID, QUERY_UID
from bounded_query.broker.runner import (
    PAGE_CACHE_PIN,
    RESULT_FILE_NAME,
    Degradation,
    Invocation,
    RunnerSettings,
    RunnerUnavailable,
    RunReport,
)
from bounded_query.broker.workspace import read_result_file
from bounded_query.seccomp import profile_json

from . import engine
from .overlay import (
    VolumeSpec,
    invocation_volume,
    overlay_safe,
    prep_container_body,
    seed_volumes,
)
from .pagecache import PIN_READY, pin_container_body
from .phases import PhaseClock
from .prepared_pool import PreparedPool
from .reconcile import remove_container, remove_labelled, remove_labelled_volumes, remove_volume
from .spec import SCRIPT_FILE_NAME, container_spec, probe_spec, translate_host_path
from .storage import tmpfs_quota

__all__ = [
    "DockerRunner",
    "RunnerOptions",
    "prepare_workspace",
    "private_storage",
    "release_storage",
]

#: HTTP timeout of ordinary Engine API calls (create, start, remove, inspect).
#: Generous: removal of a container whose tmpfs holds a large tree can take a
#: few seconds on a loaded machine.
API_TIMEOUT_S = 60
#: How long the preflight probe container may run.
PROBE_TIMEOUT_S = 60
#: How long preparing one seed's view layer may take (once per seed and run).
PREP_TIMEOUT_S = 600
#: How long the pin container may take to lock the image's pages.
PIN_TIMEOUT_S = 120
#: How often its readiness line is looked for.
PIN_POLL_S = 0.1
#: How often :meth:`DockerRunner.watch` checks that the pin still runs between
#: invocations (each invocation also checks it before its container starts).
PIN_WATCH_S = 1.0
#: Workspace subdirectories of the copy-on-write overlay (sandbox/overlay.py).
UPPER_DIR_NAME = "upper"
WORK_DIR_NAME = "work"
#: Materialization strategies: the copy-on-write overlay (default) or the
#: entrypoint's copy into the /query tmpfs (fallback, and benchmark baseline).
MATERIALIZE_MODES = frozenset({"overlay", "tmpfs"})

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RunnerOptions:
    """Benchmark-only knobs; the broker always uses the defaults.

    ``entrypoint_args`` are passed to the image's fixed entrypoint (e.g.
    ``("--timings",)``); with ``collect_timings`` the container keeps its
    output in a capped local log so the entrypoint's timing line can be read
    before removal.
    """

    entrypoint_args: tuple[str, ...] = ()
    collect_timings: bool = False
    materialize: str = "overlay"
    #: Keep the image's pages locked in memory for the run (sandbox/pagecache.py).
    pin_page_cache: bool = True
    #: Run overlay queries in prepared containers (sandbox/prepared_pool.py);
    #: False runs every query in a container started for it (the image's
    #: entrypoint, the benchmark's cold baseline).
    prepared: bool = True

    def __post_init__(self) -> None:
        if self.materialize not in MATERIALIZE_MODES:
            raise ValueError(f"unknown materialize mode {self.materialize!r}")


def prepare_workspace(invocation: Invocation, *, overlay: bool = False) -> None:
    """Write ``script.py`` (0444) and create the empty result file for uid 65534.

    Neither may exist yet (O_EXCL, O_NOFOLLOW). When the broker cannot chown
    (not root), the result file is made world-writable instead: the workspace
    itself is 0700, so no other host user can reach it. With ``overlay``, also
    create the overlay's upper directory (owned by 65534: it becomes the root
    of /query/repo) and its empty work directory.

    Raises:
        OSError: the workspace is not usable (a local fault).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(invocation.workspace / SCRIPT_FILE_NAME, flags, 0o444)
    try:
        write_all(fd, invocation.script)
    finally:
        os.close(fd)
    fd = os.open(invocation.workspace / RESULT_FILE_NAME, flags, 0o600)
    try:
        try:
            os.fchown(fd, QUERY_UID, QUERY_GID)
        except PermissionError:
            os.fchmod(fd, 0o666)
    finally:
        os.close(fd)
    if overlay:
        upper = invocation.workspace / UPPER_DIR_NAME
        os.mkdir(upper, 0o755)
        try:
            os.chown(upper, QUERY_UID, QUERY_GID, follow_symlinks=False)
        except PermissionError:
            os.chmod(upper, 0o777)
        os.mkdir(invocation.workspace / WORK_DIR_NAME, 0o700)


def private_storage(invocation: Invocation, memory_bytes: int) -> bool:
    """Mount the invocation's own tmpfs over its (empty) workspace; False without privilege.

    See :mod:`.storage`. Returns False (the workspace stays a plain
    directory, the run's shared storage) only when mounting is not permitted
    (EPERM); the caller reports that it is not isolated.

    Raises:
        OSError: the workspace is not empty, or any other mount failure (a
            local fault).
    """
    if os.listdir(invocation.workspace):
        raise OSError(errno.ENOTEMPTY, "workspace is not empty", str(invocation.workspace))
    try:
        mount_tmpfs(invocation.workspace, tmpfs_quota(memory_bytes).options)
    except PermissionError:
        return False
    return True


def release_storage(invocation: Invocation) -> tuple[bool, bytes | None]:
    """Read the answer, unmount the invocation's tmpfs: (whether it is gone, the answer).

    Call only after every container and volume using it is removed. The
    answer is the result file as the checked reader returns it (regular file,
    size cap, O_NOFOLLOW; None when it refuses it or there is none), read
    before the unmount: after it, the tmpfs and the file are gone and the
    workspace directory is empty again for the broker to remove.
    """
    answer = read_result_file(invocation.result_path)
    try:
        unmount(invocation.workspace)
    except OSError:
        return False, None
    return True, answer


def _status_code(result: Any) -> int | None:
    if isinstance(result, dict):
        code = result.get("StatusCode")
        if isinstance(code, int):
            return code
    return None


def _parse_timings(logs: bytes) -> dict[str, float]:
    phases: dict[str, float] = {}
    for line in logs.decode("utf-8", "replace").splitlines():
        if line.startswith("awf-timing "):
            for item in line.split()[1:]:
                key, _, value = item.partition("=")
                with contextlib.suppress(ValueError):
                    phases[key] = float(value)
    return phases


class DockerRunner:
    """A :class:`~bounded_query.broker.runner.Runner` for runc and runsc."""

    def __init__(
        self,
        settings: RunnerSettings,
        *,
        options: RunnerOptions | None = None,
        client_factory: Callable[[], Any] | None = None,
    ) -> None:
        if settings.runtime not in OCI_RUNTIMES:
            raise ValueError(f"DockerRunner cannot launch runtime {settings.runtime!r}")
        self.settings = settings
        self.oci_runtime = OCI_RUNTIMES[settings.runtime]
        self.options = options or RunnerOptions()
        self._seccomp = profile_json(self.oci_runtime)
        self._client_factory = client_factory or self._default_client
        self._client: Any = None
        #: seed host path -> view-layer directory, or None to use the tmpfs copy
        self._views: dict[str, str | None] = {}
        self._view_lock = trio.Lock()
        #: CPUs of the engine host (the broker in compose sees them too): the
        #: query cpuset is derived from it (sandbox/cpus.py)
        self.host_cpus = os.cpu_count() or 1
        #: whether the last invocation had its own tmpfs (None: none ran yet)
        self.isolated_storage: bool | None = None
        #: whether the image's pages are pinned (None: not tried since reconcile)
        self.page_cache_pinned: bool | None = None
        self._pin_lock = trio.Lock()
        #: set when the pin, once running, was found gone (``watch``)
        self._pin_lost: Degradation | None = None
        self._pin_lost_event = trio.Event()
        #: prepared containers, one per recently used seed (sandbox/prepared_pool.py)
        self.prepared = PreparedPool(self)

    def _default_client(self) -> Any:
        return engine.api_client(self.settings.docker_host, API_TIMEOUT_S)

    @property
    def api(self) -> Any:
        """The docker SDK ``APIClient`` (created on first use)."""
        if self._client is None:
            self._client = self._client_factory()
        return self._client

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    # -- preflight ---------------------------------------------------------

    async def preflight(self) -> None:
        """Prove engine, runtime, image and hardening by running a probe container.

        Raises:
            RunnerUnavailable: the engine is unreachable, the OCI runtime is not
                registered, the image is missing (never pulled), or the probe
                did not exit 0. Never falls back to another runtime.
        """
        host = self.settings.docker_host
        socket_path = policy.docker_socket_path(host)
        if socket_path and not await trio.Path(socket_path).exists():
            raise RunnerUnavailable(f"Docker engine at {host} unreachable: no such socket")
        try:
            info = await self._call(self.api.info)
        except Exception as exc:
            raise RunnerUnavailable(
                f"Docker engine at {self.settings.docker_host} unreachable: {exc}"
            ) from exc
        runtimes = info.get("Runtimes") if isinstance(info, dict) else None
        if not isinstance(runtimes, dict) or self.oci_runtime not in runtimes:
            raise RunnerUnavailable(
                f"OCI runtime {self.oci_runtime!r} is not registered with dockerd "
                f"(runtime {self.settings.runtime!r}); see .ci/provision-engine"
            )
        try:
            await self._call(self.api.inspect_image, self.settings.image)
        except Exception as exc:
            raise RunnerUnavailable(
                f"query image {self.settings.image!r} is not present (it is never pulled); "
                f"run .ci/build-images: {exc}"
            ) from exc
        probe_id = "probe" + secrets.token_hex(8)
        spec = probe_spec(self.settings, probe_id, self._seccomp, host_cpus=self.host_cpus)
        container_id: str | None = None
        try:
            created = await self._call(self.api.create_container_from_config, spec.body, spec.name)
            container_id = str(created["Id"])
            await self._call(self.api.start, container_id)
            result = await self._call(self.api.wait, container_id, timeout=PROBE_TIMEOUT_S)
        except Exception as exc:
            raise RunnerUnavailable(
                f"probe container on runtime {self.oci_runtime!r} failed: {exc}"
            ) from exc
        finally:
            with trio.CancelScope(shield=True):
                await self._remove(container_id or spec.name)
        code = _status_code(result)
        if code != 0:
            raise RunnerUnavailable(
                f"probe container on runtime {self.oci_runtime!r} exited with {code}"
            )

    # -- one invocation ----------------------------------------------------

    async def run(self, invocation: Invocation) -> RunReport:
        """Run one invocation (contract: :class:`bounded_query.broker.runner.Runner`)."""
        with self.prepared.query_running():
            return await self._run_one(invocation)

    async def _run_one(self, invocation: Invocation) -> RunReport:
        """One invocation: a prepared container, or the cold path below."""
        phases: dict[str, float] = {}
        clock = PhaseClock(phases)
        hmap = self.settings.host_path_map
        seed_host = translate_host_path(str(invocation.seed_dir), hmap)
        view: str | None = None
        if self.options.pin_page_cache and self.page_cache_pinned is None:
            with clock("pin"):
                await self._ensure_pinned()
        if self.page_cache_pinned and not await self._pin_alive():
            # The pin died since the last check: this query would run unpinned
            # after queries that could then load or evict image pages. No
            # container starts; ``watch`` makes the broker halt the run.
            self._lose_pin()
            await self.prepared.aclose()
            return RunReport(policy.CATEGORY_RUNNER_INTERNAL, phases)
        if self.options.materialize == "overlay":
            with clock("view"):
                view = await self._ensure_view(seed_host)
        if view is not None and self.options.prepared:
            return await self.prepared.run(invocation, view, seed_host, phases)
        isolated = False
        try:
            with clock("storage"):
                isolated = await trio.to_thread.run_sync(
                    private_storage, invocation, self.settings.memory_bytes
                )
            self.isolated_storage = isolated
            report = await self._run_in_workspace(invocation, view, seed_host, phases)
        except OSError:  # the workspace could not be mounted (a local fault)
            return RunReport(policy.CATEGORY_RUNNER_INTERNAL, phases)
        except BaseException:
            if isolated:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(release_storage, invocation)
            raise
        if isolated:
            with trio.CancelScope(shield=True), clock("remove"):
                released, answer = await trio.to_thread.run_sync(release_storage, invocation)
            if not released:
                return RunReport(policy.CATEGORY_CLEANUP_FAILED, phases)
        elif report.failure is None:
            with clock("read"):
                answer = await trio.to_thread.run_sync(read_result_file, invocation.result_path)
        else:
            answer = None
        return replace(report, result=answer if report.failure is None else None)

    async def _run_in_workspace(
        self, invocation: Invocation, view: str | None, seed_host: str, phases: dict[str, float]
    ) -> RunReport:
        """Prepare the (mounted or plain) workspace, run the container, remove it."""
        clock = PhaseClock(phases)
        hmap = self.settings.host_path_map
        try:
            with clock("prepare"):
                await trio.to_thread.run_sync(
                    lambda: prepare_workspace(invocation, overlay=view is not None)
                )
        except OSError:
            return RunReport(policy.CATEGORY_RUNNER_INTERNAL, phases)
        volume = None
        if view is not None:
            workspace_host = translate_host_path(str(invocation.workspace), hmap)
            volume = invocation_volume(
                self.settings,
                invocation.invocation_id,
                view_dir=view,
                seed_host_path=seed_host,
                upper_dir=f"{workspace_host}/{UPPER_DIR_NAME}",
                work_dir=f"{workspace_host}/{WORK_DIR_NAME}",
            )
        spec = container_spec(
            self.settings,
            invocation,
            self._seccomp,
            entrypoint_args=self.options.entrypoint_args,
            keep_logs=self.options.collect_timings,
            repo_volume=None if volume is None else volume.name,
            host_cpus=self.host_cpus,
        )
        failure: str | None = None
        container_id: str | None = None
        removed = True
        try:
            try:
                if volume is not None:
                    with clock("volume"):
                        await self._create_volume(volume)
                with clock("create"):
                    created = await self._call(
                        self.api.create_container_from_config, spec.body, spec.name
                    )
                container_id = str(created["Id"])
                with clock("start"):
                    await self._call(self.api.start, container_id)
            except Exception:
                failure = policy.CATEGORY_LAUNCH_FAILED
                if view is not None:
                    # e.g. the view volume was removed behind our back:
                    # prepare it again for the next invocation
                    self._views.pop(seed_host, None)
            else:
                failure = await self._wait(container_id, phases)
        finally:
            with trio.CancelScope(shield=True), clock("remove"):
                removed = await self._remove(container_id or spec.name)
                if volume is not None:
                    removed = await self._remove_volume(volume.name) and removed
        if not removed:
            failure = policy.CATEGORY_CLEANUP_FAILED
        return RunReport(failure, phases)

    async def _wait(self, container_id: str, phases: dict[str, float]) -> str | None:
        """Wait for exit within the timeout; return the failure category or None."""
        clock = PhaseClock(phases)
        result: Any = None
        with clock("wait"):
            with trio.move_on_after(self.settings.timeout_s) as scope:
                try:
                    result = await trio.to_thread.run_sync(
                        lambda: self.api.wait(container_id, timeout=None),
                        abandon_on_cancel=True,
                    )
                except Exception:
                    return policy.CATEGORY_RUNNER_INTERNAL
        if scope.cancelled_caught:
            return "query-timeout"  # the caller's removal kills the container
        code = _status_code(result)
        if self.options.collect_timings:
            with contextlib.suppress(Exception):
                logs = await self._call(self.api.logs, container_id, stdout=False, stderr=True)
                phases.update(_parse_timings(bytes(logs)))
        if code == 0:
            return None
        try:
            state = (await self._call(self.api.inspect_container, container_id))["State"]
        except Exception:
            return policy.CATEGORY_NONZERO_EXIT
        return policy.CATEGORY_OOM if state.get("OOMKilled") else policy.CATEGORY_NONZERO_EXIT

    async def _remove(self, container: str) -> bool:
        """Force-remove one container (by id or name); True when it is gone (``reconcile.py``)."""
        return await self._call(remove_container, self.api, container)

    async def _create_volume(self, volume: VolumeSpec) -> None:
        """Have dockerd create ``volume`` (the local driver performs the mount)."""
        await self._call(
            self.api.create_volume,
            volume.name,
            driver="local",
            driver_opts=dict(volume.driver_opts),
            labels=dict(volume.labels),
        )

    async def _remove_volume(self, name: str) -> bool:
        """Remove one volume (unmounting it); True when it is gone (``reconcile.py``)."""
        return await self._call(remove_volume, self.api, name)

    # -- copy-on-write view layers (sandbox/overlay.py) ------------------------

    async def _ensure_view(self, seed_host: str) -> str | None:
        """The seed's view-layer directory, preparing it once; None -> tmpfs copy."""
        async with self._view_lock:
            if seed_host not in self._views:
                self._views[seed_host] = await self._prepare_view(seed_host)
            return self._views[seed_host]

    async def _prepare_view(self, seed_host: str) -> str | None:
        """Run the trusted preparation container; None when overlays are unusable."""
        volumes = seed_volumes(self.settings, seed_host)
        prep_name: str | None = None
        container_id: str | None = None
        ok = False
        try:
            dirs = []
            for spec in (volumes.upper, volumes.work):
                created = await self._call(
                    self.api.create_volume, spec.name, driver="local", labels=dict(spec.labels)
                )
                dirs.append(str(created["Mountpoint"]))
            upper_dir, work_dir = dirs
            if not overlay_safe(seed_host, upper_dir, work_dir):
                return None
            prep = volumes.prep(seed_host, upper_dir, work_dir)
            prep_name = prep.name
            await self._create_volume(prep)
            body = prep_container_body(self.settings, prep.name)
            created = await self._call(self.api.create_container_from_config, body, None)
            container_id = str(created["Id"])
            await self._call(self.api.start, container_id)
            result = await self._call(self.api.wait, container_id, timeout=PREP_TIMEOUT_S)
            ok = _status_code(result) == 0
            return upper_dir if ok else None
        except Exception:
            return None
        finally:
            with trio.CancelScope(shield=True):
                if container_id is not None:
                    await self._remove(container_id)
                if prep_name is not None:
                    await self._remove_volume(prep_name)
                await self._remove_volume(volumes.work.name)
                if not ok:
                    await self._remove_volume(volumes.upper.name)

    async def warm(self, seed_dirs: Iterable[Path]) -> dict[str, bool]:
        """Prepare each seed's view layer now instead of on its first query.

        Meant for broker start-up, after :meth:`reconcile` (which removes the
        run's volumes): the preparation takes seconds for a large seed and
        would otherwise land the first query of that seed in a later timing
        bucket. Returns seed path -> True when the copy-on-write view is
        ready (False: queries of that seed use the tmpfs copy). Never raises
        for an unusable seed; a no-op in tmpfs mode.
        """
        ready: dict[str, bool] = {}
        if self.options.pin_page_cache:
            await self._ensure_pinned()
        if self.options.materialize != "overlay":
            return ready
        for seed_dir in seed_dirs:
            seed_host = translate_host_path(str(seed_dir), self.settings.host_path_map)
            ready[str(seed_dir)] = await self._ensure_view(seed_host) is not None
        return ready

    async def prepare(self, seed_dir: Path, work_root: Path) -> None:
        """Prepare the seed's next query container now (Runner contract; the idle hook).

        A no-op without prepared containers or a copy-on-write view (tmpfs
        mode), and once the pin is lost (the run halts: nothing would use it).
        Never raises for an engine or storage fault.
        """
        if self._pin_lost is not None:
            return
        if self.options.prepared and self.options.materialize == "overlay":
            await self.prepared.prepare(seed_dir, work_root)

    # -- page-cache pin (sandbox/pagecache.py) ------------------------------

    async def _ensure_pinned(self) -> bool:
        """Start the run's pin container once (after each reconcile); True when pinned."""
        async with self._pin_lock:
            if self.page_cache_pinned is None:
                self.page_cache_pinned = await self._start_pinner()
            return self.page_cache_pinned

    async def _start_pinner(self) -> bool:
        """Create and start the pin container; wait for its readiness line.

        Never raises: a pin container that cannot start or lock is removed
        and queries run unpinned (the page-cache channel is then open).
        """
        body = pin_container_body(self.settings)
        name = self.pin_name
        container_id: str | None = None
        try:
            created = await self._call(self.api.create_container_from_config, body, name)
            container_id = str(created["Id"])
            await self._call(self.api.start, container_id)
            with trio.move_on_after(PIN_TIMEOUT_S):
                while True:
                    logs = await self._call(self.api.logs, container_id, stdout=True, stderr=False)
                    if PIN_READY.encode() in bytes(logs):
                        return True
                    state = (await self._call(self.api.inspect_container, container_id))["State"]
                    if not state.get("Running"):
                        break
                    await trio.sleep(PIN_POLL_S)
        except Exception:
            pass
        with trio.CancelScope(shield=True):
            await self._remove(container_id or name)
        return False

    async def _pin_alive(self) -> bool:
        """Whether the pin container still runs (fail closed: any engine error is no)."""
        try:
            info = await self._call(self.api.inspect_container, self.pin_name)
            state = info["State"]
            return bool(state.get("Running")) and not state.get("Restarting")
        except Exception:
            return False

    def _lose_pin(self) -> None:
        if self._pin_lost is None:
            self.page_cache_pinned = False
            self._pin_lost = Degradation(
                PAGE_CACHE_PIN,
                "the pin container stopped during the run: later queries would share the"
                " image's page cache, a cross-invocation channel; the broker halted the run",
            )
            self._pin_lost_event.set()

    async def watch(self) -> Degradation:
        """Return once the running pin is found gone (Runner contract).

        Checks every :data:`PIN_WATCH_S` seconds while the pin runs, and at
        once when an invocation found it gone (``run``). A pin that never
        started is no loss (``degradations`` reported it at start). The
        prepared containers go with the loss: the run halts, so none of them
        will ever serve a query.
        """
        while self._pin_lost is None:
            with trio.move_on_after(PIN_WATCH_S):
                await self._pin_lost_event.wait()
            if self._pin_lost is None and self.page_cache_pinned:
                async with self._pin_lock:
                    if self.page_cache_pinned and not await self._pin_alive():
                        self._lose_pin()
        await self.prepared.aclose()
        return self._pin_lost

    # -- reconcile ---------------------------------------------------------

    async def reconcile(self) -> int:
        """Force-remove every container of this run; return how many were removed.

        Then remove the run's volumes (invocation overlays and seed view
        layers, which are prepared again on next use).

        Raises:
            RunnerUnavailable: the engine could not list containers or volumes,
                or some labelled container or volume could not be removed.
        """
        label = f"{LABEL_RUN}={self.settings.run_id}"
        try:
            swept = await self._call(remove_labelled, self.api, label)
        except Exception as exc:
            raise RunnerUnavailable(f"cannot list query containers: {exc}") from exc
        if swept.failed:
            raise RunnerUnavailable(f"cannot remove query container {swept.failed[0][:12]}")
        removed = len(swept.removed)
        self.page_cache_pinned = None  # its container was just removed
        async with self._view_lock:
            self._views.clear()
            try:
                with trio.CancelScope(shield=True):
                    volumes = await self._call(remove_labelled_volumes, self.api, label)
            except Exception as exc:
                raise RunnerUnavailable(f"cannot list query volumes: {exc}") from exc
            if volumes.failed:
                raise RunnerUnavailable(f"cannot remove query volume {volumes.failed[0]}")
        # the prepared containers and their volumes were among those removed
        await self.prepared.forget_all()
        return removed

    def close(self) -> None:
        """Close the HTTP connection pool (idempotent)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def pin_name(self) -> str:
        """The container name of this run's page-cache pin."""
        return f"bq-{self.settings.run_id[:16]}-pin"

    def degradations(self) -> tuple[Degradation, ...]:
        """The page-cache pin, when it was asked for and could not start (Runner contract).

        Unpinned, queries share the page cache of the image's files: the
        cross-invocation channel the pin closes (``pagecache.py``) is open.
        """
        if self._pin_lost is not None:
            return (self._pin_lost,)
        if self.options.pin_page_cache and self.page_cache_pinned is False:
            return (
                Degradation(
                    PAGE_CACHE_PIN,
                    "the pin container could not start: queries share the image's page "
                    "cache, a cross-invocation channel (README, cross-invocation channels)",
                ),
            )
        return ()

    async def aclose(self) -> None:
        """Remove the prepared containers and the pin container, then :meth:`close`.

        Idempotent, shielded from cancellation, never raises on an engine
        failure (shutdown goes on; the next start's reconcile removes a pin
        left behind). The runner stays usable: a later call opens a new
        client, and the next ``warm`` or ``run`` pins again.
        """
        with trio.CancelScope(shield=True):
            with contextlib.suppress(Exception):
                await self.prepared.aclose()
            pinned, self.page_cache_pinned = self.page_cache_pinned, None
            if pinned:
                with contextlib.suppress(Exception):
                    await self._remove(self.pin_name)
            with contextlib.suppress(Exception):
                self.close()

    async def __aenter__(self) -> DockerRunner:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
