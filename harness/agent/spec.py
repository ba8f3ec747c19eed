"""The agent's container and environment, as plain values (spec 14.8).

Theory of operation: the agent never runs next to the harness's secrets. By
default it is a fresh container on the query engine whose whole view of the
host is spec 14.8's -- the socket directory (read-write), the skill/wrapper
directory (read-only) -- plus its workspace, each bind-mounted at its host
path so the three ``AWF_BOUNDED_QUERY_*`` variables mean the same inside and
out. It runs as a non-root uid with every capability dropped,
no-new-privileges, its own PID namespace (it cannot see or signal the
harness or the broker), no Docker socket and a tiny init (``docker-init``)
as PID 1 that forwards signals and reaps. Nothing below the private root is
mounted, so seeds, the journal, the audit log and the broker's config are
not in its file system at all.

This module only turns options into values: :func:`agent_environment` (the
variables, for either mode) and :func:`container_body` (the Engine API
``POST /containers/create`` body). The trio supervision lives in
``agent.py``. Nothing here does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from bounded_query.broker.protocol import policy
from bounded_query.broker.protocol.policy import LABEL_OWNER, LABEL_ROLE, LABEL_RUN
from bounded_query.harness.lifecycle.paths import AGENT_PRIVATE_PREFIX, PRIVATE_PREFIX
from bounded_query.harness.staging.tokens import TOKEN_VARIABLES

__all__ = [
    "AGENT_NETWORK_DEFAULT",
    "CONTAINER_PATH",
    "DEFAULT_AGENT_UID",
    "ROLE_AGENT",
    "AgentContainer",
    "AgentUser",
    "agent_environment",
    "container_body",
    "default_agent_user",
    "parse_agent_user",
]

#: The built-in agent image (``sandbox/agent_image/build.sh``).
#: The agent's uid/gid when the workspace belongs to root: an unprivileged id
#: no Debian package allocates (system ids end at 999, regular users start
#: at 1000 and rarely reach it) and not the query sandbox's 65534.
DEFAULT_AGENT_UID = 20000
#: Docker's default bridge; ``none`` leaves the agent with loopback only.
AGENT_NETWORK_DEFAULT = "bridge"
#: The agent container's PATH after the wrapper directory (the image's own
#: binaries; the host's PATH names host directories that are not mounted).
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Labels (policy.LABEL_RUN, LABEL_ROLE, LABEL_OWNER): the run (shared with
#: the query containers, so teardown's reconciliation removes the agent too),
#: the role (this value), and the harness that owns it (an owner record
#: document, so the next run's sweep can tell whether that harness is gone,
#: ``sweep.py``).
ROLE_AGENT = "agent"
#: Besides the staging credentials (spec 14.8): the Docker client's
#: configuration (the agent gets no engine).
_DROPPED_PREFIXES = ("DOCKER_",)
#: Host-only variables a container replaces (its HOME is a writable /tmp).
_CONTAINER_REPLACED = ("PATH", "HOME", "PWD", "OLDPWD", "HOSTNAME")
_NETWORK_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_ID_MAX = 2**32 - 2


@dataclass(frozen=True, slots=True)
class AgentUser:
    """The agent's uid and gid: never 0 (spec 14.8)."""

    uid: int
    gid: int

    def __post_init__(self) -> None:
        for name, value in (("uid", self.uid), ("gid", self.gid)):
            if type(value) is not int or not 0 < value <= _ID_MAX:
                raise ValueError(f"agent {name} must be an integer in 1..{_ID_MAX}, not {value!r}")

    def __str__(self) -> str:
        return f"{self.uid}:{self.gid}"


def parse_agent_user(text: str) -> AgentUser:
    """Parse ``UID[:GID]`` (numeric; GID defaults to UID).

    Raises:
        ValueError: not numeric, or 0 (root is never the agent's user).
    """
    uid_text, sep, gid_text = text.partition(":")
    if not uid_text.isdigit() or (sep and not gid_text.isdigit()) or len(text) > 21:
        raise ValueError(f"--agent-user {text!r}: expected UID[:GID] (numbers)")
    uid = int(uid_text)
    return AgentUser(uid, int(gid_text) if sep else uid)


def default_agent_user(workspace_uid: int, workspace_gid: int) -> AgentUser:
    """The workspace's owner when that is not root, else :data:`DEFAULT_AGENT_UID`."""
    if workspace_uid != 0 and workspace_gid != 0:
        return AgentUser(workspace_uid, workspace_gid)
    if workspace_uid != 0:
        return AgentUser(workspace_uid, workspace_uid)
    return AgentUser(DEFAULT_AGENT_UID, DEFAULT_AGENT_UID)


def _names_private_root(value: str, private_root: str) -> bool:
    return private_root in value or PRIVATE_PREFIX in value or AGENT_PRIVATE_PREFIX in value


