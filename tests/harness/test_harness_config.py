"""Configuration loading and validation (spec 14.2; seed 001 section 2)."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest

from bounded_query.broker.protocol import policy
from bounded_query.harness.__main__ import main
from bounded_query.harness.configuration.config import (
    SCHEMA_PATH,
    BoundedQueriesConfig,
    ConfigError,
    PrivateRepo,
    load_config,
    normalize,
    parse_document,
    validate_section,
)

GOOD: dict[str, Any] = {
    "boundedQueries": {
        "enabled": True,
        "privateRepos": [
            {"repo": "my-org/my-private-repo", "sensitivity": "internal"},
            {"repo": "my-org/public-docs", "sensitivity": "public"},
        ],
        "runtime": "docker",
        "timeout": 30,
        "memoryLimit": "512m",
        "interpreter": "python3",
        "maxInvocations": 32,
    },
    "network": {"allowDomains": ["example.com"]},
}


def problems_of(section: object) -> list[str]:
    return [str(p) for p in validate_section({"boundedQueries": section})]


def test_spec_example_is_valid_and_normalizes():
    assert validate_section(GOOD) == []
    config, warnings = normalize(GOOD["boundedQueries"])
    assert warnings == []
    assert config.enabled is True
    assert config.private_repos == (
        PrivateRepo("my-org/my-private-repo", "internal"),
        PrivateRepo("my-org/public-docs", "public"),
    )
    assert [r.budget for r in config.private_repos] == [64, None]


def test_absent_section_is_disabled_with_defaults():
    assert validate_section({"network": {}}) == []
    config, warnings = normalize(None)
    assert config == BoundedQueriesConfig()
    assert config.enabled is False
    assert warnings == []


def test_defaults_applied_and_only_explicit_true_enables():
    config, _ = normalize({"privateRepos": [{"repo": "a/b", "sensitivity": "sealed"}]})
    assert config.enabled is False
    assert (config.runtime, config.timeout, config.memory_limit) == ("docker", 30, "512m")
    assert (config.interpreter, config.max_invocations) == ("python3", 32)


def test_legacy_bare_string_becomes_internal_with_warning():
    section = {"enabled": True, "privateRepos": ["octo/alpha"]}
    assert problems_of(section) == []
    config, warnings = normalize(section)
    assert config.private_repos == (PrivateRepo("octo/alpha", "internal"),)
    assert len(warnings) == 1
    assert 'entry "octo/alpha" is a legacy bare string' in warnings[0]


@pytest.mark.parametrize(
    "slug",
    [
        "a/b\n",
        "https://github.com/a/b",
        "a/../b",
        "a/..",
        "a/.",
        "a/b?x",
        "a/b#x",
        "a/*",
        "a/b/c",
        "/b",
        "a/",
        "-a/b",
        "a/b ",
        " a/b",
        "a\\b",
        "a/b\x00",
        "a/" + "x" * 101,
    ],
)
def test_unsafe_slugs_rejected_in_both_forms(slug):
    for entry in (slug, {"repo": slug, "sensitivity": "internal"}):
        problems = problems_of({"enabled": True, "privateRepos": [entry]})
        assert problems, entry
        assert problems[0].startswith("boundedQueries.privateRepos[0]")
        assert "owner/repo" in problems[0]
    assert policy.SLUG_RE.fullmatch(slug) is None


@pytest.mark.parametrize("slug", ["a/b", "my-org/my.repo_1", "A1/.github", "o/x.y", "o/-"])
def test_safe_slugs_accepted(slug):
    assert problems_of({"privateRepos": [slug]}) == []
    assert policy.SLUG_RE.fullmatch(slug) is not None


def test_schema_pattern_agrees_with_code_rule():
    schema = json.loads(SCHEMA_PATH.read_text())
    pattern = schema["$defs"]["slug"]["pattern"]
    for text in ["a/b", "a/b\n", "a/..", "a/x..y", "a/.", "a/.x", "a/b\n\n"]:
        assert (re.search(pattern, text) is not None) == (
            policy.SLUG_RE.fullmatch(text) is not None
        ), text


@pytest.mark.parametrize(
    ("section", "location", "fragment"),
    [
        ({"enabled": "yes"}, "boundedQueries.enabled", "not of type 'boolean'"),
        ({"timeout": 541}, "boundedQueries.timeout", "maximum"),
        ({"timeout": 0}, "boundedQueries.timeout", "minimum"),
        ({"timeout": 30.0}, "boundedQueries.timeout", "not of type 'integer'"),
        ({"timeout": True}, "boundedQueries.timeout", "not of type 'integer'"),
        ({"maxInvocations": 10001}, "boundedQueries.maxInvocations", "maximum"),
        ({"runtime": "podman"}, "boundedQueries.runtime", "is not one of"),
        ({"interpreter": "python2"}, "boundedQueries.interpreter", "is not one of"),
        ({"memoryLimit": "512mb"}, "boundedQueries.memoryLimit", "'512mb' is not a valid value"),
        ({"memoryLimit": "512m\n"}, "boundedQueries.memoryLimit", "is not a valid value"),
        (
            {"privateRepos": ["x/../y"]},
            "boundedQueries.privateRepos[0]",
            "'x/../y' is not a valid owner/repo slug",
        ),
        ({"bogus": 1}, "boundedQueries.bogus", "unknown property"),
        (
            {"privateRepos": [{"repo": "a/b"}]},
            "boundedQueries.privateRepos[0]",
            "'sensitivity' is a required property",
        ),
        (
            {"privateRepos": [{"repo": "a/b", "sensitivity": "secret"}]},
            "boundedQueries.privateRepos[0].sensitivity",
            "is not one of",
        ),
        (
            {"privateRepos": [{"repo": "a/b", "sensitivity": "internal", "x": 1}]},
            "boundedQueries.privateRepos[0].x",
            "unknown property",
        ),
        ({"privateRepos": [7]}, "boundedQueries.privateRepos[0]", "not of type 'object'"),
        ([], "boundedQueries", "not of type 'object'"),
    ],
)
def test_each_error_has_location_message_and_hint(section, location, fragment):
    problems = validate_section({"boundedQueries": section})
    assert problems, section
    first = problems[0]
    assert first.location == location
    assert fragment in first.message
    assert first.hint
    assert first.hint != "see spec 14.2"


def test_every_error_is_reported_not_just_the_first():
    problems = problems_of({"enabled": 1, "timeout": 999, "runtime": "x", "extra": 1})
    assert len(problems) == 4


def test_document_must_be_a_mapping():
    problems = validate_section(["boundedQueries"])
    assert problems[0].location == "(document)"


def test_other_sections_are_ignored():
    assert validate_section({"anything": {"goes": [1, 2.5, None]}, "boundedQueries": {}}) == []


def test_format_by_extension_then_json_then_yaml(tmp_path):
    yaml_text = b"boundedQueries:\n  enabled: true\n  privateRepos: [a/b]\n"
    (tmp_path / "c.yml").write_bytes(yaml_text)
    (tmp_path / "c.json").write_bytes(yaml_text)
    (tmp_path / "c.conf").write_bytes(yaml_text)
    assert load_config(str(tmp_path / "c.yml")).config.enabled
    assert load_config(str(tmp_path / "c.conf")).config.enabled
    with pytest.raises(ConfigError, match="JSON"):
        load_config(str(tmp_path / "c.json"))


def test_stdin_source():
    data = json.dumps(GOOD).encode()
    loaded = load_config("-", io.BytesIO(data))
    assert loaded.config.slugs == ("my-org/my-private-repo", "my-org/public-docs")


@pytest.mark.parametrize(
    "text",
    [
        b'{"boundedQueries": {}, "boundedQueries": {"enabled": true}}',
        b"boundedQueries: {}\nboundedQueries: {enabled: true}\n",
        b'{"boundedQueries": {"timeout": NaN}}',
        b"\xff\xfe",
        b"[unclosed",
    ],
)
def test_parse_errors_are_config_errors(text):
    with pytest.raises(ConfigError):
        parse_document(text, "c.json" if b"NaN" in text else "-")


def test_yaml_is_strict_about_booleans_and_integers():
    doc = parse_document(b"boundedQueries:\n  enabled: yes\n  timeout: 1:30\n", "x.yaml")
    assert doc == {"boundedQueries": {"enabled": "yes", "timeout": "1:30"}}
    problems = validate_section(doc)
    assert {p.location for p in problems} == {"boundedQueries.enabled", "boundedQueries.timeout"}
    doc = parse_document(b"boundedQueries: {enabled: true, timeout: 30}\n", "x.yaml")
    assert doc == {"boundedQueries": {"enabled": True, "timeout": 30}}


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "missing.json"))


def test_oversize_document_refused():
    with pytest.raises(ConfigError, match="larger than"):
        parse_document(b" " * (1024 * 1024 + 1), "-")


def test_validate_command_exit_codes_and_events(tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD))
    assert main(["validate", "--config", str(good)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["privateRepos"][0]["budgetBits"] == 64
    events = [json.loads(line) for line in err.splitlines()]
    assert events[-1]["event"] == "config_loaded"

    bad = tmp_path / "bad.yaml"
    bad.write_text("boundedQueries:\n  enabled: true\n  privateRepos: ['a/b/c']\n  timeout: 999\n")
    assert main(["validate", "--config", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    events = [json.loads(line) for line in err.splitlines()]
    errors = [e for e in events if e["event"] == "config_error"]
    assert {e["location"] for e in errors} == {
        "boundedQueries.privateRepos[0]",
        "boundedQueries.timeout",
    }
    assert all(e["hint"] for e in errors)
    assert events[-1] == {**events[-1], "event": "config_invalid", "problems": 2}


def test_usage_error_exits_2(capsys):
    assert main(["validate"]) == 2
    assert main([]) == 2
    capsys.readouterr()
