"""The enclave runner's engine-test rig: the real API proxy at its fixed address, a fake upstream.

Topology (as the run's lifecycle sets it up, spec 15.6):

* the enclave network (``enclave_spec.network_spec``: internal, no IPv4 on
  the bridge) with the API proxy container at ``<subnet>.2``, alias
  ``awf-api-proxy``;
* an internal egress network where the scripted fake Anthropic provider
  (``harness/example/anthropic_provider.py``) listens as ``provider:8080``; the
  proxy is on both, the enclave never on the egress one;
* the proxy (image ``bounded-query-api-proxy``, or ``$BQ_APIPROXY_TEST_IMAGE``)
  holds the real credential, forwards to the fake over plain HTTP
  (``allowInsecure``) and is armed by the runner over its control socket,
  bind-mounted from a 0700 directory on the host.

Everything carries ``bounded-query.test=agent-enclave`` (enclaves: the run
label of the rig's runners) and is removed by :meth:`ProxyRig.close`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bounded_query.broker.agent_payload import AgentPayload, encode_agent_payload
from bounded_query.broker.protocol.policy import (
    ENCLAVE_API_PROXY_ALIAS,
    ENCLAVE_MAX_OUTPUT_BYTES,
    ENCLAVE_PIDS_LIMIT,
    ENCLAVE_TMPFS_BYTES,
    LABEL_AGENT_RUN,
    QUERY_GID,
    QUERY_UID,
)
from bounded_query.broker.runner import EnclaveOptions, Invocation, RunnerSettings
from bounded_query.harness.configuration.apiproxy_image import APIPROXY_IMAGE, APIPROXY_UID
from bounded_query.sandbox.enclave_runner import EnclaveRunner
from bounded_query.sandbox.enclave_spec import network_spec
from tests.enclave.helpers import (
    BASE,
    FAKE_IMAGE,
    FAKE_SOURCE,
    IMAGE,
    MODEL,
    TEST_LABEL,
    TEST_LABEL_VALUE,
    _make_writable,
    make_seed,
)

PROXY_IMAGE = os.environ.get("BQ_APIPROXY_TEST_IMAGE", APIPROXY_IMAGE)
PROXY_PORT = 8080
FAKE_PORT = 8080
#: The provider credential only the proxy holds; the fake must see it and nothing else.
CREDENTIAL = "sk-REAL-enclave-runner-" + "7" * 24
LABELS = {TEST_LABEL: TEST_LABEL_VALUE}


@dataclass
class ProxyRig:
    """The enclave network with the real proxy, the egress network with the fake provider."""

    client: Any
    root: Path
    network: str
    proxy_address: str
    egress: str
    proxy_id: str
    fake_id: str
    control_socket: Path
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

    def seed(self, files: dict[str, str]) -> Path:
        return make_seed(self.root / f"seed-{secrets.token_hex(4)}", files)

    def options(self, **changes: Any) -> EnclaveOptions:
        values: dict[str, Any] = {
            "engine": "claude",
            "model": MODEL,
            "network": self.network,
            "proxy_address": self.proxy_address,
            "proxy_port": PROXY_PORT,
            "control_socket": self.control_socket,
            "nano_cpus": 1_000_000_000,
            "pids_limit": ENCLAVE_PIDS_LIMIT,
            "tmpfs_bytes": ENCLAVE_TMPFS_BYTES,
            "max_output_bytes": ENCLAVE_MAX_OUTPUT_BYTES,
            "max_task_bytes": 4096,
        }
        values.update(changes)
        return EnclaveOptions(**values)

    def settings(self, runtime: str = "docker", **changes: Any) -> RunnerSettings:
        values: dict[str, Any] = {
            "runtime": runtime,
            "run_id": secrets.token_hex(16),
            "image": IMAGE,
            "timeout_s": 120,
            "memory_bytes": 512 * 1024**2,
        }
        values.update(changes)
        return RunnerSettings(**values)

    def runner(self, settings: RunnerSettings | None = None, **changes: Any) -> EnclaveRunner:
        return EnclaveRunner(settings or self.settings(), self.options(**changes), keep_logs=True)

    def invocation(
        self, runner: EnclaveRunner, seed: Path, task: str, schema: dict[str, Any]
    ) -> Invocation:
        """A broker-style invocation: fresh ids, an empty 0700 workspace, the encoded payload."""
        workspace = self.root / f"ws-{secrets.token_hex(4)}"
        workspace.mkdir(mode=0o700)
        payload = AgentPayload(task=task, schema=json.dumps(schema))
        return Invocation(
            run_id=runner.settings.run_id,
            invocation_id=secrets.token_hex(16),
            seed_dir=seed,
            workspace=workspace,
            script=encode_agent_payload(payload),
        )

    def run_containers(self, run_id: str) -> list[dict[str, Any]]:
        """Every container (any state) with this run's agent run label."""
        return list(
            self.client.api.containers(all=True, filters={"label": f"{LABEL_AGENT_RUN}={run_id}"})
        )

    def created_since(self, since: float, run_id: str) -> list[dict[str, Any]]:
        """The engine's ``create`` events of this run's containers since ``since`` (epoch s)."""
        events = self.client.api.events(
            since=int(since) - 1,
            until=int(time.time()) + 1,
            filters={
                "type": "container",
                "event": "create",
                "label": f"{LABEL_AGENT_RUN}={run_id}",
            },
            decode=True,
        )
        return [e for e in events if int(e["timeNano"]) >= int(since * 1e9)]

    def extra_member(self, address: str) -> str:
        """Start a stranger on the enclave network at ``address``; its id."""
        api = self.client.api
        networking = api.create_networking_config(
            {self.network: api.create_endpoint_config(ipv4_address=address)}
        )
        cid = str(
            api.create_container(
                FAKE_IMAGE,
                entrypoint=["/bin/sleep", "300"],
                user=f"{QUERY_UID}:{QUERY_GID}",
                labels=LABELS,
                host_config=api.create_host_config(
                    network_mode=self.network, read_only=True, cap_drop=["ALL"]
                ),
                networking_config=networking,
            )["Id"]
        )
        self.extra_containers.append(cid)
        api.start(cid)
        return cid

    def remove(self, cid: str) -> None:
        with contextlib.suppress(Exception):
            self.client.api.remove_container(cid, force=True)

    def detach_proxy(self) -> None:
        self.client.api.disconnect_container_from_network(self.proxy_id, self.network)

    def attach_proxy(self) -> None:
        self.client.api.connect_container_to_network(
            self.proxy_id,
            self.network,
            ipv4_address=self.proxy_address,
            aliases=[ENCLAVE_API_PROXY_ALIAS],
        )

    def close(self) -> None:
        for cid in [*self.extra_containers, self.proxy_id, self.fake_id]:
            self.remove(cid)
        try:
            for network in (self.network, self.egress):
                with contextlib.suppress(Exception):
                    self.client.api.remove_network(network)
        finally:
            _make_writable(self.root)
            shutil.rmtree(self.root, ignore_errors=True)


