"""Container specification of one bounded-agent enclave (spec 15.5, 15.6), as plain values.

Theory of operation: like :mod:`.spec` for queries, everything about an
enclave is derived here from trusted inputs only -- :class:`EnclaveSettings`
(the operator's ``boundedAgents`` configuration and the run's network), the
broker-generated ids, paths and placeholder credential of an
:class:`EnclaveInvocation`, and the enclave seccomp profile -- into the exact
JSON body of the Engine API's ``POST /containers/create``. No docker, trio or
os import. The caller's task and schema travel as files the broker wrote,
never as arguments, variables or labels.

Layout seen by the enclave (uid/gid 65534, read-only root):

* ``/awf/seed`` - the immutable seed, bind-mounted read-only (the engine's
  working directory; there is no writable copy of private source anywhere);
* ``/awf/task.txt``, ``/awf/schema.json`` - the task and schema, read-only;
* ``/agent`` - a bounded tmpfs: the engine's HOME (``/agent/home``) and the
  result file ``/agent/result.json``, bind-mounted read-write from the
  workspace (a mount point cannot be renamed over or unlinked);
* ``/tmp`` - a bounded tmpfs;
* ``/proc/stat`` (copilot only, :data:`ENGINE_WORKSPACE_FILES`) - the
  constant :data:`PROC_STAT` from the workspace, instead of the mask every
  other engine runs with (copilot aborts on an empty /proc/stat);
* ``/etc/hosts`` and ``/etc/resolv.conf`` - constant files from the
  workspace (:func:`hosts_file`, :data:`RESOLV_CONF`): the proxy's alias is
  the only name, and there is no name server, so nothing depends on Docker's
  embedded DNS, which on this engine (20.10) forwards queries from internal
  networks upstream (CVE-2024-29018). ``Dns`` names the proxy's own address
  as well, so even a query sent straight to the embedded resolver at
  127.0.0.11 is forwarded only inside the enclave network, where nothing
  answers.

Network (spec 15.6): the enclave is a member of exactly one network, the
run's internal enclave network, on which the API proxy has a fixed address;
the engine reaches its model at ``http://<proxy alias>:<port>`` with a
per-invocation placeholder credential (the proxy holds the real one).

Hardening: no capabilities, no-new-privileges, the enclave seccomp profile
(``seccomp/enclave.json``: the query profile plus what the engines need),
memory = memory+swap, CPUs, PIDs, RLIMIT_FSIZE/NOFILE, no core files, the
query containers' masked ``/proc`` and ``/sys`` paths (Claude Code runs with
all of them), a private IPC namespace, no logs kept (stdout and stderr are
discarded, spec 15.5), and the image is never pulled (the runner refuses a
missing image).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bounded_query.broker.protocol.policy import (
    ENCLAVE_API_PROXY_ALIAS,
    ENCLAVE_ENGINES,
    ENCLAVE_OCI_RUNTIMES,
    LABEL_AGENT_INVOCATION,
    LABEL_AGENT_RUN,
    LABEL_ROLE,
    QUERY_GID,
    QUERY_UID,
    RUN_ID_PATTERN,
)

from .cpus import query_cpus
from .spec import MASKED_PATHS, READONLY_PATHS, translate_host_path

__all__ = [
    "ADAPTER_ENTRYPOINT",
    "ENCLAVE_HOSTNAME",
    "ENGINE_BASE_PATH",
    "ENGINE_ENDPOINT_ENV",
    "ENGINE_WORKSPACE_FILES",
    "NOFILE_LIMIT",
    "PROC_STAT",
    "RESOLV_CONF",
    "ROLE_ENCLAVE",
    "WORKSPACE_FILES",
    "EnclaveInvocation",
    "EnclaveSettings",
    "enclave_name",
    "enclave_spec",
    "engine_file_contents",
    "hosts_file",
    "network_spec",
    "workspace_files",
]

#: The image's fixed entrypoint (sandbox/enclave_adapter.py copied to
#: /awf/adapter.py), restated so a tampered image ENTRYPOINT changes nothing.
ADAPTER_ENTRYPOINT = ("/usr/bin/python3", "-I", "-S", "/awf/adapter.py")
#: Per engine: the variable holding its base URL and the one holding its
#: credential (ENGINES.md). The credential is the invocation's placeholder.
ENGINE_ENDPOINT_ENV: Mapping[str, tuple[str, str]] = {
    "claude": ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
    "copilot": ("COPILOT_PROVIDER_BASE_URL", "COPILOT_PROVIDER_API_KEY"),
}
#: Per engine, the path its base URL ends in: copilot's OpenAI client
#: appends ``/chat/completions`` to it (the proxy's route is
#: ``/v1/chat/completions``); claude appends ``/v1/messages`` itself.
ENGINE_BASE_PATH: Mapping[str, str] = {"claude": "", "copilot": "/v1"}
#: Open files per process: the engine's runtime (Bun) holds a few dozen
#: descriptors, a shell pipeline a few more.
NOFILE_LIMIT = 1024
#: /dev/shm, counted against the memory limit.
SHM_BYTES = 16 * 1024 * 1024
#: A constant hostname: nothing about the host or the invocation.
ENCLAVE_HOSTNAME = "enclave"
#: Constant resolver configuration: no name server line, so glibc tries
#: 127.0.0.1:53, where nothing listens (see the module docstring).
RESOLV_CONF = (
    "# bounded-agent enclave: no DNS; the API proxy is in /etc/hosts\n"
    "options attempts:1 timeout:1\n"
)
#: Label role of an enclave container.
ROLE_ENCLAVE = "enclave"
#: The files the broker writes into an invocation's workspace before the
#: enclave starts (host name -> in-enclave path, read-only unless noted).
WORKSPACE_FILES: Mapping[str, str] = {
    "task.txt": "/awf/task.txt",
    "schema.json": "/awf/schema.json",
    "result.json": "/agent/result.json",  # read-write, pre-created empty, owned by 65534
    "hosts": "/etc/hosts",
    "resolv.conf": "/etc/resolv.conf",
}
#: Per engine, files beyond :data:`WORKSPACE_FILES` (same form). Copilot
#: aborts (SIGABRT) when /proc/stat is masked (ENGINES.md), so it gets the
#: constant :data:`PROC_STAT` there instead of the host's counters.
ENGINE_WORKSPACE_FILES: Mapping[str, Mapping[str, str]] = {
    "copilot": {"proc-stat": "/proc/stat"},
}
#: The enclave's constant /proc/stat (copilot only): one idle CPU, all
#: counters zero, the same for every invocation, so it carries nothing from
#: the host or one invocation to the next (the host's file is a channel:
#: sandbox/spec.py masks it).
PROC_STAT = (
    "cpu  0 0 0 0 0 0 0 0 0 0\n"
    "cpu0 0 0 0 0 0 0 0 0 0 0\n"
    "intr 0\n"
    "ctxt 0\n"
    "btime 0\n"
    "processes 0\n"
    "procs_running 1\n"
    "procs_blocked 0\n"
    "softirq 0 0 0 0 0 0 0 0 0 0 0\n"
)
SEED_TARGET = "/awf/seed"
AGENT_TARGET = "/agent"
HOME_TARGET = "/agent/home"
TMP_TARGET = "/tmp"
ENGINE_PATH = "/opt/engine/bin:/usr/bin:/bin"
_NAME_PREFIX = "bq-enclave-"
_RESULT_FILE = "result.json"


def _is_hex(text: str, lengths: range) -> bool:
    return len(text) in lengths and all(c in "0123456789abcdef" for c in text)


def _ipv4(text: str) -> bool:
    parts = text.split(".")
    return len(parts) == 4 and all(
        p.isascii() and p.isdigit() and len(p) <= 3 and int(p) <= 255 and str(int(p)) == p
        for p in parts
    )


_RUN_ID_LENGTHS = range(16, 65)
assert RUN_ID_PATTERN == r"[0-9a-f]{16,64}", "update _RUN_ID_LENGTHS with the policy"


@dataclass(frozen=True, slots=True)
class EnclaveSettings:
    """Trusted, per-run settings of every enclave (spec 15.2, 15.6).

    ``network`` is the run's internal enclave network and ``proxy_address``
    the API proxy's fixed IPv4 address on it; ``proxy_port`` its port.
    ``model`` is the configured model (a request never chooses it).
    ``memory_bytes`` bounds memory and memory+swap, ``nano_cpus`` the CPUs
    (1e9 = one CPU), ``tmpfs_bytes`` each of /tmp and /agent.

    Raises:
        ValueError: (configuration fault, or a caller bug) any field outside
            its domain; such settings cannot exist.
    """

    runtime: str
    run_id: str
    image: str
    engine: str
    model: str
    network: str
    proxy_address: str
    proxy_port: int
    memory_bytes: int
    nano_cpus: int
    pids_limit: int
    tmpfs_bytes: int
    host_path_map: tuple[tuple[str, str], ...] = ()
    host_cpus: int | None = None

    def __post_init__(self) -> None:
        if self.runtime not in ENCLAVE_OCI_RUNTIMES:
            raise ValueError(f"runtime {self.runtime!r} cannot launch an enclave")
        if not _is_hex(self.run_id, _RUN_ID_LENGTHS):
            raise ValueError("run id must be 16-64 lower-case hex digits")
        if self.engine not in ENCLAVE_ENGINES:
            raise ValueError(f"engine {self.engine!r} has no enclave adapter")
        if not self.image or not self.network or not self.model:
            raise ValueError("image, network and model must be non-empty")
        if self.model.startswith("-") or any(c.isspace() or c == "\x00" for c in self.model):
            raise ValueError(f"model name {self.model!r} is not a plain name")
        if not _ipv4(self.proxy_address):
            raise ValueError(f"proxy address {self.proxy_address!r} is not an IPv4 address")
        if not 1 <= self.proxy_port <= 65535:
            raise ValueError(f"proxy port {self.proxy_port} out of range")
        for name in ("memory_bytes", "nano_cpus", "pids_limit", "tmpfs_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer")
        if self.tmpfs_bytes > self.memory_bytes:
            raise ValueError("tmpfs_bytes must not exceed memory_bytes (tmpfs pages count)")

    @property
    def base_url(self) -> str:
        """The engine's model endpoint: the proxy by its alias."""
        return f"http://{ENCLAVE_API_PROXY_ALIAS}:{self.proxy_port}"


