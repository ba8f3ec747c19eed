"""The two bounded-agent options of ``run`` and ``compose`` (issue 18 item 1)."""

from __future__ import annotations

import json

import pytest

from bounded_query.harness.__main__ import UsageError, _run_options, build_parser, main
from bounded_query.harness.lifecycle.options import RunOptions


def options_of(*argv: str) -> RunOptions:
    args = build_parser().parse_args(list(argv))
    return _run_options(args, ("true",))


@pytest.mark.parametrize("command", [["run"], ["compose", "--out", "/tmp/x"]])
def test_the_options_reach_run_options(command):
    base = [*command, "--config", "c.json"]
    tail = ["--", "true"] if command == ["run"] else []
    default = options_of(*base, *tail)
    assert default.allow_insecure_api_target is False
    assert default.api_proxy_egress_network is None
    given = options_of(
        *base, "--allow-insecure-api-target", "--api-proxy-egress-network", "egress-1", *tail
    )
    assert given.allow_insecure_api_target is True
    assert given.api_proxy_egress_network == "egress-1"


def test_run_options_defaults_are_off():
    options = RunOptions(config_source="c", agent=("true",))
    assert (options.allow_insecure_api_target, options.api_proxy_egress_network) == (False, None)


@pytest.mark.parametrize("name", ["", "a b", "-x", "host", "none", "x" * 64, "awf-bounded-agent"])
def test_a_bad_network_name_is_a_usage_error(name):
    with pytest.raises(UsageError, match="--api-proxy-egress-network"):
        options_of("run", "--config", "c.json", f"--api-proxy-egress-network={name}", "--", "true")


def test_a_bad_network_name_exits_2_before_anything(tmp_path, capsys):
    config = tmp_path / "c.json"
    config.write_text("{}")
    status = main(
        [
            "run",
            "--config",
            str(config),
            "--state-base",
            str(tmp_path / "base"),
            "--api-proxy-egress-network",
            "bad name",
            "--",
            "true",
        ]
    )
    assert status == 2
    _out, err = capsys.readouterr()
    events = [json.loads(line) for line in err.splitlines()]
    assert [e["event"] for e in events] == ["usage_error"]
    assert "--api-proxy-egress-network" in events[0]["message"]
    assert not (tmp_path / "base").exists()
