"""A scripted model provider in a container, for the demo's bounded-agent question.

Theory of operation: no model provider is reachable from a machine without a
credential (or without the internet), yet ``make demo`` asks one real
bounded-agent question end to end. So the demo starts this stand-in
(``example/anthropic_provider.py``: the Anthropic Messages API, streaming,
two turns) as the API proxy's upstream: a container of the local query image
(nothing pulled), uid 65534, read-only, without capabilities, alone on a
bridge network of its own that the harness then joins the API proxy's egress
side to (``--api-proxy-egress-network``; the target is plain http, hence
``--allow-insecure-api-target``). The engine in the enclave still runs for
real: its first turn is a shell tool call (the script's ``command``) and the
stand-in gives the script's ``answer`` only when the tool result carries the
``marker``, so the answer exists only if the engine really read the seed.

The stand-in accepts only the credential it was given (``x-api-key``), so a
correct answer also shows that the API proxy replaced the enclave's
placeholder with the real credential. Everything it creates carries
:data:`LABEL` and is removed on exit, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bounded_query.broker.protocol.policy import DEFAULT_IMAGE, QUERY_GID, QUERY_UID
from bounded_query.sandbox import engine

__all__ = ["LABEL", "PORT", "ProviderScript", "ScriptedProvider", "scripted_provider"]

#: Label of the stand-in's container and network (value: its instance id).
LABEL = "bounded-query.scripted-provider"
#: The stand-in's port on its network.
PORT = 8080
#: How long it may take to listen.
READY_TIMEOUT_S = 60.0
_SOURCE = Path(__file__).resolve().parent / "example" / "anthropic_provider.py"


@dataclass(frozen=True, slots=True)
class ProviderScript:
    """What the stand-in plays: the tool call, what proves it ran, the answers."""

    command: str
    marker: str
    answer: str
    wrong_answer: str = "null"
    #: The one ``x-api-key`` it accepts (None: any).
    credential: str | None = None

    def encode(self) -> str:
        """The stand-in's script file (``anthropic_provider.Script``)."""
        return json.dumps(
            {
                "command": self.command,
                "marker": self.marker,
                "answer": self.answer,
                "wrong_answer": self.wrong_answer,
                "credential": self.credential,
            }
        )


@dataclass(frozen=True, slots=True)
class ScriptedProvider:
    """A running stand-in: its network, the API target naming it, its record file."""

    network: str
    host: str
    record: Path

    @property
    def target(self) -> str:
        """``apiProxy.targets.anthropic.host`` for it (plain http, on its network)."""
        return f"http://{self.host}:{PORT}"

    def requests(self) -> list[dict[str, Any]]:
        """The requests it received so far (one JSON line each)."""
        text = self.record.read_text(encoding="utf-8") if self.record.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]


@contextlib.contextmanager
def scripted_provider(
    docker_host: str, script: ProviderScript, *, image: str = DEFAULT_IMAGE
) -> Iterator[ScriptedProvider]:
    """Start the stand-in playing ``script``; remove it and its network on exit.

    Raises:
        RuntimeError: (local fault) the image is missing or the stand-in did not
            start listening in time; nothing is left behind.
    """
    instance = secrets.token_hex(6)
    name = f"bq-scripted-provider-{instance}"
    labels = {LABEL: instance}
    work = Path(tempfile.mkdtemp(prefix="bq-scripted-provider-", dir="/var/tmp"))
    api = engine.api_client(docker_host, 60)
    created: list[str] = []
    network_made = False
    try:
        work.chmod(0o755)
        shutil.copyfile(_SOURCE, work / "provider.py")
        (work / "script.json").write_text(script.encode(), encoding="utf-8")
        record = work / "record.jsonl"
        record.write_text("")
        with contextlib.suppress(PermissionError):
            os.chown(record, QUERY_UID, QUERY_GID)
        record.chmod(0o666)
        api.create_network(name, driver="bridge", labels=labels)
        network_made = True
        container = api.create_container(
            image,
            entrypoint=["/usr/bin/python3", "-I", "-S", "-u", "/provider/provider.py"],
            command=["/provider/script.json", "/provider/record.jsonl", str(PORT)],
            user=f"{QUERY_UID}:{QUERY_GID}",
            labels=labels,
            name=name,
            host_config=api.create_host_config(
                binds={str(work): {"bind": "/provider", "mode": "rw"}},
                network_mode=name,
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
            ),
        )
        cid = str(container["Id"])
        created.append(cid)
        api.start(cid)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while b"ready" not in api.logs(cid, stdout=True, stderr=False):
            if time.monotonic() > deadline or not api.inspect_container(cid)["State"]["Running"]:
                raise RuntimeError("the scripted provider did not start listening")
            time.sleep(0.1)
        yield ScriptedProvider(network=name, host=name, record=record)
    finally:
        for cid in created:
            with contextlib.suppress(Exception):
                api.remove_container(cid, force=True)
        if network_made:
            with contextlib.suppress(Exception):
                api.remove_network(name)
        api.close()
        shutil.rmtree(work, ignore_errors=True)