def _owned_dir(path: Path) -> Path:
    path.mkdir(mode=0o700)
    os.chown(path, APIPROXY_UID, APIPROXY_UID)
    return path


def _enclave_network(client: Any) -> tuple[str, str]:
    import docker.errors

    for _ in range(20):
        subnet = f"10.{secrets.randbelow(50) + 150}.{secrets.randbelow(256)}"
        name = f"bq-enclave-runner-test-{secrets.token_hex(4)}"
        try:
            client.api.create_network(**network_spec(name, f"{subnet}.0/24", LABELS))
        except docker.errors.APIError as exc:
            if "overlap" in str(exc):
                continue
            raise
        return name, f"{subnet}.2"
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test network")


def _wait_for(what: str, ready: Any, cid: str, client: Any, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        running = client.api.inspect_container(cid)["State"]["Running"]
        if time.monotonic() > deadline or not running:
            logs = client.api.logs(cid).decode("utf-8", "replace")[-2000:]
            raise RuntimeError(f"{what} did not start: {logs}")
        time.sleep(0.05)


def start_proxy_rig(client: Any) -> ProxyRig:
    """Create both networks, start the fake provider and the proxy; wait for both."""
    root = BASE / f"bq-enclave-runner-test-{secrets.token_hex(6)}"
    root.mkdir(mode=0o755)
    fake_dir = root / "fake"
    fake_dir.mkdir(mode=0o755)
    shutil.copy(FAKE_SOURCE, fake_dir / "anthropic_provider.py")
    script_path = fake_dir / "script.json"
    script_path.write_text(json.dumps({"command": "true", "marker": "-", "answer": "null"}))
    record_path = fake_dir / "record.jsonl"
    record_path.write_text("")
    os.chown(record_path, QUERY_UID, QUERY_GID)
    control_dir = _owned_dir(root / "control")
    usage_dir = _owned_dir(root / "usage")
    secret = root / "credential"
    secret.write_text(CREDENTIAL + "\n")
    os.chown(secret, APIPROXY_UID, APIPROXY_UID)
    secret.chmod(0o400)
    config = {
        "version": 1,
        "engine": "claude",
        "model": MODEL,
        "maxModelRequests": 8,
        "maxModelTokens": 1024,
        "listen": {"host": "0.0.0.0", "port": PROXY_PORT},
        "clientHosts": [f"{ENCLAVE_API_PROXY_ALIAS}:{PROXY_PORT}"],
        "controlSocket": "/run/control/control.sock",
        "upstream": {"url": f"http://provider:{FAKE_PORT}", "allowInsecure": True},
        "usageDir": "/run/usage",
        "responseTimeout": 60,
    }
    (root / "proxy.json").write_text(json.dumps(config))
    (root / "proxy.json").chmod(0o444)
    api = client.api
    network, proxy_address = _enclave_network(client)
    egress = f"{network}-egress"
    made: list[str] = []
    try:
        api.create_network(egress, driver="bridge", internal=True, labels=LABELS)
        hardening = {
            "read_only": True,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges:true"],
        }
        fake_id = str(
            api.create_container(
                FAKE_IMAGE,
                entrypoint=["/usr/bin/python3", "-I", "-S", "-u", "/fake/anthropic_provider.py"],
                command=["/fake/script.json", "/fake/record.jsonl", str(FAKE_PORT)],
                user=f"{QUERY_UID}:{QUERY_GID}",
                labels=LABELS,
                name=f"{network}-fake",
                host_config=api.create_host_config(
                    binds={str(fake_dir): {"bind": "/fake", "mode": "rw"}},
                    network_mode=egress,
                    **hardening,
                ),
                networking_config=api.create_networking_config(
                    {egress: api.create_endpoint_config(aliases=["provider"])}
                ),
            )["Id"]
        )
        made.append(fake_id)
        api.start(fake_id)
        proxy_id = str(
            api.create_container(
                PROXY_IMAGE,
                command=["--config", "/run/proxy.json", "--credential-file", "/run/secrets/key"],
                user=f"{APIPROXY_UID}:{APIPROXY_UID}",
                labels=LABELS,
                name=f"{network}-proxy",
                host_config=api.create_host_config(
                    binds={
                        str(root / "proxy.json"): {"bind": "/run/proxy.json", "mode": "ro"},
                        str(secret): {"bind": "/run/secrets/key", "mode": "ro"},
                        str(control_dir): {"bind": "/run/control", "mode": "rw"},
                        str(usage_dir): {"bind": "/run/usage", "mode": "rw"},
                    },
                    network_mode=network,
                    **hardening,
                ),
                networking_config=api.create_networking_config(
                    {
                        network: api.create_endpoint_config(
                            ipv4_address=proxy_address, aliases=[ENCLAVE_API_PROXY_ALIAS]
                        )
                    }
                ),
            )["Id"]
        )
        made.append(proxy_id)
        api.connect_container_to_network(proxy_id, egress)
        api.start(proxy_id)
        _wait_for(
            "fake provider",
            lambda: b"ready" in api.logs(fake_id, stdout=True, stderr=False),
            fake_id,
            client,
        )
        control_socket = control_dir / "control.sock"
        _wait_for("API proxy", control_socket.exists, proxy_id, client)
    except BaseException:
        for cid in made:
            with contextlib.suppress(Exception):
                api.remove_container(cid, force=True)
        for name in (network, egress):
            with contextlib.suppress(Exception):
                api.remove_network(name)
        shutil.rmtree(root, ignore_errors=True)
        raise
    return ProxyRig(
        client,
        root,
        network,
        proxy_address,
        egress,
        proxy_id,
        fake_id,
        control_socket,
        script_path,
        record_path,
    )
