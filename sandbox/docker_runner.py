"""Query runner on the Docker Engine API: runc ("docker") and runsc ("gvisor").

Theory of operation (spec 14.7; DESIGN.md decisions 3 and 4): one invocation
is one fresh container, created from the fixed body of :mod:`.spec`, started,
waited for with the configured wall-clock timeout, and force-removed
(``force=True, v=True``) whatever happened. The workspace is prepared on the
host first: the script is written read-only (``script.py``) and the result
file ``out`` is pre-created and handed to uid 65534, so the container can
bind both without any host-side copy of the seed.

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
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import trio
from bounded_query.broker.runner import (
    LABEL_RUN,
    RESULT_FILE_NAME,
    Invocation,
    RunnerSettings,
    RunnerUnavailable,
    RunReport,
)
from bounded_query.seccomp import profile_json

from .spec import (
    QUERY_GID,
    QUERY_UID,
    RUNTIMES,
    SCRIPT_FILE_NAME,
    container_spec,
    probe_spec,
)

__all__ = ["API_VERSION", "DockerRunner", "RunOptions", "prepare_workspace"]

#: Engine API version we speak: Docker 20.10 (Debian 12) and every later engine.
API_VERSION = "1.41"
#: HTTP timeout of ordinary Engine API calls (create, start, remove, inspect).
#: Generous: removal of a container whose tmpfs holds a large tree can take a
#: few seconds on a loaded machine.
API_TIMEOUT_S = 60
#: How long the preflight probe container may run.
PROBE_TIMEOUT_S = 60

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Benchmark-only knobs; the broker always uses the defaults.

    ``entrypoint_args`` are passed to the image's fixed entrypoint (e.g.
    ``("--timings",)``); with ``collect_timings`` the container keeps its
    output in a capped local log so the entrypoint's timing line can be read
    before removal.
    """

    entrypoint_args: tuple[str, ...] = ()
    collect_timings: bool = False


def prepare_workspace(invocation: Invocation) -> None:
    """Write ``script.py`` (0444) and create the empty result file for uid 65534.

    Neither may exist yet (O_EXCL, O_NOFOLLOW). When the broker cannot chown
    (not root), the result file is made world-writable instead: the workspace
    itself is 0700, so no other host user can reach it.

    Raises:
        OSError: the workspace is not usable (a local fault).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(invocation.workspace / SCRIPT_FILE_NAME, flags, 0o444)
    try:
        view = memoryview(invocation.script)
        while view:
            view = view[os.write(fd, view) :]
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
        options: RunOptions | None = None,
        client_factory: Callable[[], Any] | None = None,
    ) -> None:
        if settings.runtime not in RUNTIMES:
            raise ValueError(f"DockerRunner cannot launch runtime {settings.runtime!r}")
        self.settings = settings
        self.oci_runtime = RUNTIMES[settings.runtime]
        self.options = options or RunOptions()
        self._seccomp = profile_json(self.oci_runtime)
        self._client_factory = client_factory or self._default_client
        self._client: Any = None

    def _default_client(self) -> Any:
        import docker  # imported lazily: the pure modules never need it

        return docker.APIClient(
            base_url=self.settings.docker_host, version=API_VERSION, timeout=API_TIMEOUT_S
        )

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
        if host.startswith("unix://") and not await trio.Path(host[len("unix://") :]).exists():
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
        spec = probe_spec(self.settings, probe_id, self._seccomp)
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
        phases: dict[str, float] = {}
        clock = _PhaseClock(phases)
        try:
            with clock("prepare"):
                await trio.to_thread.run_sync(prepare_workspace, invocation)
        except OSError:
            return RunReport("runner-internal", phases)
        spec = container_spec(
            self.settings,
            invocation,
            self._seccomp,
            entrypoint_args=self.options.entrypoint_args,
            keep_logs=self.options.collect_timings,
        )
        failure: str | None = None
        container_id: str | None = None
        try:
            try:
                with clock("create"):
                    created = await self._call(
                        self.api.create_container_from_config, spec.body, spec.name
                    )
                container_id = str(created["Id"])
                with clock("start"):
                    await self._call(self.api.start, container_id)
            except Exception:
                failure = "query-launch-failed"
            else:
                failure = await self._wait(container_id, phases)
        finally:
            with trio.CancelScope(shield=True), clock("remove"):
                removed = await self._remove(container_id or spec.name)
        if not removed:
            failure = "cleanup-failed"
        return RunReport(failure, phases)

    async def _wait(self, container_id: str, phases: dict[str, float]) -> str | None:
        """Wait for exit within the timeout; return the failure category or None."""
        clock = _PhaseClock(phases)
        result: Any = None
        with clock("wait"):
            with trio.move_on_after(self.settings.timeout_s) as scope:
                try:
                    result = await trio.to_thread.run_sync(
                        lambda: self.api.wait(container_id, timeout=None),
                        abandon_on_cancel=True,
                    )
                except Exception:
                    return "runner-internal"
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
            return "query-nonzero-exit"
        return "query-oom" if state.get("OOMKilled") else "query-nonzero-exit"

    async def _remove(self, container: str) -> bool:
        """Force-remove one container (by id or name); True when it is gone."""
        import docker.errors

        try:
            await self._call(self.api.remove_container, container, v=True, force=True)
        except docker.errors.NotFound:
            return True
        except Exception:
            # One more attempt; a concurrent "removal in progress" ends as gone.
            try:
                await self._call(self.api.remove_container, container, v=True, force=True)
            except docker.errors.NotFound:
                return True
            except Exception:
                return False
        return True

    # -- reconcile ---------------------------------------------------------

    async def reconcile(self) -> int:
        """Force-remove every container of this run; return how many were removed.

        Raises:
            RunnerUnavailable: the engine could not list containers, or some
                labelled container could not be removed.
        """
        label = f"{LABEL_RUN}={self.settings.run_id}"
        try:
            listed = await self._call(self.api.containers, all=True, filters={"label": label})
        except Exception as exc:
            raise RunnerUnavailable(f"cannot list query containers: {exc}") from exc
        removed = 0
        for entry in listed:
            with trio.CancelScope(shield=True):
                ok = await self._remove(str(entry["Id"]))
            if not ok:
                raise RunnerUnavailable(f"cannot remove query container {entry['Id'][:12]}")
            removed += 1
        return removed

    def close(self) -> None:
        """Close the HTTP connection pool (idempotent)."""
        if self._client is not None:
            self._client.close()
            self._client = None


class _PhaseClock:
    """Context managers that add elapsed seconds to ``phases[name]``."""

    def __init__(self, phases: dict[str, float]) -> None:
        self._phases = phases

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._phases[name] = self._phases.get(name, 0.0) + time.perf_counter() - started
