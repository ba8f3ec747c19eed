"""Attacker-side probe of the enclave, run by the engine's own Bash tool (standard library only).

The enclave tests put this file into the seed and script the fake provider's
tool call as ``python3 probe.py TARGETS_JSON MARKER``: the real Claude Code
runs it inside the real enclave, and its output travels back to the fake in
the tool result, where the test reads it. It prints one JSON object: who it
runs as, its capabilities and seccomp state, what it can write, which
addresses it can reach (TCP connect to each target; the API proxy is the
control that must succeed), what name resolution does, and which socket
families the seccomp profile lets it create; then MARKER on its own line.

``python3 probe.py --later PROXY_HOST:PORT MODEL OLD_KEY MARKER`` is the
other mode, for a *later* invocation looking for an earlier one: every path
under ``/tmp`` and ``/agent``, its task, schema and result files, and the status the API
proxy answers a model request with the earlier invocation's placeholder
(``OLD_KEY``) and with its own (``$ANTHROPIC_API_KEY``, the control).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
from typing import Any

CONNECT_TIMEOUT_S = 1.5


def _status() -> dict[str, str]:
    fields = {}
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "Seccomp", "NoNewPrivs"):
                fields[key] = value.strip()
    return fields


def _try_write(path: str) -> str:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    os.close(fd)
    return "written"


def _connect(host: str, port: int) -> str:
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        return "socket:" + errno.errorcode.get(exc.errno or 0, "?")
    sock.settimeout(CONNECT_TIMEOUT_S)
    try:
        sock.connect((host, port))
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    finally:
        sock.close()
    return "connected"


def _socket_family(family: int, kind: int, proto: int = 0) -> str:
    try:
        socket.socket(family, kind, proto).close()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "created"


def _dns_query(server: str, name: str) -> str:
    """One raw DNS A query over UDP, bypassing resolv.conf."""
    query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    for label in name.split("."):
        query += bytes([len(label)]) + label.encode()
    query += b"\x00\x00\x01\x00\x01"
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError as exc:
        return "socket:" + errno.errorcode.get(exc.errno or 0, "?")
    sock.settimeout(CONNECT_TIMEOUT_S)
    try:
        sock.sendto(query, (server, 53))
        data = sock.recv(512)
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    finally:
        sock.close()
    answers = int.from_bytes(data[6:8], "big") if len(data) >= 12 else 0
    rcode = data[3] & 0x0F if len(data) >= 4 else -1
    return f"reply rcode={rcode} answers={answers}"


def _resolve(name: str) -> str:
    try:
        infos = socket.getaddrinfo(name, 80, socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        return f"error:{type(exc).__name__}"
    return "resolved:" + ",".join(sorted({str(i[4][0]) for i in infos}))


def _routes() -> list[list[str]]:
    rows = []
    with open("/proc/net/route", encoding="ascii") as handle:
        for line in list(handle)[1:]:
            parts = line.split()
            dest = socket.inet_ntoa(bytes.fromhex(parts[1])[::-1])
            gateway = socket.inet_ntoa(bytes.fromhex(parts[2])[::-1])
            rows.append([parts[0], dest, gateway])
    return rows


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(4096)
    except OSError as exc:
        return "error:" + errno.errorcode.get(exc.errno or 0, "?")


def _fill(path: str, limit: int) -> str:
    """Write up to ``limit`` bytes to ``path``; how far it got and why it stopped."""
    chunk = b"\0" * (1 << 20)
    written = 0
    try:
        with open(path, "wb", buffering=0) as handle:
            while written < limit:
                written += handle.write(chunk)
    except OSError as exc:
        return f"{errno.errorcode.get(exc.errno or 0, '?')} after {written >> 20} MiB"
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return f"wrote {written >> 20} MiB"


def _spawn(limit: int) -> str:
    """Start up to ``limit`` sleeping children; how many started before the PID limit."""
    children = []
    result = f"started {limit}"
    try:
        for _ in range(limit):
            pid = os.fork()
            if pid == 0:
                os.execv("/bin/sleep", ["sleep", "30"])
            children.append(pid)
    except OSError as exc:
        result = f"{errno.errorcode.get(exc.errno or 0, '?')} after {len(children)}"
    for pid in children:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return result


def probe(targets: dict[str, Any]) -> dict[str, Any]:
    """Everything the enclave lets this process do or see (see module docstring)."""
    return {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "euid": os.geteuid(),
        "groups": os.getgroups(),
        "status": _status(),
        "cwd": os.getcwd(),
        "writes": {
            path: _try_write(path)
            for path in (
                "/awf/seed/probe-wrote-here",
                "/awf/seed/.git/probe-wrote-here",
                "/probe-wrote-here",
                "/usr/probe-wrote-here",
                "/etc/probe-wrote-here",
                "/etc/hosts",
                "/awf/task.txt",
                "/awf/adapter.py",
                "/opt/engine/bin/probe-wrote-here",
                "/agent/probe-wrote-here",
                "/tmp/probe-wrote-here",
            )
        },
        "docker_socket": [
            p for p in ("/var/run/docker.sock", "/run/docker.sock") if os.path.lexists(p)
        ],
        "routes": _routes(),
        "connect": {name: _connect(str(host), int(port)) for name, (host, port) in targets.items()},
        "resolve": {name: _resolve(name) for name in ("deb.debian.org", "awf-api-proxy")},
        "dns_embedded": _dns_query("127.0.0.11", "deb.debian.org"),
        "sockets": {
            "inet6": _socket_family(socket.AF_INET6, socket.SOCK_STREAM),
            "netlink": _socket_family(socket.AF_NETLINK, socket.SOCK_RAW),
            "packet": _socket_family(socket.AF_PACKET, socket.SOCK_RAW),
            "raw": _socket_family(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
            "inet_udp": _socket_family(socket.AF_INET, socket.SOCK_DGRAM),
            "inet_icmp": _socket_family(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP),
            "inet_tcp": _socket_family(socket.AF_INET, socket.SOCK_STREAM),
        },
        "hosts": _read("/etc/hosts"),
        "resolv_conf": _read("/etc/resolv.conf"),
        "env_names": sorted(os.environ),
        "fill_tmp": _fill("/tmp/probe-fill", 256 << 20),
        "fill_agent": _fill("/agent/probe-fill", 256 << 20),
        "spawn": _spawn(600),
    }


def _model_status(address: str, model: str, key: str) -> str:
    """The status line the proxy answers one small Messages request with."""
    host, _, port = address.rpartition(":")
    body = json.dumps(
        {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    head = (
        f"POST /v1/messages HTTP/1.1\r\nhost: {address}\r\nx-api-key: {key}\r\n"
        "anthropic-version: 2023-06-01\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    try:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(head + body)
            data = sock.recv(256)
    except OSError as exc:
        return "error:" + errno.errorcode.get(exc.errno or 0, str(exc))
    return data.split(b"\r\n", 1)[0].decode("latin-1")


def _walk(top: str) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        found += [os.path.join(dirpath, name) for name in dirnames + filenames]
    return sorted(found)


def later(address: str, model: str, old_key: str) -> dict[str, Any]:
    """What a later invocation finds of an earlier one (see the module docstring)."""
    return {
        "paths": _walk("/tmp") + _walk("/agent"),
        "task": _read("/awf/task.txt"),
        "schema": _read("/awf/schema.json"),
        "result": _read("/agent/result.json"),
        "old_key": _model_status(address, model, old_key),
        "own_key": _model_status(address, model, os.environ.get("ANTHROPIC_API_KEY", "")),
    }


def main(argv: list[str]) -> int:
    if argv[0] == "--later":
        print(json.dumps(later(argv[1], argv[2], argv[3]), sort_keys=True))
        print(argv[4])
        return 0
    targets = json.loads(argv[0])
    print(json.dumps(probe(targets), sort_keys=True))
    print(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