@dataclass(frozen=True, slots=True)
class EnclaveInvocation:
    """One accepted bounded-agent invocation, built only from trusted values.

    ``invocation_id`` is broker-generated lower-case hex; ``seed_dir`` comes
    from the trusted seed map; ``workspace`` is the broker-private directory
    holding :data:`WORKSPACE_FILES`; ``placeholder`` is the random
    credential the broker armed the proxy with for this invocation only.

    Raises:
        ValueError: (caller bug) a malformed id, a relative path, or a
            placeholder that is not 32-128 hex digits.
    """

    invocation_id: str
    seed_dir: str
    workspace: str
    placeholder: str

    def __post_init__(self) -> None:
        if not _is_hex(self.invocation_id, range(8, 65)):
            raise ValueError("invocation id must be 8-64 lower-case hex digits")
        if not (self.seed_dir.startswith("/") and self.workspace.startswith("/")):
            raise ValueError("seed and workspace paths must be absolute")
        if not _is_hex(self.placeholder, range(32, 129)):
            raise ValueError("placeholder must be 32-128 lower-case hex digits")

    @property
    def result_path(self) -> str:
        """Host path of the result file (read by the broker after removal)."""
        return f"{self.workspace.rstrip('/')}/{_RESULT_FILE}"


def hosts_file(settings: EnclaveSettings) -> str:
    """The enclave's constant /etc/hosts: loopback and the API proxy, nothing else."""
    return (
        "127.0.0.1\tlocalhost\n"
        f"127.0.1.1\t{ENCLAVE_HOSTNAME}\n"
        f"{settings.proxy_address}\t{ENCLAVE_API_PROXY_ALIAS}\n"
    )