def agent_environment(
    env: Mapping[str, str],
    *,
    socket_path: str,
    skill_file: str,
    slugs: tuple[str, ...],
    wrapper_dir: str,
    private_root: str,
    container: bool,
    agents: tuple[str, str, tuple[str, ...], str] | None = None,
) -> dict[str, str]:
    """The agent's environment (spec 14.8).

    The caller's variables minus the token variables, the ``DOCKER_*``
    variables and any variable whose name or value mentions the private root;
    plus the three ``AWF_BOUNDED_QUERY_*`` variables and the wrapper directory
    first on PATH. In a container the host's PATH, HOME and working-directory
    variables are replaced (HOME becomes ``/tmp``, the container's writable
    scratch directory). With bounded agents on, ``agents`` is their socket,
    SKILL.md, slugs and wrapper directory: the three ``AWF_BOUNDED_AGENT_*``
    variables (spec 15.8) and that directory first on PATH (``bounded-agent``;
    its ``bounded-query-mcp`` serves both tools with the run's task limit).
    """
    out: dict[str, str] = {}
    for key, value in env.items():
        if key in TOKEN_VARIABLES or key.startswith(_DROPPED_PREFIXES):
            continue
        if _names_private_root(key, private_root) or _names_private_root(value, private_root):
            continue
        if container and key in _CONTAINER_REPLACED:
            continue
        out[key] = value
    out[policy.ENV_SOCKET] = socket_path
    out[policy.ENV_SKILL] = skill_file
    out[policy.ENV_REPOS] = ",".join(slugs)
    if agents is not None:
        agent_socket, agent_skill, agent_slugs, agent_wrapper_dir = agents
        out[policy.ENV_AGENT_SOCKET] = agent_socket
        out[policy.ENV_AGENT_SKILL] = agent_skill
        out[policy.ENV_AGENT_REPOS] = ",".join(agent_slugs)
        wrapper_dir = f"{agent_wrapper_dir}:{wrapper_dir}"
    if container:
        out["PATH"] = f"{wrapper_dir}:{CONTAINER_PATH}"
        out["HOME"] = "/tmp"
    else:
        path = env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        out["PATH"] = f"{wrapper_dir}:{path}" if path else wrapper_dir
    return out


@dataclass(frozen=True, slots=True)
class AgentContainer:
    """Everything the agent container is made of; validated on construction."""

    image: str
    argv: tuple[str, ...]
    workspace: str
    socket_dir: str
    skill_dir: str
    env: Mapping[str, str]
    user: AgentUser
    run_id: str
    owner: str
    network: str = AGENT_NETWORK_DEFAULT
    tty: bool = False
    cpuset: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    #: The bounded-agent ingress directories (spec 15.8): (host path, read-only),
    #: mounted at their host paths like the query ones.
    extra_mounts: tuple[tuple[str, bool], ...] = ()

    def __post_init__(self) -> None:
        if not self.image or any(c.isspace() for c in self.image):
            raise ValueError(f"agent image {self.image!r} is not an image reference")
        if not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise ValueError("the agent command is empty")
        mounts = (
            self.workspace,
            self.socket_dir,
            self.skill_dir,
            *(p for p, _ in self.extra_mounts),
        )
        for path in mounts:
            if not path.startswith("/") or "\0" in path:
                raise ValueError(f"mount source {path!r} is not an absolute path")
        if len(set(mounts)) != len(mounts):
            raise ValueError("the workspace must differ from the socket and skill directories")
        if _NETWORK_RE.fullmatch(self.network) is None or self.network in ("host", "container"):
            raise ValueError(f"agent network {self.network!r} is not allowed")
        if self.network.startswith("container:"):
            raise ValueError("the agent may not join another container's network")
        if not self.run_id:
            raise ValueError("the agent container needs the run id label")


def container_body(spec: AgentContainer) -> dict[str, object]:
    """The Engine API create body of the agent container (``-it``-like with a TTY).

    Exactly three bind mounts, each at its host path: the workspace
    (read-write), the socket directory (read-write), the skill/wrapper
    directory (read-only); with bounded agents, their socket directory and
    skill directory after them. ``CapDrop: ALL``, ``no-new-privileges``, a private
    PID and IPC namespace, no devices, no extra groups, ``Init`` for signal
    forwarding; ``CpusetCpus`` when given.
    """

    def bind(path: str, read_only: bool) -> dict[str, object]:
        return {
            "Type": "bind",
            "Source": path,
            "Target": path,
            "ReadOnly": read_only,
            "BindOptions": {"Propagation": "rprivate"},
        }

    host_config: dict[str, object] = {
        "Mounts": [
            bind(spec.workspace, False),
            bind(spec.socket_dir, False),
            bind(spec.skill_dir, True),
            *(bind(path, read_only) for path, read_only in spec.extra_mounts),
        ],
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges:true"],
        "Privileged": False,
        "PidMode": "",
        "IpcMode": "private",
        "NetworkMode": spec.network,
        "Init": True,
        "GroupAdd": [],
        "Devices": [],
        "AutoRemove": False,
        "RestartPolicy": {"Name": "no"},
    }
    if spec.cpuset is not None:
        host_config["CpusetCpus"] = spec.cpuset
    labels = {
        **dict(spec.labels),
        LABEL_RUN: spec.run_id,
        LABEL_ROLE: ROLE_AGENT,
        LABEL_OWNER: spec.owner,
    }
    return {
        "Image": spec.image,
        "Cmd": list(spec.argv),
        "User": str(spec.user),
        "Env": [f"{k}={v}" for k, v in sorted(spec.env.items())],
        "WorkingDir": spec.workspace,
        "Labels": labels,
        "Tty": spec.tty,
        "OpenStdin": spec.tty,
        "StdinOnce": spec.tty,
        "AttachStdin": spec.tty,
        "AttachStdout": True,
        "AttachStderr": True,
        "NetworkDisabled": spec.network == "none",
        "HostConfig": host_config,
    }
