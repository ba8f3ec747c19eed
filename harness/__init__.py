"""Host-side harness for AWF bounded queries (spec 14.2, 14.6, 14.8).

The harness's parts, in the order a run meets them (each subpackage's
docstring lists its modules; docs/architecture.md has the map):

* ``configuration``  the ``boundedQueries`` section, the channel policy, preflight, images
* ``staging``        seeds, the token's removal, what the broker and the agent are given
* ``lifecycle``      options, the pure plan, preparation, orchestration, the broker child,
                     teardown, the sweep, the quota, the reaper
* ``agent``          the agent's container or host process, its supervision, the host check
* ``records``        events, usage and the step summary, progress, ``report``, notices
* ``compose``        the broker as a compose service; ``compose``/``compose-down``
* ``demo``           the built-in example end to end; ``__main__`` parses and dispatches

The names below load their modules on first use, so a process that needs one
small module (the reaper: ``python3 -I -m bounded_query.harness.lifecycle.reaper``)
does not import the whole harness, trio and the docker SDK with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bounded_query.harness.configuration.config import (
        BoundedQueriesConfig,
        ConfigError,
        LoadedConfig,
        PrivateRepo,
        load_config,
    )
    from bounded_query.harness.lifecycle.options import RunOptions
    from bounded_query.harness.lifecycle.orchestrate import run
    from bounded_query.harness.lifecycle.paths import RunPaths, run_paths
    from bounded_query.harness.records.events import EventSink

#: Public name -> the module that defines it.
_HOMES = {
    "BoundedQueriesConfig": "bounded_query.harness.configuration.config",
    "ConfigError": "bounded_query.harness.configuration.config",
    "LoadedConfig": "bounded_query.harness.configuration.config",
    "PrivateRepo": "bounded_query.harness.configuration.config",
    "load_config": "bounded_query.harness.configuration.config",
    "RunOptions": "bounded_query.harness.lifecycle.options",
    "run": "bounded_query.harness.lifecycle.orchestrate",
    "RunPaths": "bounded_query.harness.lifecycle.paths",
    "run_paths": "bounded_query.harness.lifecycle.paths",
    "EventSink": "bounded_query.harness.records.events",
}

__all__ = [
    "BoundedQueriesConfig",
    "ConfigError",
    "EventSink",
    "LoadedConfig",
    "PrivateRepo",
    "RunOptions",
    "RunPaths",
    "load_config",
    "run",
    "run_paths",
]


def __getattr__(name: str) -> Any:
    """Import the module defining ``name`` on first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
