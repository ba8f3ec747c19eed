"""A bounded-agent question end to end, from the agent's side (spec 15.3, 15.5, 15.6, 15.8).

``bounded-query-harness run`` with both subsystems configured in the
configuration file (nothing injected): the agent (a host process) runs the
installed ``bounded-agent`` it finds on PATH, the agent broker admits the
question, charges it and launches the real Claude Code in a real enclave;
the engine reaches its model only through the run's API proxy, whose
upstream is the scripted stand-in (``harness/scripted_provider.py``) on the
egress network named by ``--api-proxy-egress-network``. The stand-in answers
only with the real credential and only once the seed file's marker came back
in a tool result, so the ``ok`` answer proves that the engine read the seed
inside the enclave and that the proxy swapped the placeholder for the real
credential. A second question runs in a fresh enclave and gets the same
answer; a bounded query of the same run still answers; nothing of the run
is left afterwards. With a model that answers ``"maybe"`` for a boolean, the
answer is the canonical error.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import pytest

from bounded_query.broker.protocol.policy import (
    DEFAULT_IMAGE,
    ENCLAVE_IMAGES,
    LABEL_AGENT_HARNESS,
    LABEL_AGENT_RUN,
)
from bounded_query.harness import RunOptions, run
from bounded_query.harness.configuration.apiproxy_image import APIPROXY_IMAGE
from bounded_query.harness.records.events import EventSink
from bounded_query.harness.scripted_provider import LABEL, ProviderScript, scripted_provider
from tests.harness.bq_harness_helpers import HOST_AGENT, make_repo, var_tmp_base

pytestmark = pytest.mark.engine

CREDENTIAL = "sk-ant-api03-E2E-" + secrets.token_hex(12)
MARKER = "seed-marker-" + secrets.token_hex(8)
DOCKER_HOST = "unix:///var/run/docker.sock"

#: The agent: two bounded-agent questions (the second one's answer will not
#: conform), then one bounded query, each through the installed tools on PATH.
AGENT = r"""
import json, subprocess, sys
out = sys.argv[1]
def ask(argv, stdin):
    done = subprocess.run(argv, input=stdin.encode(), capture_output=True, timeout=300)
    return {"stdout": done.stdout.decode(), "stderr": done.stderr.decode(), "rc": done.returncode}
answers = [
    ask(["bounded-agent", "--repo", "octo/alpha", "--schema", '{"type":"boolean"}'],
        "Does notes/marker.txt hold a marker line? Read it."),
    ask(["bounded-agent", "--repo", "octo/alpha", "--schema", '{"type":"boolean"}'],
        "Same question, asked again."),
    ask(["bounded-query", "--repo", "octo/alpha", "--schema", '{"type":"boolean"}'],
        "import os\nopen('/query/out','w')"
        ".write('true' if os.path.exists('/query/repo/notes') else 'false')\n"),
]
import os
brokers = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        netns = os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        continue
    if b"--config" not in argv:
        continue
    config = argv[argv.index(b"--config") + 1].decode()
    for kind in ("agent", "query"):
        if f"/awf-bounded-{kind}-private-" in config:
            brokers[kind] = netns
json.dump({"answers": answers, "brokers": brokers, "own": os.readlink("/proc/self/ns/net")},
          open(out, "w"))
