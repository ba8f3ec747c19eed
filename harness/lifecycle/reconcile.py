"""The run's one engine reconcile: its compose service, containers and volumes, by label.

Teardown, the reaper (when the harness was killed), the sweep of a dead run
and ``compose-down`` all remove a run's engine objects the same way, through
here; the remove-by-label mechanics are ``sandbox/reconcile.py``'s.
"""

from __future__ import annotations

from bounded_query.broker.protocol.policy import LABEL_RUN
from bounded_query.harness.compose.service import HARNESS_LABEL
from bounded_query.sandbox import engine
from bounded_query.sandbox.reconcile import (
    RECONCILE_TIMEOUT_S,
    remove_labelled,
    remove_labelled_volumes,
)

__all__ = ["reconcile_containers"]


def reconcile_containers(docker_host: str, run_id: str) -> int:
    """Force-remove every container, then every volume, labelled with ``run_id``.

    The one label reconcile (``sandbox/reconcile.py``), as the broker runs it,
    plus the volumes a killed broker left (mounted under the private root).
    The compose broker service of a ``run --compose`` goes first: it carries
    its own label (``compose/service.py``'s ``HARNESS_LABEL``, never the run
    label, so a broker's reconcile cannot catch itself), and a broker still running could
    start a query after the listing. Returns the number of containers
    removed (blocking).

    Raises:
        Exception: the engine could not be reached or could not list containers.
    """
    api = engine.api_client(docker_host, RECONCILE_TIMEOUT_S)
    try:
        services = remove_labelled(api, f"{HARNESS_LABEL}={run_id}").removed
        removed = remove_labelled(api, f"{LABEL_RUN}={run_id}").removed
        remove_labelled_volumes(api, f"{LABEL_RUN}={run_id}")
        return len(services) + len(removed)
    finally:
        api.close()
