"""Removing containers by label: the one reconcile every caller uses (spec 14.7, 14.8).

Theory of operation: containers of a run carry the run label
(``bounded-query.run=<run id>``); the agent container also carries its role
and owner labels. Three callers remove labelled containers, all through
:func:`remove_labelled`:

* ``DockerRunner.reconcile`` (``docker_runner.py``): the broker at start and
  shutdown removes every query container of its run;
* the harness's teardown and ``compose-down`` (``harness/teardown.py``): once
  the broker is gone, whatever is left with the run label (queries of a
  broker that died, the agent container);
* the harness's sweep of agent containers whose harness was killed
  (``harness/agent.py``), with a ``select`` on the owner label.

Each container is force-removed with its anonymous volumes; a container the
engine no longer knows counts as removed, and a failed removal is tried once
more (a concurrent "removal in progress" ends as gone).

The broker's named volumes (the per-seed view layers and the per-invocation
overlays, ``overlay.py``) carry the run label too. A broker that shuts down
removes its own; one that was killed leaves them, so once the containers are
gone the harness's teardown and ``compose-down`` also remove every volume
with the run label (:func:`remove_labelled_volumes`): an overlay volume under
the private root must be unmounted before the root and its quota go. The functions block
on the Engine API (a docker SDK ``APIClient``): async callers run them in a
worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "RECONCILE_TIMEOUT_S",
    "Removal",
    "remove_container",
    "remove_labelled",
    "remove_labelled_volumes",
    "remove_volume",
]


#: HTTP timeout of one Engine API call of a harness-side reconcile (teardown,
#: the reaper, compose-down): removing a container whose tmpfs holds a large
#: tree can take seconds on a loaded machine.
RECONCILE_TIMEOUT_S = 60


@dataclass(frozen=True, slots=True)
class Removal:
    """The outcome of one :func:`remove_labelled`: container ids, in listing order."""

    removed: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()


def remove_container(api: Any, container: str) -> bool:
    """Force-remove one container (by id or name) and its anonymous volumes; True when gone."""
    import docker.errors

    for _attempt in range(2):
        try:
            api.remove_container(container, v=True, force=True)
        except docker.errors.NotFound:
            return True
        except Exception:  # the engine's reason does not change the retry
            continue
        return True
    return False


def remove_labelled(
    api: Any,
    label: str,
    *,
    select: Callable[[Mapping[str, str]], bool] | None = None,
) -> Removal:
    """Force-remove every container (running or not) matching the ``label`` filter.

    ``label`` is an engine filter (``key=value`` or ``key``); with ``select``
    only the containers whose labels it accepts are removed.

    Raises:
        Exception: whatever the engine raised listing the containers (nothing
            was removed then).
    """
    removed: list[str] = []
    failed: list[str] = []
    for entry in api.containers(all=True, filters={"label": label}):
        if select is not None and not select(entry.get("Labels") or {}):
            continue
        ident = str(entry["Id"])
        (removed if remove_container(api, ident) else failed).append(ident)
    return Removal(tuple(removed), tuple(failed))


def remove_volume(api: Any, name: str, *, attempts: int = 3, pause_s: float = 0.05) -> bool:
    """Force-remove one volume (dockerd unmounts it); True when gone (blocking).

    A volume the engine no longer knows counts as removed. A failed attempt
    ("volume is in use" right after its container's removal) is retried
    after ``pause_s``, up to ``attempts`` in all.
    """
    import docker.errors

    for _attempt in range(attempts):
        try:
            api.remove_volume(name, force=True)
        except docker.errors.NotFound:
            return True
        except Exception:  # the engine's reason does not change the retry
            time.sleep(pause_s)
            continue
        return True
    return False


def remove_labelled_volumes(api: Any, label: str) -> Removal:
    """Force-remove every volume matching the ``label`` filter (after its containers).

    Each goes through :func:`remove_volume` (the runner's own removal).

    Raises:
        Exception: whatever the engine raised listing the volumes (nothing
            was removed then).
    """
    removed: list[str] = []
    failed: list[str] = []
    listing = api.volumes(filters={"label": label}) or {}
    for entry in listing.get("Volumes") or ():
        name = str(entry["Name"])
        (removed if remove_volume(api, name) else failed).append(name)
    return Removal(tuple(removed), tuple(failed))
