"""Builders for enclave engine tests: a rig (internal network + fake provider) and one enclave run.

Everything created here carries the label ``bounded-query.test=agent-enclave``
and a random name, and is removed by :meth:`Rig.close` (the network last).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bounded_query.broker.protocol.policy import (
    ENCLAVE_API_PROXY_ALIAS,
    ENCLAVE_IMAGES,
    ENCLAVE_OCI_RUNTIMES,
    ENCLAVE_PIDS_LIMIT,
    ENCLAVE_TMPFS_BYTES,
    QUERY_GID,
    QUERY_UID,
)
from bounded_query.sandbox.enclave_spec import (
    RESOLV_CONF,
    EnclaveInvocation,
    EnclaveSettings,
    enclave_spec,
    engine_file_contents,
    hosts_file,
    network_spec,
)
from bounded_query.seccomp import enclave_profile_json

IMAGE = ENCLAVE_IMAGES["claude"]
FAKE_IMAGE = "bounded-query-python:latest"
TEST_LABEL = "bounded-query.test"
TEST_LABEL_VALUE = "agent-enclave"
FAKE_PORT = 8080
MODEL = "claude-enclave-test-model"
FAKE_SOURCE = Path(__file__).resolve().parents[2] / "harness" / "example" / "anthropic_provider.py"
#: The fake provider each engine talks to (the wire protocol of its route).
FAKE_SOURCES = {
    "claude": FAKE_SOURCE,
    "copilot": Path(__file__).resolve().parents[1] / "fakes" / "openai_provider.py",
}
BASE = Path("/var/tmp")
GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_AUTHOR_DATE": "1700000000 +0000",
    "GIT_COMMITTER_DATE": "1700000000 +0000",
}


def runtime_registered(client: Any, runtime: str) -> bool:
    """Whether dockerd has the OCI runtime an enclave on ``runtime`` needs."""
    return ENCLAVE_OCI_RUNTIMES[runtime] in (client.api.info().get("Runtimes") or {})


def make_seed(path: Path, files: dict[str, str]) -> Path:
    """A staged-seed look-alike: ``files`` in one commit, files 0444, dirs 0555."""
    path.mkdir(parents=True)
    for name, text in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=path, env=GIT_ENV, check=True, capture_output=True)

    git("-c", "init.templateDir=", "init", "-q", "-b", "main")
    git("add", "-A")
    git("commit", "-q", "-m", "seed")
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            p = os.path.join(dirpath, name)
            os.chmod(p, stat.S_IMODE(os.lstat(p).st_mode) & ~0o222 | 0o444)
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o555)
    path.chmod(0o555)
    return path


def _make_writable(path: Path) -> None:
    for dirpath, _dirs, _files in os.walk(path):
        os.chmod(dirpath, 0o755)


@dataclass
class EnclaveRun:
    """What one enclave run left behind."""

    exit_code: int
    result: bytes
    logs: str
    create_start_s: float
    engine_s: float
    total_s: float
    peak_memory: int | None


@dataclass
class Rig:
    """An internal network of our own with the scripted fake provider at the proxy's alias."""

    client: Any
    root: Path
    network: str
    proxy_address: str
    fake_id: str
    script_path: Path
    record_path: Path
    extra_containers: list[str] = field(default_factory=list)

    def set_script(self, script: dict[str, str]) -> None:
        """Replace the fake's script (read per request) and clear its record."""
        self.script_path.write_text(json.dumps(script))
        self.record_path.write_text("")

    def records(self) -> list[dict[str, Any]]:
        """Every request the fake saw since the last :meth:`set_script`."""
        text = self.record_path.read_text()
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def settings(self, runtime: str, **overrides: Any) -> EnclaveSettings:
        values: dict[str, Any] = {
            "runtime": runtime,
            "run_id": secrets.token_hex(16),
            "image": IMAGE,
            "engine": "claude",
            "model": MODEL,
            "network": self.network,
            "proxy_address": self.proxy_address,
            "proxy_port": FAKE_PORT,
            "memory_bytes": 512 * 1024**2,
            "nano_cpus": 1_000_000_000,
            "pids_limit": ENCLAVE_PIDS_LIMIT if runtime == "docker" else 512,
            "tmpfs_bytes": ENCLAVE_TMPFS_BYTES,
        }
        values.update(overrides)
        return EnclaveSettings(**values)

    def seed(self, files: dict[str, str]) -> Path:
        return make_seed(self.root / f"seed-{secrets.token_hex(4)}", files)

    def run(
        self,
        settings: EnclaveSettings,
        seed: Path,
        task: str,
        schema: dict[str, Any],
        *,
        timeout_s: float = 180.0,
        customize: Callable[[dict[str, Any]], None] | None = None,
    ) -> EnclaveRun:
        """Run one enclave to completion (killed after ``timeout_s``) and remove it.

        ``customize`` may edit the spec's create body first (test setups only).
        """
        invocation = EnclaveInvocation(
            invocation_id=secrets.token_hex(8),
            seed_dir=str(seed),
            workspace=str(self.root / f"ws-{secrets.token_hex(4)}"),
            placeholder=secrets.token_hex(32),
        )
        ws = Path(invocation.workspace)
        ws.mkdir(mode=0o711)
        (ws / "task.txt").write_text(task)
        (ws / "schema.json").write_text(json.dumps(schema))
        (ws / "hosts").write_text(hosts_file(settings))
        (ws / "resolv.conf").write_text(RESOLV_CONF)
        for name, data in engine_file_contents(settings.engine).items():
            (ws / name).write_bytes(data)
        result = ws / "result.json"
        result.write_bytes(b"")
        os.chown(result, QUERY_UID, QUERY_GID)
        result.chmod(0o600)
        seccomp = enclave_profile_json(ENCLAVE_OCI_RUNTIMES[settings.runtime])
        name, body = enclave_spec(settings, invocation, seccomp, keep_logs=True)
        body["Labels"][TEST_LABEL] = TEST_LABEL_VALUE
        if customize is not None:
            customize(body)
        api = self.client.api
        t0 = time.monotonic()
        cid = api.create_container_from_config(body, name)["Id"]
        try:
            api.start(cid)
            t1 = time.monotonic()
            peak = None
            cgroup = Path(f"/sys/fs/cgroup/memory/docker/{cid}/memory.max_usage_in_bytes")
            while True:
                state = api.inspect_container(cid)["State"]
                if not state["Running"]:
                    break
                if time.monotonic() - t1 > timeout_s:
                    api.kill(cid)
                    break
                with contextlib.suppress(OSError):
                    peak = int(cgroup.read_text())
                time.sleep(0.05)
            t2 = time.monotonic()
            exit_code = int(api.inspect_container(cid)["State"]["ExitCode"])
            logs = api.logs(cid, stdout=True, stderr=True).decode("utf-8", "replace")
        finally:
            api.remove_container(cid, force=True)
        return EnclaveRun(
            exit_code=exit_code,
            result=result.read_bytes(),
            logs=logs,
            create_start_s=t1 - t0,
            engine_s=t2 - t1,
            total_s=time.monotonic() - t0,
            peak_memory=peak,
        )

    def close(self) -> None:
        for cid in [*self.extra_containers, self.fake_id]:
            with contextlib.suppress(Exception):
                self.client.api.remove_container(cid, force=True)
        try:
            self.client.api.remove_network(self.network)
        finally:
            _make_writable(self.root)
            shutil.rmtree(self.root, ignore_errors=True)