def network_spec(name: str, subnet: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments of the Engine API network create for an enclave network (spec 15.6).

    ``internal``: Docker installs no NAT and drops forwarded traffic to other
    interfaces. That alone is not enough on this engine (20.10): the bridge
    gets the subnet's first address and a container's default route points
    at it, so the *host* (every address it listens on, the default bridge's
    gateway included) is reachable from an internal network (measured:
    connect to a host listener succeeded). ``inhibit_ipv4`` leaves the
    bridge without an address: the default route Docker still installs
    leads to an address nobody holds, and the host is unreachable
    (measured: timeout / no route). The API proxy gets a fixed address in
    ``subnet``; no IPv6.
    """
    return {
        "name": name,
        "driver": "bridge",
        "internal": True,
        "check_duplicate": True,
        "enable_ipv6": False,
        "attachable": False,
        "options": {
            "com.docker.network.bridge.inhibit_ipv4": "true",
            "com.docker.network.bridge.enable_icc": "true",
        },
        "ipam": {"Driver": "default", "Config": [{"Subnet": subnet}]},
        "labels": dict(labels),
    }


def workspace_files(engine: str) -> Mapping[str, str]:
    """Every workspace file of an ``engine`` enclave: :data:`WORKSPACE_FILES` and its own.

    The broker writes each (``proc-stat`` is :data:`PROC_STAT`) before the
    enclave starts; :func:`enclave_spec` bind-mounts exactly these.
    """
    return {**WORKSPACE_FILES, **ENGINE_WORKSPACE_FILES.get(engine, {})}


def engine_file_contents(engine: str) -> Mapping[str, bytes]:
    """The constant bytes of ``engine``'s own workspace files (:data:`ENGINE_WORKSPACE_FILES`).

    The broker writes them read-only (0444) next to the common files; they
    are the same for every invocation.
    """
    contents = {"proc-stat": PROC_STAT.encode("ascii")}
    return {name: contents[name] for name in ENGINE_WORKSPACE_FILES.get(engine, {})}


def enclave_name(run_id: str, invocation_id: str) -> str:
    """The unique, predictable name of an invocation's enclave."""
    return f"{_NAME_PREFIX}{run_id[:16]}-{invocation_id}"


def _bind(source: str, target: str, *, read_only: bool) -> dict[str, Any]:
    return {
        "Type": "bind",
        "Source": source,
        "Target": target,
        "ReadOnly": read_only,
        "BindOptions": {"Propagation": "rprivate"},
    }


def _tmpfs(size: int, mode: str) -> str:
    return f"rw,nosuid,nodev,noexec,size={size},uid={QUERY_UID},gid={QUERY_GID},mode={mode}"


def enclave_spec(
    settings: EnclaveSettings,
    invocation: EnclaveInvocation,
    seccomp_json: str,
    *,
    keep_logs: bool = False,
) -> tuple[str, dict[str, Any]]:
    """The name and Engine API create body of one enclave (spec 15.5).

    ``keep_logs`` keeps a small local log of the adapter's and the engine's
    stderr for the tests and the benchmark; the broker never passes it.
    """
    hmap = settings.host_path_map
    workspace = invocation.workspace.rstrip("/")
    mounts = [
        _bind(translate_host_path(invocation.seed_dir, hmap), SEED_TARGET, read_only=True),
        *(
            _bind(
                translate_host_path(f"{workspace}/{name}", hmap),
                target,
                read_only=name != _RESULT_FILE,
            )
            for name, target in workspace_files(settings.engine).items()
        ),
    ]
    # A file the engine gets from the workspace is not masked as well (the
    # mask would bind /dev/null over it).
    replaced = set(ENGINE_WORKSPACE_FILES.get(settings.engine, {}).values())
    url_var, key_var = ENGINE_ENDPOINT_ENV[settings.engine]
    memory = settings.memory_bytes
    host_config: dict[str, Any] = {
        "Runtime": ENCLAVE_OCI_RUNTIMES[settings.runtime],
        "NetworkMode": settings.network,
        "Dns": [settings.proxy_address],
        "DnsOptions": [],
        "DnsSearch": [],
        "ExtraHosts": None,
        "PublishAllPorts": False,
        "PortBindings": {},
        "ReadonlyRootfs": True,
        "CapDrop": ["ALL"],
        "CapAdd": None,
        "Privileged": False,
        "SecurityOpt": ["no-new-privileges:true", f"seccomp={seccomp_json}"],
        "Memory": memory,
        "MemorySwap": memory,
        "NanoCpus": settings.nano_cpus,
        "PidsLimit": settings.pids_limit,
        "Ulimits": [
            {"Name": "nofile", "Soft": NOFILE_LIMIT, "Hard": NOFILE_LIMIT},
            {"Name": "fsize", "Soft": settings.tmpfs_bytes, "Hard": settings.tmpfs_bytes},
            {"Name": "core", "Soft": 0, "Hard": 0},
        ],
        "Tmpfs": {
            AGENT_TARGET: _tmpfs(settings.tmpfs_bytes, "0755"),
            TMP_TARGET: _tmpfs(settings.tmpfs_bytes, "1777"),
        },
        "ShmSize": SHM_BYTES,
        "Mounts": mounts,
        "IpcMode": "private",
        "AutoRemove": False,
        "LogConfig": (
            {"Type": "local", "Config": {"max-size": "1m", "max-file": "1", "compress": "false"}}
            if keep_logs
            else {"Type": "none", "Config": {}}
        ),
        "OomScoreAdj": 500,
        "RestartPolicy": {"Name": "no"},
        "MaskedPaths": [path for path in MASKED_PATHS if path not in replaced],
        "ReadonlyPaths": list(READONLY_PATHS),
    }
    if settings.host_cpus is not None:
        host_config["CpusetCpus"] = query_cpus(settings.host_cpus)
    body: dict[str, Any] = {
        "Image": settings.image,
        "Entrypoint": list(ADAPTER_ENTRYPOINT),
        "Cmd": [settings.engine, settings.model],
        "User": f"{QUERY_UID}:{QUERY_GID}",
        "WorkingDir": SEED_TARGET,
        "Env": [
            f"PATH={ENGINE_PATH}",
            "LANG=C.UTF-8",
            f"HOME={HOME_TARGET}",
            f"TMPDIR={TMP_TARGET}",
            f"{url_var}={settings.base_url}{ENGINE_BASE_PATH[settings.engine]}",
            f"{key_var}={invocation.placeholder}",
        ],
        "Hostname": ENCLAVE_HOSTNAME,
        "Domainname": "",
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "OpenStdin": False,
        "Tty": False,
        "ExposedPorts": {},
        "StopSignal": "SIGKILL",
        "Labels": {
            LABEL_AGENT_RUN: settings.run_id,
            LABEL_AGENT_INVOCATION: invocation.invocation_id,
            LABEL_ROLE: ROLE_ENCLAVE,
        },
        "HostConfig": host_config,
        "NetworkingConfig": {"EndpointsConfig": {settings.network: {}}},
    }
    return enclave_name(settings.run_id, invocation.invocation_id), body
