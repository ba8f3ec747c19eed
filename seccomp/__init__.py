"""The query sandbox's seccomp profile (spec 14.7) and the bounded-agent enclave's (spec 15.5).

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

``enclave.json`` is the bounded-agent enclave's profile (spec 15.5): the
query profile plus what the engines need (``seccomp/recipe/generate_enclave.py``
names each re-allowed call with its reason), including AF_INET sockets for
the one connection to the API proxy. Its runsc variant is for the enclave's
own gVisor registration (``runsc-net``).
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from bounded_query.broker.protocol import policy

__all__ = [
    "ENCLAVE_PROFILE_NAME",
    "ENCLAVE_PROFILE_RUNTIMES",
    "PROFILE_NAME",
    "QUERY_PROFILE_RUNTIMES",
    "enclave_profile_json",
    "load_enclave_profile",
    "load_profile",
    "profile_json",
]

#: File name of the profile inside this package.
PROFILE_NAME = "query.json"
#: File name of the bounded-agent enclave's profile.
ENCLAVE_PROFILE_NAME = "enclave.json"
#: OCI runtimes the query profile has a variant for: every launchable
#: runtime's (runc, runsc).
QUERY_PROFILE_RUNTIMES = frozenset(policy.OCI_RUNTIMES.values())
#: OCI runtimes the enclave profile has a variant for (runc, runsc-net).
ENCLAVE_PROFILE_RUNTIMES = frozenset(policy.ENCLAVE_OCI_RUNTIMES.values())
#: The runtimes that are gVisor (TRACE instead of ERRNO for clone3).
_GVISOR = frozenset({policy.OCI_RUNSC, policy.OCI_RUNSC_NET})


def _load(name: str, runtime: str, runtimes: frozenset[str]) -> dict[str, Any]:
    if runtime not in runtimes:
        raise ValueError(f"no {name} seccomp variant for runtime {runtime!r}")
    text = resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
    value = json.loads(text)
    if not isinstance(value, dict) or value.get("defaultAction") != "SCMP_ACT_ERRNO":
        raise ValueError(f"{name} is not a default-deny seccomp profile")
    rules = [r for r in value.get("syscalls", []) if r.get("names") == ["clone3"]]
    if len(rules) != 1:
        raise ValueError(f"{name} needs exactly one clone3 rule")
    if runtime in _GVISOR:
        rules[0]["action"] = "SCMP_ACT_TRACE"
    return value


def load_profile(runtime: str = policy.OCI_RUNC) -> dict[str, Any]:
    """The query profile for ``runtime`` as a fresh dict (see module docstring).

    Raises:
        ValueError: unknown runtime, or the shipped profile is not a
            default-deny profile with a clone3 rule (a packaging bug).
    """
    return _load(PROFILE_NAME, runtime, QUERY_PROFILE_RUNTIMES)


def load_enclave_profile(runtime: str = policy.OCI_RUNC) -> dict[str, Any]:
    """The enclave profile for ``runtime`` (``runc`` or ``runsc-net``) as a fresh dict.

    Raises:
        ValueError: as :func:`load_profile`.
    """
    return _load(ENCLAVE_PROFILE_NAME, runtime, ENCLAVE_PROFILE_RUNTIMES)


@functools.cache
def enclave_profile_json(runtime: str = policy.OCI_RUNC) -> str:
    """The enclave profile as compact JSON, for ``SecurityOpt: seccomp=<json>``.

    Raises:
        ValueError: as :func:`load_profile`.
    """
    return json.dumps(load_enclave_profile(runtime), separators=(",", ":"), sort_keys=True)


@functools.cache
def profile_json(runtime: str = policy.OCI_RUNC) -> str:
    """The profile as compact JSON, ready for ``SecurityOpt: seccomp=<json>``.

    Raises:
        ValueError: as :func:`load_profile`.
    """
    return json.dumps(load_profile(runtime), separators=(",", ":"), sort_keys=True)
