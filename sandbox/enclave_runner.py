"""The bounded-agent enclave runner: one fresh enclave per invocation (spec 15.5, 15.6).

Theory of operation: the agent broker hands :meth:`EnclaveRunner.run` an
:class:`~bounded_query.broker.runner.Invocation` whose ``script`` is an
encoded :class:`~bounded_query.broker.agent_payload.AgentPayload`. One
invocation is, in this order (each step timed in ``RunReport.phases``):

1. ``disarm`` -- only when an earlier invocation's disarm failed: retried
   first, and while the proxy is not known to be disarmed nothing is
   launched (a still-armed proxy forwards, on the earlier placeholder, for
   whoever holds it; and its request count belongs to the earlier
   invocation);
2. ``prepare`` -- the workspace files of :func:`.enclave_plan.workspace_files`
   (O_EXCL, O_NOFOLLOW, modes from the plan, the empty result file owned by
   65534);
3. ``arm`` -- a fresh placeholder (``secrets.token_hex``) and ``POST /arm``
   for this invocation over ``EnclaveOptions.control_socket``;
4. ``topology`` -- the enclave network inspected and judged by
   :func:`.enclave_plan.topology_verdict` against the network and proxy
   pinned at preflight; a mismatch is ``enclave-topology`` and nothing is
   created;
5. ``create`` / ``start`` -- the body of :func:`.enclave_spec.enclave_spec`
   (never pulled: the engine refuses a missing image; the log driver is
   ``none``, so stdout and stderr are drained by the engine and kept
   nowhere), then the network is judged again with the enclave as the one
   allowed extra member (a container that joined in between is caught);
6. ``engine`` -- the wait, bounded by ``RunnerSettings.timeout_s``; on
   timeout the enclave is killed (``query-timeout``);
7. ``remove`` -- force-removal, then an inspect that must say "no such
   container" (``cleanup-failed`` otherwise);
8. ``disarm`` -- always, shielded from cancellation; a failure is
   remembered for step 1 of the next invocation (this one's report says
   ``enclave-proxy`` unless it already failed otherwise);
9. the result -- ``read_result_file(path, maxOutputBytes)`` (O_NOFOLLOW,
   regular file, size cap) into ``RunReport.result``, only when nothing
   failed.

Whose fault: anything the enclave causes is a reported category, never an
exception; an engine error is ``runner-internal`` (or
``query-launch-failed`` when create/start is refused); an exception from
``run`` is a bug here. The decisions live in :mod:`.enclave_plan` (pure);
this module moves bytes and waits. Every blocking Engine API call runs in a
worker thread.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import trio

from bounded_query.broker.agent_payload import PayloadError, decode_agent_payload
from bounded_query.broker.fdio import write_all
from bounded_query.broker.protocol import policy
from bounded_query.broker.protocol.policy import (
    CATEGORY_CLEANUP_FAILED,
    CATEGORY_ENCLAVE_PROXY,
    CATEGORY_ENCLAVE_TOPOLOGY,
    CATEGORY_LAUNCH_FAILED,
    CATEGORY_RUNNER_INTERNAL,
    CATEGORY_TIMEOUT,
    ENCLAVE_OCI_RUNTIMES,
    LABEL_AGENT_RUN,
    LABEL_ENCLAVE_ENGINE,
    QUERY_GID,
    QUERY_UID,
)
from bounded_query.broker.runner import (
    Degradation,
    EnclaveOptions,
    Invocation,
    RunnerSettings,
    RunnerUnavailable,
    RunReport,
)
from bounded_query.broker.workspace import read_result_file
from bounded_query.seccomp import enclave_profile_json

from . import engine, proxy_control
from .enclave_plan import (
    ExpectedTopology,
    TopologyVerdict,
    WorkspaceFile,
    enclave_settings,
    exit_failure,
    probe_body,
    topology_verdict,
    workspace_files,
)
from .enclave_spec import EnclaveInvocation, EnclaveSettings, enclave_name, enclave_spec
from .phases import PhaseClock
from .reconcile import remove_container, remove_labelled

__all__ = ["PLACEHOLDER_BYTES", "PROBE_TIMEOUT_S", "EnclaveRunner"]

#: Entropy of a placeholder credential: 32 bytes, 64 hex digits.
PLACEHOLDER_BYTES = 32
#: How long the preflight probe container may take to start and exit.
PROBE_TIMEOUT_S = 60
#: The result file's name in the workspace (``enclave_spec.WORKSPACE_FILES``).
RESULT_FILE = "result.json"

T = TypeVar("T")


def _write_file(workspace: Path, item: WorkspaceFile) -> None:
    """Create one workspace file exactly as planned (it must not exist yet)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(workspace / item.name, flags, 0o600)
    try:
        write_all(fd, item.data)
        if item.enclave_owned:
            try:
                os.fchown(fd, QUERY_UID, QUERY_GID)
            except PermissionError:
                # Not root: the workspace (0700, the broker's) keeps other users out.
                os.fchmod(fd, 0o666)
                return
        os.fchmod(fd, item.mode)
    finally:
        os.close(fd)


