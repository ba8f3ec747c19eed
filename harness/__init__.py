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
"""

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
