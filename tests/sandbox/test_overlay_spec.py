"""Copy-on-write view specs (sandbox/overlay.py): names, options, prep container."""

from __future__ import annotations

import pytest

from bounded_query.broker.protocol.policy import LABEL_INVOCATION, LABEL_ROLE, LABEL_RUN
from bounded_query.broker.runner import RunnerSettings
from bounded_query.sandbox.overlay import (
    PREP_COMMAND,
    invocation_volume,
    overlay_safe,
    prep_container_body,
    seed_volumes,
)

RUN = "ab" * 16
SETTINGS = RunnerSettings("gvisor", RUN, "bounded-query-python:latest", 30, 256 * 1024**2)


def test_seed_volumes_are_per_run_and_per_seed():
    one = seed_volumes(SETTINGS, "/priv/seeds/a")
    again = seed_volumes(SETTINGS, "/priv/seeds/a")
    other = seed_volumes(SETTINGS, "/priv/seeds/b")
    other_run = seed_volumes(
        RunnerSettings("gvisor", "cd" * 16, "img", 30, 256 * 1024**2), "/priv/seeds/a"
    )
    assert one == again
    assert one.upper.name != other.upper.name
    assert one.upper.name != other_run.upper.name
    assert one.upper.name.startswith("bq-abababababababab-seed-")
    assert one.upper.labels == {LABEL_RUN: RUN, LABEL_ROLE: "seed-view"}
    assert one.work.labels == {LABEL_RUN: RUN, LABEL_ROLE: "seed-work"}
    assert one.upper.driver_opts == {}


def test_prep_overlay_uses_metacopy_over_the_seed():
    volumes = seed_volumes(SETTINGS, "/priv/seeds/a")
    prep = volumes.prep("/priv/seeds/a", "/dv/view/_data", "/dv/work/_data")
    assert prep.driver_opts == {
        "type": "overlay",
        "device": "overlay",
        "o": "lowerdir=/priv/seeds/a,upperdir=/dv/view/_data,workdir=/dv/work/_data,metacopy=on",
    }
    assert prep.labels[LABEL_ROLE] == "seed-prep"
    assert prep.labels[LABEL_RUN] == RUN


def test_invocation_volume_stacks_view_over_seed():
    vol = invocation_volume(
        SETTINGS,
        "0123",
        view_dir="/dv/view/_data",
        seed_host_path="/priv/seeds/a",
        upper_dir="/priv/work/0123/upper",
        work_dir="/priv/work/0123/work",
    )
    assert vol.name == "bq-abababababababab-0123-repo"
    assert vol.driver_opts["o"] == (
        "lowerdir=/dv/view/_data:/priv/seeds/a,upperdir=/priv/work/0123/upper,"
        "workdir=/priv/work/0123/work,metacopy=on"
    )
    assert vol.labels == {LABEL_RUN: RUN, LABEL_INVOCATION: "0123", LABEL_ROLE: "query-repo"}


@pytest.mark.parametrize(
    ("paths", "ok"),
    [
        (("/a/b", "/c"), True),
        (("/a,b",), False),
        (("/a:b",), False),
        (("/a b",), False),
        (("/a\\b",), False),
        (("/a\nb",), False),
        (("relative",), False),
    ],
)
def test_overlay_safe(paths, ok):
    assert overlay_safe(*paths) is ok


def test_prep_container_is_minimal_and_trusted():
    body = prep_container_body(SETTINGS, "vol-prep")
    hc = body["HostConfig"]
    assert body["Entrypoint"] == list(PREP_COMMAND)
    assert body["User"] == "0:0"
    assert body["NetworkDisabled"] is True
    assert hc["Runtime"] == "runc"  # trusted fixed command, see module docstring
    assert hc["NetworkMode"] == "none"
    assert hc["CapDrop"] == ["ALL"]
    assert hc["CapAdd"] == ["CAP_CHOWN", "CAP_FOWNER", "CAP_DAC_OVERRIDE"]
    assert hc["ReadonlyRootfs"] is True
    assert hc["SecurityOpt"] == ["no-new-privileges:true"]
    assert hc["Mounts"] == [
        {
            "Type": "volume",
            "Source": "vol-prep",
            "Target": "/v",
            "ReadOnly": False,
            "VolumeOptions": {"NoCopy": True},
        }
    ]
    assert body["Labels"] == {LABEL_RUN: RUN, LABEL_ROLE: "seed-prep"}


def test_prep_command_chowns_to_the_query_user_and_refreshes_the_index():
    script = PREP_COMMAND[2]
    assert "chown -R 65534:65534 /v" in script
    assert "chmod -R u+w /v" in script
    assert "update-index -q --refresh" in script
    assert script.endswith("chown 0:0 /v && chmod 0700 /v")
