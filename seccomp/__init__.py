"""The query sandbox's seccomp profile (spec 14.7).

``query.json`` is a Docker seccomp profile: default action errno EPERM, an
allow-list traced from python3 and git (recipe in ``seccomp/recipe/``), and
argument filters that deny namespace-creating ``clone`` flags and every socket
family but AF_UNIX. ``clone3`` must fail with ENOSYS (seccomp cannot read its
flag struct, and glibc falls back to the filterable ``clone`` only on
ENOSYS; with EPERM, Python cannot start threads).

gVisor variant: Debian's runsc (2022-12) ignores a rule's ``errnoRet`` and
answers EPERM, so for ``runsc`` the clone3 rule becomes ``SCMP_ACT_TRACE``:
with no tracer attached (ptrace is denied) the call fails with ENOSYS, as on
Linux. runc refuses to start a container with a TRACE rule, hence two
variants of one file.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from bounded_query.broker.protocol import policy

__all__ = ["PROFILE_NAME", "load_profile", "profile_json"]

#: File name of the profile inside this package.
PROFILE_NAME = "query.json"


def load_profile(runtime: str = policy.OCI_RUNC) -> dict[str, Any]:
    """The profile for ``runtime`` as a fresh dict (see module docstring).

    Raises:
        ValueError: unknown runtime, or the shipped profile is not a
            default-deny profile with a clone3 rule (a packaging bug).
    """
    # A variant for every launchable runtime's OCI runtime (runc, runsc).
    if runtime not in policy.OCI_RUNTIMES.values():
        raise ValueError(f"no seccomp profile variant for runtime {runtime!r}")
    text = resources.files(__name__).joinpath(PROFILE_NAME).read_text(encoding="utf-8")
    value = json.loads(text)
    if not isinstance(value, dict) or value.get("defaultAction") != "SCMP_ACT_ERRNO":
        raise ValueError(f"{PROFILE_NAME} is not a default-deny seccomp profile")
    rules = [r for r in value.get("syscalls", []) if r.get("names") == ["clone3"]]
    if len(rules) != 1:
        raise ValueError(f"{PROFILE_NAME} needs exactly one clone3 rule")
    if runtime == policy.OCI_RUNSC:
        rules[0]["action"] = "SCMP_ACT_TRACE"
    return value


@functools.cache
def profile_json(runtime: str = policy.OCI_RUNC) -> str:
    """The profile as compact JSON, ready for ``SecurityOpt: seccomp=<json>``.

    Raises:
        ValueError: as :func:`load_profile`.
    """
    return json.dumps(load_profile(runtime), separators=(",", ":"), sort_keys=True)