def _create_network(client: Any) -> tuple[str, str]:
    """Our own internal network on a random free /24; its name and the proxy's address."""
    import docker.errors

    for _ in range(20):
        subnet = f"10.{secrets.randbelow(50) + 200}.{secrets.randbelow(256)}"
        name = f"bq-enclave-test-{secrets.token_hex(4)}"
        body = network_spec(name, f"{subnet}.0/24", {TEST_LABEL: TEST_LABEL_VALUE})
        try:
            client.api.create_network(**body)
        except docker.errors.APIError as exc:
            if "overlap" in str(exc):
                continue
            raise
        return name, f"{subnet}.2"
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test network")


def start_rig(client: Any, engine: str = "claude") -> Rig:
    """Create the network and start ``engine``'s fake provider at the proxy's alias and address."""
    source = FAKE_SOURCES[engine]
    root = BASE / f"bq-enclave-test-{secrets.token_hex(6)}"
    root.mkdir(mode=0o755)
    fake_dir = root / "fake"
    fake_dir.mkdir(mode=0o755)
    shutil.copy(source, fake_dir / source.name)
    script_path = fake_dir / "script.json"
    script_path.write_text(json.dumps({"command": "true", "marker": "-", "answer": "null"}))
    record_path = fake_dir / "record.jsonl"
    record_path.write_text("")
    os.chown(record_path, QUERY_UID, QUERY_GID)
    network, proxy_address = _create_network(client)
    api = client.api
    try:
        networking = api.create_networking_config(
            {
                network: api.create_endpoint_config(
                    ipv4_address=proxy_address, aliases=[ENCLAVE_API_PROXY_ALIAS]
                )
            }
        )
        host_config = api.create_host_config(
            binds={str(fake_dir): {"bind": "/fake", "mode": "rw"}},
            network_mode=network,
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
        )
        fake_id = api.create_container(
            FAKE_IMAGE,
            entrypoint=["/usr/bin/python3", "-I", "-S", "-u", f"/fake/{source.name}"],
            command=["/fake/script.json", "/fake/record.jsonl", str(FAKE_PORT)],
            user=f"{QUERY_UID}:{QUERY_GID}",
            working_dir="/fake",
            labels={TEST_LABEL: TEST_LABEL_VALUE},
            name=f"{network}-fake",
            host_config=host_config,
            networking_config=networking,
        )["Id"]
        api.start(fake_id)
        deadline = time.monotonic() + 30
        while b"ready" not in api.logs(fake_id, stdout=True, stderr=False):
            running = api.inspect_container(fake_id)["State"]["Running"]
            if time.monotonic() > deadline or not running:
                raise RuntimeError(
                    "fake provider did not start: " + api.logs(fake_id).decode("utf-8", "replace")
                )
            time.sleep(0.05)
    except BaseException:
        api.remove_network(network)
        raise
    return Rig(client, root, network, proxy_address, fake_id, script_path, record_path)


