"""A bad ``boundedAgents`` section stops ``run`` before anything is staged (exit 2)."""

from __future__ import annotations

import io
import json
import os

import pytest

from bounded_query.harness import RunOptions, run
from bounded_query.harness.records.events import EventSink
from tests.harness.bq_harness_helpers import FAKE_BROKER, HOST_AGENT, var_tmp_base

SECRET = "sk-ant-never-printed-0123456789"


@pytest.mark.parametrize(
    ("agents", "others", "location"),
    [
        ({"enabled": True, "engine": "claude"}, {}, "boundedAgents.model"),
        (
            {"enabled": True, "engine": "claude", "model": "m", "cpuLimit": "1e9"},
            {},
            "boundedAgents.cpuLimit",
        ),
        (
            {
                "enabled": True,
                "engine": "claude",
                "model": "m",
                "privateRepos": [{"repo": "octo/alpha", "sensitivity": "internal"}],
            },
            {"container": {"enableDind": True}},
            "container.enableDind",
        ),
        (
            {"enabled": True, "model": "m", "privateRepos": ["octo/alpha"]},
            {},
            "boundedAgents.privateRepos[0]",
        ),
        ({"bogus": 1}, {}, "boundedAgents.bogus"),
    ],
)
async def test_a_bad_section_exits_2_and_stages_nothing(
    tmp_path, fake_engine, agents, others, location
):
    config = tmp_path / "c.json"
    queries = {"enabled": True, "privateRepos": [{"repo": "octo/alpha", "sensitivity": "internal"}]}
    config.write_text(json.dumps({"boundedQueries": queries, "boundedAgents": agents, **others}))
    marker = tmp_path / "ran"
    summary = tmp_path / "summary.md"
    env = {
        "PATH": os.environ["PATH"],
        "GH_TOKEN": "t",
        "ANTHROPIC_API_KEY": SECRET,
        "GITHUB_STEP_SUMMARY": str(summary),
        "DOCKER_HOST": fake_engine.docker_host,
    }
    stream = io.StringIO()
    with var_tmp_base() as base:
        options = RunOptions(
            config_source=str(config),
            agent=("touch", str(marker)),
            seed_sources={"octo/alpha": tmp_path},
            workspace=tmp_path,
            base=base,
            broker_command=FAKE_BROKER,
            probe_runtime=False,
            **HOST_AGENT,
        )
        status = await run(options, EventSink(stream), env)
        assert list(base.iterdir()) == []
    assert status == 2
    assert not marker.exists()
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert location in [e.get("location") for e in events if e["event"] == "config_error"]
    assert [e["event"] for e in events[-2:]] == ["config_invalid", "run_end"]
    assert f"`{location}`" in summary.read_text()
    assert fake_engine.unexpected == []
    assert SECRET not in stream.getvalue() + summary.read_text()