"""


@pytest.fixture
def engine(docker_client):
    for image in (DEFAULT_IMAGE, APIPROXY_IMAGE, ENCLAVE_IMAGES["claude"]):
        try:
            docker_client.images.get(image)
        except Exception:
            pytest.fail(f"{image} is missing: run .ci/build-images (make images)")
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the bounded-agent engine tests need root under CI=true")
        pytest.skip("the bounded-agent engine tests need root")
    return docker_client


def _config(tmp: Path, target: str) -> Path:
    config = tmp / "awf.json"
    repos = [{"repo": "octo/alpha", "sensitivity": "internal"}]
    config.write_text(
        json.dumps(
            {
                "boundedQueries": {"enabled": True, "runtime": "docker", "privateRepos": repos},
                "boundedAgents": {
                    "enabled": True,
                    "runtime": "docker",
                    "engine": "claude",
                    "model": "claude-haiku-4-5",
                    "privateRepos": repos,
                    "timeout": 120,
                },
                "apiProxy": {"targets": {"anthropic": {"host": target}}},
            }
        )
    )
    return config


def _agent_objects(client) -> set[str]:
    """Every container and network any bounded-agent run labelled (by label key)."""
    found: set[str] = set()
    for label in (LABEL_AGENT_RUN, LABEL_AGENT_HARNESS, LABEL):
        found |= {c.name for c in client.containers.list(all=True, filters={"label": label})}
        found |= {n.name for n in client.networks.list(filters={"label": label})}
    return found


async def _run_with_stand_in(
    tmp_path: Path, files: dict[str, str], script: ProviderScript
) -> tuple[int, list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """One harness run whose model is the stand-in playing ``script``: the exit
    status, the events, what the agent saw and the requests the stand-in got."""
    source = tmp_path / "src"
    make_repo(source, files)
    report = tmp_path / "answers.json"
    (tmp_path / "agent.py").write_text(AGENT)
    stream = io.StringIO()
    with scripted_provider(DOCKER_HOST, script) as provider, var_tmp_base() as base:
        options = RunOptions(
            config_source=str(_config(tmp_path, provider.target)),
            agent=(sys.executable, str(tmp_path / "agent.py"), str(report)),
            seed_sources={"octo/alpha": source},
            workspace=tmp_path,
            base=base,
            allow_insecure_api_target=True,
            api_proxy_egress_network=provider.network,
            **HOST_AGENT,
        )
        env = {"PATH": os.environ["PATH"], "ANTHROPIC_API_KEY": CREDENTIAL}
        status = await run(options, EventSink(stream), env)
        requests = provider.requests()
        assert os.listdir(base) == []
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert CREDENTIAL not in stream.getvalue()  # nowhere in the operator's records
    return status, events, json.loads(report.read_text()), requests


async def test_a_bounded_agent_answers_from_the_seed_through_the_proxy(engine, tmp_path):
    script = ProviderScript(
        command="cat notes/marker.txt",
        marker=MARKER,
        answer="```json\ntrue\n```",
        wrong_answer='"maybe"',
        credential=CREDENTIAL,
    )
    before = _agent_objects(engine)
    files = {"README.md": "hello\n", "notes/marker.txt": MARKER + "\n"}
    status, events, seen, first_requests = await _run_with_stand_in(tmp_path, files, script)
    assert status == 0, [e for e in events if "fail" in e["event"] or "error" in e["event"]]
    answers = seen["answers"]
    # spec 15.6: the agent broker has no network (a namespace of its own);
    # the query broker shares the harness's (it may be given a tcp:// engine).
    assert seen["brokers"]["agent"] != seen["own"], seen
    assert seen["brokers"]["query"] == seen["own"], seen
    for answer in answers:
        assert (answer["rc"], answer["stderr"]) == (0, ""), answer
    agent_first, agent_second, query = (a["stdout"] for a in answers)
    assert agent_first == '{"status":"ok","result":true}\n'
    # A fresh enclave: the engine reads the seed again and gets the same answer.
    assert agent_second == '{"status":"ok","result":true}\n'
    assert len([r for r in first_requests if r["tool_results"]]) >= 2
    assert query == '{"status":"ok","result":true}\n'
    # The model saw the real credential only, never the enclave's placeholder,
    # and the marker came back to it from the engine's own tool call.
    messages = [r for r in first_requests if r["path"].startswith("/v1/messages")]
    assert messages, first_requests
    for request in messages:
        headers = {k.lower(): v for k, v in request["headers"]}
        assert headers.get("x-api-key") == CREDENTIAL
        assert request["model"] == "claude-haiku-4-5"
    assert any(MARKER in result for r in messages for result in r["tool_results"])
    assert not [r for r in first_requests if r.get("reply") == "unauthorized"]
    assert _agent_objects(engine) - before == set()


async def test_a_non_conforming_final_answer_is_the_canonical_error(engine, tmp_path):
    # The engine reads the seed, the model then answers "maybe" for a boolean.
    script = ProviderScript(
        command="cat notes/marker.txt", marker=MARKER, answer='"maybe"', credential=CREDENTIAL
    )
    files = {"notes/marker.txt": MARKER + "\n"}
    status, _events, seen, requests = await _run_with_stand_in(tmp_path, files, script)
    assert any(MARKER in t for r in requests for t in r["tool_results"])
    assert status == 0
    answers = [a["stdout"] for a in seen["answers"]]
    assert answers[:2] == ['{"status":"error"}\n'] * 2
    assert answers[2] == '{"status":"ok","result":true}\n'