def run_loopback(
    client: Any,
    oci_runtime: str,
    files: dict[str, str],
    script: dict[str, str],
    engine: str = "claude",
) -> tuple[EnclaveRun, list[dict[str, Any]]]:
    """One enclave with the fake provider *inside* it on loopback, on ``oci_runtime``.

    For runtimes that cannot join a network (the queries' ``runsc`` has
    ``--network=none``): the enclave's body as built by the spec (its image,
    seccomp variant, mounts, limits), but on Docker's ``none`` network, the
    proxy's address 127.0.0.1, and an entrypoint that starts the fake in the
    background before it runs the adapter exactly as the image's entrypoint
    would. Proves the engine and the profile work on that runtime; the
    network path is what :class:`Rig` tests.
    """
    root = BASE / f"bq-enclave-test-{secrets.token_hex(6)}"
    root.mkdir(mode=0o755)
    source = FAKE_SOURCES[engine]
    try:
        fake = root / "fake"
        fake.mkdir(mode=0o755)
        shutil.copy(source, fake / source.name)
        (fake / "script.json").write_text(json.dumps(script))
        record = fake / "record.jsonl"
        record.write_text("")
        os.chown(record, QUERY_UID, QUERY_GID)
        rig = Rig(client, root, "none", "127.0.0.1", "", fake / "script.json", record)
        settings = rig.settings(
            "docker", network="none", pids_limit=512, engine=engine, image=ENCLAVE_IMAGES[engine]
        )
        seed = rig.seed(files)

        def customize(body: dict[str, Any]) -> None:
            host = body["HostConfig"]
            host["Runtime"] = oci_runtime
            # The gVisor variant (clone3 -> TRACE): this runsc ignores errnoRet,
            # and with EPERM for clone3 glibc cannot start threads (Bun aborts).
            gvisor = ENCLAVE_OCI_RUNTIMES["gvisor"]
            host["SecurityOpt"] = [
                "no-new-privileges:true",
                f"seccomp={enclave_profile_json(gvisor)}",
            ]
            host["NetworkMode"] = "none"
            del host["Dns"]
            del body["NetworkingConfig"]
            host["Mounts"].append(
                {"Type": "bind", "Source": str(fake), "Target": "/fake", "ReadOnly": False}
            )
            start_fake = (
                f"python3 -I -S /fake/{source.name} /fake/script.json"
                f" /fake/record.jsonl {FAKE_PORT} > /tmp/fake.out &"
                " for _ in $(seq 100); do grep -q ready /tmp/fake.out && break; sleep 0.05; done;"
                " exec " + " ".join(body["Entrypoint"] + body["Cmd"])
            )
            body["Entrypoint"] = ["/bin/bash", "-c", start_fake]
            body["Cmd"] = []

        task = "Does marker.txt hold a marker?"
        run = rig.run(settings, seed, task, {"type": "boolean"}, customize=customize)
        return run, rig.records()
    finally:
        _make_writable(root)
        shutil.rmtree(root, ignore_errors=True)
