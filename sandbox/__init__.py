"""Query sandbox backends (spec 14.7).

``create_runner(settings)`` builds the runner for the configured runtime:
``"docker"`` (runc) and ``"gvisor"`` (runsc) share :class:`DockerRunner`;
``"sbx"`` raises :class:`~bounded_query.broker.runner.RunnerUnavailable`
carrying :func:`sbx_capability_report` and never launches anything.
"""

from __future__ import annotations

from bounded_query.broker.protocol.policy import LAUNCHABLE_RUNTIMES, RUNTIME_SBX
from bounded_query.broker.runner import Runner, RunnerSettings

from .docker_runner import DockerRunner, RunnerOptions, prepare_workspace
from .sbx import sbx_capability_report, sbx_unavailable
from .spec import ContainerSpec, container_spec, probe_spec, translate_host_path

__all__ = [
    "ContainerSpec",
    "DockerRunner",
    "RunnerOptions",
    "container_spec",
    "create_runner",
    "prepare_workspace",
    "probe_spec",
    "sbx_capability_report",
    "translate_host_path",
]


def create_runner(settings: RunnerSettings) -> Runner:
    """Return the runner for ``settings.runtime``.

    Raises:
        RunnerUnavailable: runtime "sbx" (always blocked, with the report).
        ValueError: any other unknown runtime (a configuration bug upstream).
    """
    if settings.runtime == RUNTIME_SBX:
        raise sbx_unavailable()
    if settings.runtime in LAUNCHABLE_RUNTIMES:
        return DockerRunner(settings)
    raise ValueError(f"unknown query runtime {settings.runtime!r}")