def _prepare_workspace(workspace: Path, files: Iterable[WorkspaceFile]) -> None:
    for item in files:
        _write_file(workspace, item)


class EnclaveRunner:
    """A :class:`~bounded_query.broker.runner.Runner` of bounded-agent enclaves.

    ``keep_logs`` (tests and the benchmark only; the broker never sets it)
    keeps a small local log of each enclave and copies it into
    :attr:`last_logs` before removal.

    Raises:
        ValueError: (configuration fault) settings an enclave cannot have
            (:class:`~.enclave_spec.EnclaveSettings`).
    """

    def __init__(
        self,
        settings: RunnerSettings,
        options: EnclaveOptions,
        *,
        keep_logs: bool = False,
        client_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.settings = settings
        self.options = options
        self.enclave: EnclaveSettings = enclave_settings(settings, options, os.cpu_count())
        self.oci_runtime = ENCLAVE_OCI_RUNTIMES[settings.runtime]
        self._seccomp = enclave_profile_json(self.oci_runtime)
        self._client_factory = client_factory or self._default_client
        self._client: Any = None
        self._keep_logs = keep_logs
        #: the network and proxy as preflight found them (ids pinned)
        self.expected = ExpectedTopology(options.network, options.proxy_address)
        #: the invocation whose disarm failed; nothing launches until it is disarmed
        self.pending_disarm: str | None = None
        #: the last enclave's log (``keep_logs`` only)
        self.last_logs = b""

    def _default_client(self) -> Any:
        return engine.api_client(self.settings.docker_host)

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
        """Prove the engine, the runtime, the image, the network, the proxy and a probe.

        Pins the network's and the proxy's ids for every later topology check.

        Raises:
            RunnerUnavailable: (operator-facing reason) the engine is
                unreachable; the OCI runtime is not registered; the image is
                missing (never pulled) or not built for the engine; the
                network is missing or not as set up; the proxy's control
                socket does not answer or the proxy is armed; a networked
                probe container does not start and exit 0 on the runtime
                (gVisor here). Never falls back to another runtime.
        """
        host = self.settings.docker_host
        socket_path = policy.docker_socket_path(host)
        if socket_path and not await trio.Path(socket_path).exists():
            raise RunnerUnavailable(f"Docker engine at {host} unreachable: no such socket")
        try:
            info = await self._call(self.api.info)
        except Exception as exc:
            raise RunnerUnavailable(f"Docker engine at {host} unreachable: {exc}") from exc
        runtimes = info.get("Runtimes") if isinstance(info, dict) else None
        if not isinstance(runtimes, dict) or self.oci_runtime not in runtimes:
            raise RunnerUnavailable(
                f"OCI runtime {self.oci_runtime!r} for enclaves on {self.settings.runtime!r} "
                "is not registered with dockerd; see .ci/provision-engine"
            )
        await self._check_image()
        try:
            verdict = await self._topology(self.expected)
        except Exception as exc:
            raise RunnerUnavailable(f"enclave network {self.options.network!r}: {exc}") from exc
        if not verdict.ok:
            raise RunnerUnavailable(f"{verdict.reason} ({self.options.network})")
        self.expected = ExpectedTopology(
            self.options.network, self.options.proxy_address, verdict.network_id, verdict.proxy_id
        )
        try:
            answer = await proxy_control.status(self.options.control_socket)
        except proxy_control.ProxyControlError as exc:
            raise RunnerUnavailable(
                f"API proxy control socket {self.options.control_socket}: {exc}"
            ) from exc
        if answer.armed:
            raise RunnerUnavailable(
                "the API proxy is already armed (for an invocation this broker never ran)"
            )
        await self._probe()

    async def _check_image(self) -> None:
        image = self.settings.image
        try:
            found = await self._call(self.api.inspect_image, image)
        except Exception as exc:
            raise RunnerUnavailable(
                f"enclave image {image!r} is not present (it is never pulled); "
                f"run .ci/build-images: {exc}"
            ) from exc
        config = found.get("Config") if isinstance(found, dict) else None
        labels = (config.get("Labels") if isinstance(config, dict) else None) or {}
        if labels.get(LABEL_ENCLAVE_ENGINE) != self.options.engine:
            raise RunnerUnavailable(
                f"enclave image {image!r} is labelled for engine "
                f"{labels.get(LABEL_ENCLAVE_ENGINE)!r}, not {self.options.engine!r}"
            )

    async def _probe(self) -> None:
        probe_id = secrets.token_hex(8)
        body = probe_body(self.enclave, self._seccomp, probe_id)
        name = f"{enclave_name(self.settings.run_id, probe_id)}-probe"
        container_id: str | None = None
        try:
            created = await self._call(self.api.create_container_from_config, body, name)
            container_id = str(created["Id"])
            await self._call(self.api.start, container_id)
            result = await self._call(self.api.wait, container_id, timeout=PROBE_TIMEOUT_S)
        except Exception as exc:
            raise RunnerUnavailable(
                f"a networked enclave probe on runtime {self.oci_runtime!r} failed "
                f"(no fallback to another runtime): {exc}"
            ) from exc
        finally:
            with trio.CancelScope(shield=True):
                await self._call(remove_container, self.api, container_id or name)
        code = result.get("StatusCode") if isinstance(result, dict) else None
        if code != 0:
            raise RunnerUnavailable(
                f"the enclave probe on runtime {self.oci_runtime!r} exited with {code}"
            )

    async def _topology(
        self, expected: ExpectedTopology, also_allowed: frozenset[str] = frozenset()
    ) -> TopologyVerdict:
        """Inspect the network and judge it (a network the engine does not know is a verdict).

        Raises:
            Exception: whatever else the engine raised.
        """
        import docker.errors

        try:
            doc = await self._call(self.api.inspect_network, expected.network)
        except docker.errors.NotFound:
            return TopologyVerdict(f"enclave network: {expected.network!r} does not exist")
        return topology_verdict(doc, expected, also_allowed)

    # -- one invocation ----------------------------------------------------

    async def run(self, invocation: Invocation) -> RunReport:
        """Run one invocation (contract: :class:`bounded_query.broker.runner.Runner`)."""
        phases: dict[str, float] = {}
        clock = PhaseClock(phases)
        self.last_logs = b""
        if self.pending_disarm is not None:
            with clock("disarm"):
                disarmed = await self._disarm(self.pending_disarm)
            if not disarmed:
                return RunReport(CATEGORY_ENCLAVE_PROXY, phases)
            self.pending_disarm = None
        try:
            payload = decode_agent_payload(invocation.script)
        except PayloadError:
            return RunReport(CATEGORY_RUNNER_INTERNAL, phases)  # the broker's bug
        placeholder = secrets.token_hex(PLACEHOLDER_BYTES)
        spec_invocation = EnclaveInvocation(
            invocation_id=invocation.invocation_id,
            seed_dir=str(invocation.seed_dir),
            workspace=str(invocation.workspace),
            placeholder=placeholder,
        )
        try:
            with clock("prepare"):
                files = workspace_files(self.enclave, payload)
                await trio.to_thread.run_sync(_prepare_workspace, invocation.workspace, files)
        except OSError:
            return RunReport(CATEGORY_RUNNER_INTERNAL, phases)
        failure: str | None
        try:
            failure = await self._armed_run(invocation.invocation_id, spec_invocation, phases)
        finally:
            with trio.CancelScope(shield=True), clock("disarm"):
                disarmed = await self._disarm(invocation.invocation_id)
            if not disarmed:
                self.pending_disarm = invocation.invocation_id
        if not disarmed and failure is None:
            failure = CATEGORY_ENCLAVE_PROXY
        if failure is not None:
            return RunReport(failure, phases)
        with clock("result"):
            result = await trio.to_thread.run_sync(
                read_result_file, invocation.workspace / RESULT_FILE, self.options.max_output_bytes
            )
        return RunReport(None, phases, result)

    async def _armed_run(
        self, invocation_id: str, spec_invocation: EnclaveInvocation, phases: dict[str, float]
    ) -> str | None:
        """Arm, check, launch, wait, remove; the failure category or None."""
        clock = PhaseClock(phases)
        with clock("arm"):
            try:
                armed = await proxy_control.arm(
                    self.options.control_socket, invocation_id, spec_invocation.placeholder
                )
            except proxy_control.ProxyControlError:
                return CATEGORY_ENCLAVE_PROXY
        if not armed.accepted:
            return CATEGORY_ENCLAVE_PROXY
        try:
            with clock("topology"):
                verdict = await self._topology(self.expected)
        except Exception:
            return CATEGORY_RUNNER_INTERNAL  # the engine's error, not the topology's
        if not verdict.ok:
            return CATEGORY_ENCLAVE_TOPOLOGY
        name, body = enclave_spec(
            self.enclave, spec_invocation, self._seccomp, keep_logs=self._keep_logs
        )
        launched: list[str] = []
        try:
            failure = await self._launch(name, body, launched, phases)
        finally:
            with trio.CancelScope(shield=True), clock("remove"):
                gone = await self._remove(launched[0] if launched else name)
        return failure if gone else CATEGORY_CLEANUP_FAILED

    async def _launch(
        self, name: str, body: dict[str, Any], launched: list[str], phases: dict[str, float]
    ) -> str | None:
        """Create, start, re-check and wait for the enclave (its id goes to ``launched``)."""
        clock = PhaseClock(phases)
        try:
            with clock("create"):
                created = await self._call(self.api.create_container_from_config, body, name)
            container_id = str(created["Id"])
            launched.append(container_id)
            with clock("start"):
                await self._call(self.api.start, container_id)
        except Exception:
            return CATEGORY_LAUNCH_FAILED
        try:
            with clock("topology"):
                verdict = await self._topology(self.expected, frozenset({container_id}))
        except Exception:
            return CATEGORY_RUNNER_INTERNAL
        if not verdict.ok:
            return CATEGORY_ENCLAVE_TOPOLOGY  # the caller's removal kills it
        return await self._wait(container_id, phases)

    async def _wait(self, container_id: str, phases: dict[str, float]) -> str | None:
        """Wait for the enclave to exit within the timeout; the failure category or None."""
        clock = PhaseClock(phases)
        with clock("engine"), trio.move_on_after(self.settings.timeout_s) as scope:
            try:
                await trio.to_thread.run_sync(
                    lambda: self.api.wait(container_id, timeout=None), abandon_on_cancel=True
                )
            except Exception:
                return CATEGORY_RUNNER_INTERNAL
        if scope.cancelled_caught:
            with contextlib.suppress(Exception):
                await self._call(self.api.kill, container_id)
            return CATEGORY_TIMEOUT
        try:
            state = (await self._call(self.api.inspect_container, container_id))["State"]
        except Exception:
            return CATEGORY_RUNNER_INTERNAL
        if self._keep_logs:
            with contextlib.suppress(Exception):
                self.last_logs = bytes(await self._call(self.api.logs, container_id))
        return exit_failure(state)

    async def _remove(self, container: str) -> bool:
        """Force-remove the enclave, then confirm the engine no longer knows it."""
        import docker.errors

        if not await self._call(remove_container, self.api, container):
            return False
        try:
            await self._call(self.api.inspect_container, container)
        except docker.errors.NotFound:
            return True
        except Exception:
            return False
        return False

    async def _disarm(self, invocation_id: str) -> bool:
        """Disarm for ``invocation_id``; True when the proxy answered that it is disarmed.

        Any well-formed answer with ``armed`` false counts ("not-armed":
        the arm never took effect; "wrong-invocation": disarmed anyway).
        """
        try:
            answer = await proxy_control.disarm(self.options.control_socket, invocation_id)
        except proxy_control.ProxyControlError:
            return False
        return not answer.armed

    # -- the rest of the Runner protocol -----------------------------------

    async def reconcile(self) -> int:
        """Force-remove every container labelled with this run's agent run label; the count.

        Raises:
            RunnerUnavailable: the engine could not list the containers, or
                one of them could not be removed.
        """
        label = f"{LABEL_AGENT_RUN}={self.settings.run_id}"
        try:
            swept = await self._call(remove_labelled, self.api, label)
        except Exception as exc:
            raise RunnerUnavailable(f"cannot list enclave containers: {exc}") from exc
        if swept.failed:
            raise RunnerUnavailable(f"cannot remove enclave container {swept.failed[0][:12]}")
        return len(swept.removed)

    async def warm(self, seed_dirs: Iterable[Path]) -> Mapping[str, bool]:
        """Nothing to prepare: an enclave mounts its seed read-only as it is."""
        del seed_dirs
        return {}

    async def prepare(self, seed_dir: Path, work_root: Path) -> None:
        """Nothing to prepare (every enclave is created for its invocation)."""
        del seed_dir, work_root

    def degradations(self) -> tuple[Degradation, ...]:
        """No optional protection: every one is checked per invocation or fails closed."""
        return ()

    async def watch(self) -> Degradation:
        """Never returns: there is no protection to lose between invocations."""
        await trio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        """Close the engine client; idempotent, never raises."""
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await trio.to_thread.run_sync(client.close)
