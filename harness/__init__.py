"""Host-side harness for AWF bounded queries (spec 14.2, 14.6, 14.8).

Module map (the file list reads as the pipeline):

* ``config``     load JSON/YAML/stdin, validate ``boundedQueries`` with the
                 shipped JSON Schema, normalize (14.2)
* ``paths``      private root and ingress root, overlap check (14.8)
* ``preflight``  fail-closed checks before any clone (14.2)
* ``staging``    offline staging: askpass clone, scrub, read-only seeds (14.6)
* ``skill``      SKILL.md with protocol-computed charges (14.8)
* ``outputs``    seed map, broker config, wrapper directory (14.6, 14.8)
* ``tokens``     the staging token wiped from the harness's own environ (14.6)
* ``options``    what a run is asked to do (``RunOptions``), exit statuses
* ``plan``       every decision of prepare and teardown as a value, no I/O
* ``prepare``    sweep, preflight, roots, staging, outputs: a plan executed
* ``orchestrate`` ``run``: the phases in order, broker child and readiness
* ``supervise``  the agent in its mode, signals forwarded, stopped at the end
* ``teardown``   undo the run on every path; the one container reconcile
* ``reaper``     the detached process that undoes a run whose harness was SIGKILLed
* ``sweep``      owner records; the next start removes what a killed run left
* ``reporting``  problem events and step-summary Markdown
* ``child``      the broker as a child process (parent-death signal)
* ``agent_spec`` the agent container's body and environment, as values (14.8)
* ``agent``      the agent in its container or on the host: start, signal, stop
* ``hostcheck``  the fail-closed probe before a host agent starts (14.8)
* ``summary``    per-repository usage and the step summary
* ``events``     JSONL events on stderr, GITHUB_STEP_SUMMARY
* ``compose``    registry-free broker image and the compose document (14.7)
* ``compose_run`` the ``compose`` / ``compose-down`` commands
* ``demo``       the built-in example end to end
"""

from .config import BoundedQueriesConfig, ConfigError, LoadedConfig, PrivateRepo, load_config
from .events import EventSink
from .options import RunOptions
from .orchestrate import run
from .paths import RunPaths, run_paths

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
