"""The API proxy in its container, across Docker networks (engine test, spec 15.6).

Topology as the next step will wire it: an "enclave" container on one
``internal`` network only, the proxy on that network (alias
``awf-api-proxy``) and on a second network where a fake provider listens
(``internal`` too here: the test needs no internet). The enclave reaches
its model through the proxy with a placeholder key and cannot reach the
provider itself; the provider sees the real key only; the broker's side
(this test) arms the proxy over the control socket in a bind-mounted 0700
directory. The proxy container runs read-only, as 65534, with every
capability dropped.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

from bounded_query.broker.protocol.policy import DEFAULT_IMAGE, ENCLAVE_API_PROXY_ALIAS
from bounded_query.harness.configuration.apiproxy_image import (
    APIPROXY_IMAGE,
    APIPROXY_UID,
    ensure_apiproxy_image,
)

pytestmark = pytest.mark.engine

IMAGE = os.environ.get("BQ_APIPROXY_TEST_IMAGE", APIPROXY_IMAGE)
LABELS = {"bounded-query.test": "apiproxy-container"}
CREDENTIAL = "sk-REAL-in-container-" + "9" * 20
MODEL = "claude-net-model"

PROVIDER = r"""
import json, http.server
EVENTS = [
    {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant",
     "content": [], "model": "m", "usage": {"input_tokens": 11, "output_tokens": 1}}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hello"}},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}},
    {"type": "message_stop"},
]
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        with open("/rec/requests.jsonl", "a") as f:
            f.write(json.dumps({"target": self.path, "headers": dict(self.headers.items()),
                                "body": body.decode()}) + "\n")
        data = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in EVENTS).encode()
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 9000), Handler).serve_forever()
"""

ENCLAVE = r"""
import json, socket, sys
placeholder, model, proxy = sys.argv[1], sys.argv[2], sys.argv[3]
body = json.dumps({"model": model, "max_tokens": 999999, "stream": True,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
out = {}
s = socket.create_connection((proxy, 8080), timeout=20)
s.sendall(b"POST /v1/messages?beta=true HTTP/1.1\r\nhost: " + proxy.encode() + b":8080\r\n"
          b"x-api-key: " + placeholder.encode() + b"\r\ncontent-type: application/json\r\n"
          b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
data = b""
while True:
    part = s.recv(65536)
    if not part:
        break
    data += part
out["response"] = data.decode("latin-1")
try:
    socket.create_connection(("provider", 9000), timeout=5).close()
    out["direct"] = "reached"
except OSError as exc:
    out["direct"] = type(exc).__name__
print(json.dumps(out))
"""


def _control(path: Path, target: str, doc: dict | None) -> dict:
    body = b"" if doc is None else json.dumps(doc).encode()
    method = "GET" if doc is None else "POST"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(
            f"{method} {target} HTTP/1.1\r\nhost: c\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        data = b""
        while part := sock.recv(65536):
            data += part
    return json.loads(data.split(b"\r\n\r\n", 1)[1])


def _owned_dir(path: Path, mode: int = 0o700) -> Path:
    path.mkdir()
    os.chown(path, APIPROXY_UID, APIPROXY_UID)
    os.chmod(path, mode)
    return path


def test_one_request_crosses_the_internal_network_through_the_proxy(docker_client):
    ensure_apiproxy_image("unix:///var/run/docker.sock", tag=IMAGE)
    suffix = secrets.token_hex(4)
    root = Path(tempfile.mkdtemp(prefix="bq-apiproxy-net-", dir="/var/tmp"))
    created: list = []
    networks: list = []
    try:
        control_dir = _owned_dir(root / "control")
        usage_dir = _owned_dir(root / "usage")
        rec_dir = _owned_dir(root / "rec")
        (root / "provider.py").write_text(PROVIDER)
        (root / "enclave.py").write_text(ENCLAVE)
        secret = root / "key"
        secret.write_text(CREDENTIAL + "\n")
        os.chown(secret, APIPROXY_UID, APIPROXY_UID)
        os.chmod(secret, 0o400)
        config = {
            "version": 1,
            "engine": "claude",
            "model": MODEL,
            "maxModelRequests": 2,
            "maxModelTokens": 256,
            "listen": {"host": "0.0.0.0", "port": 8080},
            "clientHosts": [f"{ENCLAVE_API_PROXY_ALIAS}:8080"],
            "controlSocket": "/run/control/control.sock",
            "upstream": {"url": "http://provider:9000", "allowInsecure": True},
            "usageDir": "/run/usage",
            "responseTimeout": 30,
        }
        (root / "proxy.json").write_text(json.dumps(config))
        for path in (root / "provider.py", root / "enclave.py", root / "proxy.json"):
            os.chmod(path, 0o444)
        enclave_net = docker_client.networks.create(
            f"bq-apiproxy-enclave-{suffix}", driver="bridge", internal=True, labels=LABELS
        )
        networks.append(enclave_net)
        egress_net = docker_client.networks.create(
            f"bq-apiproxy-egress-{suffix}", driver="bridge", internal=True, labels=LABELS
        )
        networks.append(egress_net)
        hardening = {
            "read_only": True,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges:true"],
            "labels": LABELS,
            "user": f"{APIPROXY_UID}:{APIPROXY_UID}",
        }
        provider = docker_client.containers.create(
            IMAGE,
            entrypoint=["/usr/bin/python3", "/opt/provider.py"],
            name=f"bq-apiproxy-provider-{suffix}",
            network=egress_net.name,
            volumes={
                str(root / "provider.py"): {"bind": "/opt/provider.py", "mode": "ro"},
                str(rec_dir): {"bind": "/rec", "mode": "rw"},
            },
            **hardening,
        )
        created.append(provider)
        egress_net.disconnect(provider)
        egress_net.connect(provider, aliases=["provider"])
        provider.start()
        proxy = docker_client.containers.create(
            IMAGE,
            command=["--config", "/run/proxy.json", "--credential-file", "/run/secrets/key"],
            name=f"bq-apiproxy-proxy-{suffix}",
            network=enclave_net.name,
            volumes={
                str(root / "proxy.json"): {"bind": "/run/proxy.json", "mode": "ro"},
                str(secret): {"bind": "/run/secrets/key", "mode": "ro"},
                str(control_dir): {"bind": "/run/control", "mode": "rw"},
                str(usage_dir): {"bind": "/run/usage", "mode": "rw"},
            },
            **hardening,
        )
        created.append(proxy)
        enclave_net.disconnect(proxy)
        enclave_net.connect(proxy, aliases=[ENCLAVE_API_PROXY_ALIAS])
        egress_net.connect(proxy)
        proxy.start()
        socket_path = control_dir / "control.sock"
        deadline = time.monotonic() + 60
        while not socket_path.exists():
            proxy.reload()
            assert proxy.status in ("created", "running"), proxy.logs()[-2000:]
            assert time.monotonic() < deadline, proxy.logs()[-2000:]
            time.sleep(0.1)
        invocation, placeholder = secrets.token_hex(16), secrets.token_urlsafe(32)
        armed = _control(
            socket_path, "/arm", {"invocation": invocation, "placeholder": placeholder}
        )
        assert armed["outcome"] == "armed"
        enclave = docker_client.containers.create(
            DEFAULT_IMAGE,
            entrypoint=[
                "/usr/bin/python3",
                "/opt/enclave.py",
                placeholder,
                MODEL,
                ENCLAVE_API_PROXY_ALIAS,
            ],
            name=f"bq-apiproxy-enclave-{suffix}",
            network=enclave_net.name,
            volumes={str(root / "enclave.py"): {"bind": "/opt/enclave.py", "mode": "ro"}},
            **hardening,
        )
        created.append(enclave)
        enclave.start()
        assert enclave.wait(timeout=60)["StatusCode"] == 0, enclave.logs()[-2000:]
        result = json.loads(enclave.logs(stdout=True, stderr=False).decode().strip())
        assert result["response"].startswith("HTTP/1.1 200")
        assert '"text": "hello"' in result["response"]
        assert CREDENTIAL not in result["response"]
        assert result["direct"] != "reached"
        (seen,) = [
            json.loads(line) for line in (rec_dir / "requests.jsonl").read_text().splitlines()
        ]
        headers = {k.lower(): v for k, v in seen["headers"].items()}
        assert headers["x-api-key"] == CREDENTIAL
        assert headers["host"] == "provider:9000"
        assert placeholder not in json.dumps(seen)
        assert json.loads(seen["body"])["max_tokens"] == 256
        disarmed = _control(socket_path, "/disarm", {"invocation": invocation})
        assert disarmed["outcome"] == "disarmed"
        usage = (usage_dir / "usage.jsonl").read_text()
        record = json.loads(usage.splitlines()[-1])
        assert (record["category"], record["clamped"], record["outputTokens"]) == (
            "forwarded",
            True,
            5,
        )
        assert CREDENTIAL not in usage
        assert CREDENTIAL not in proxy.logs().decode()
    finally:
        for container in created:
            container.remove(force=True)
        for network in networks:
            network.remove()
        shutil.rmtree(root, ignore_errors=True)
