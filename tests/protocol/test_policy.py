"""One source per fact: every shipped copy of a policy value agrees with broker/protocol/policy.py.

The JSON Schemas (the ``boundedQueries`` section, the audit and report
records), the generated SKILL.md, the MCP server's tool descriptions and the
docs repeat budgets, limits and names that the code takes from the policy
module; each test here fails when one copy drifts. The slug and memory-limit
rules are compared as text *and* by behaviour (the schema validator and the
Python functions must accept exactly the same strings).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from bounded_query import seccomp
from bounded_query.broker import config as broker_config
from bounded_query.broker import runner
from bounded_query.broker.protocol import MAX_SLUG_CHARS, TIMING_BUCKETS_MS, is_valid_slug, policy
from bounded_query.harness import config as harness_config
from bounded_query.harness import preflight
from bounded_query.harness.skill import render_skill
from bounded_query.sandbox import spec
from bounded_query.wrapper import bounded_query_cost as cost_tool
from bounded_query.wrapper import bounded_query_mcp as mcp
from jsonschema import Draft202012Validator

REPO_ROOT = Path(__file__).resolve().parents[2]
SECTION_SCHEMA = REPO_ROOT / "harness" / "bounded-queries.schema.json"
RECORD_SCHEMAS = REPO_ROOT / "harness" / "schemas"


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def anchored(pattern: str) -> str:
    """How the schema files anchor a whole-string rule (ECMA-262 and Python alike)."""
    return "^" + pattern + "$(?![\\s\\S])"


SECTION = load(SECTION_SCHEMA)
PROPS = SECTION["properties"]


def test_section_schema_limits_are_the_policy():
    assert PROPS["timeout"] == {
        "type": "integer",
        "minimum": policy.MIN_TIMEOUT_S,
        "maximum": policy.MAX_TIMEOUT_S,
    }
    assert PROPS["maxInvocations"] == {
        "type": "integer",
        "minimum": policy.MIN_INVOCATIONS,
        "maximum": policy.MAX_INVOCATIONS,
    }
    assert PROPS["privateRepos"]["maxItems"] == policy.MAX_PRIVATE_REPOS
    assert tuple(PROPS["runtime"]["enum"]) == policy.RUNTIMES
    assert tuple(PROPS["interpreter"]["enum"]) == policy.INTERPRETERS
    entry = SECTION["$defs"]["repoEntry"]["properties"]
    assert tuple(entry["sensitivity"]["enum"]) == policy.SENSITIVITIES
    assert PROPS["memoryLimit"]["pattern"] == anchored(policy.MEMORY_LIMIT_PATTERN)
    slug = SECTION["$defs"]["slug"]
    assert slug["pattern"] == anchored(policy.SLUG_PATTERN)
    assert slug["maxLength"] == MAX_SLUG_CHARS


def test_defaults_satisfy_the_schema_and_the_preflight():
    validator = Draft202012Validator(SECTION)
    defaults = dict(policy.DEFAULTS)
    defaults["enabled"] = True
    assert list(validator.iter_errors(defaults)) == []
    assert set(policy.DEFAULTS) <= set(PROPS)
    assert policy.DEFAULT_RUNTIME in policy.RUNTIMES
    assert policy.DEFAULT_INTERPRETER in policy.INTERPRETERS
    assert policy.MIN_TIMEOUT_S <= policy.DEFAULT_TIMEOUT_S <= policy.MAX_TIMEOUT_S
    assert policy.MIN_INVOCATIONS <= policy.DEFAULT_MAX_INVOCATIONS <= policy.MAX_INVOCATIONS
    assert policy.parse_memory_limit(policy.DEFAULT_MEMORY_LIMIT) == 512 * 1024**2
    # The 540 s cap leaves the last minute of the 600 s bucket for cleanup.
    assert TIMING_BUCKETS_MS[-1] == policy.MAX_TIMEOUT_S * 1000 + 60_000


def test_every_module_uses_the_policy_objects():
    """The re-exports are the policy's own objects, not equal copies."""
    assert harness_config.RUN_BUDGETS is policy.RUN_BUDGETS
    assert broker_config.BUDGET_BITS is policy.RUN_BUDGETS
    assert harness_config.DEFAULTS is policy.DEFAULTS
    assert harness_config.SLUG_RE is policy.SLUG_RE
    assert runner.parse_memory_limit is policy.parse_memory_limit
    assert preflight.DEFAULT_IMAGE == policy.DEFAULT_IMAGE
    assert preflight.MAX_TIMEOUT_S == policy.MAX_TIMEOUT_S
    assert harness_config.BoundedQueriesConfig().timeout == policy.DEFAULT_TIMEOUT_S
    assert runner.RunnerSettings("docker", "0" * 16, "i", 1, 1).docker_host == (
        policy.DEFAULT_DOCKER_HOST
    )
    assert seccomp.RUNTIMES == {"runc", "runsc"} == set(policy.OCI_RUNTIMES.values())
    assert spec.RUNTIMES is policy.OCI_RUNTIMES
    assert (spec.QUERY_UID, spec.QUERY_GID) == (policy.QUERY_UID, policy.QUERY_GID) == (65534,) * 2


def test_budgets():
    assert dict(policy.RUN_BUDGETS) == {
        "public": None,
        "internal": 64,
        "confidential": 8,
        "sealed": 0,
    }
    assert dict(policy.METERED_BUDGETS) == {"internal": 64, "confidential": 8, "sealed": 0}
    with pytest.raises(TypeError):
        policy.RUN_BUDGETS["internal"] = 1000  # type: ignore[index]


def test_record_schemas_name_the_policy_sensitivities():
    audit = load(RECORD_SCHEMAS / "bounded-query-audit.v1.schema.json")
    assert audit["properties"]["sensitivity"]["enum"] == [*policy.SENSITIVITIES, None]
    report = load(RECORD_SCHEMAS / "bounded-query-report.v1.schema.json")
    item = report["properties"]["repos"]["items"]["properties"]
    assert tuple(item["sensitivity"]["enum"]) == policy.SENSITIVITIES
    # The records' looser repo pattern accepts every configured slug.
    loose = re.compile(item["repo"]["pattern"])
    for slug in SLUGS_OK:
        assert loose.search(slug), slug


def test_cost_tool_skill_and_mcp_state_the_policy_budgets():
    protocol = cost_tool.load_protocol()
    assert cost_tool.run_budgets(protocol) == dict(policy.METERED_BUDGETS)
    text = cost_tool.render(cost_tool.assess(b'{"type":"boolean"}', protocol), protocol, False)
    for name, bits in policy.METERED_BUDGETS.items():
        assert f"{name} ({bits} bits)" in text
    budgets = policy.METERED_BUDGETS
    assert (
        f"internal {budgets['internal']} bits, confidential {budgets['confidential']},"
        f" sealed {budgets['sealed']}"
    ) in mcp.COST_DESCRIPTION
    repos = tuple(
        harness_config.PrivateRepo(f"o/r{i}", s) for i, s in enumerate(policy.SENSITIVITIES)
    )
    skill = render_skill(harness_config.BoundedQueriesConfig(True, repos))
    for name, bits in policy.METERED_BUDGETS.items():
        assert f"{bits} bits/run (`{name}`)" in skill
    assert f"how many fit in {budgets['internal']} bits (`internal`)" in skill


def test_docs_state_the_policy_budgets():
    text = (REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    budgets = policy.RUN_BUDGETS
    assert (
        f"public: unmetered, internal: {budgets['internal']},"
        f" confidential: {budgets['confidential']}"
    ) in " ".join(text.split())


SLUGS_OK = [
    "o/r",
    "octo/alpha",
    "a-b/c.d_e-f",
    "A" * 39 + "/" + "r" * 100,
    "o/.x",
    "o/x.",
    "o/.git",
    "0/_",
]
SLUGS_BAD = [
    "",
    "o",
    "/r",
    "o/",
    "o/.",
    "o/..",
    "o/a..b",
    "-o/r",
    "o-/r/x",
    "o.x/r",
    "o/r\n",
    "o/r ",
    " o/r",
    "o/r/",
    "A" * 40 + "/r",
    "o/" + "r" * 101,
    "https://github.com/o/r",
    "o/r?x",
    "o/r#x",
    "o/*",
    "o/\u0661",
    "\u0131/r",
]


@pytest.mark.parametrize("slug", SLUGS_OK + SLUGS_BAD)
def test_slug_rule_is_the_same_everywhere(slug):
    expected = slug in SLUGS_OK
    schema_ok = Draft202012Validator(SECTION["$defs"]["slug"]).is_valid(slug)
    assert is_valid_slug(slug) is expected
    assert (policy.SLUG_RE.fullmatch(slug) is not None) is expected
    assert schema_ok is expected


MEMORY_OK = ["6m", "512m", "512M", "1g", "64g", "6291456", "6291456b", "6144k", "0" * 14 + "6m"]
MEMORY_BAD = ["", "m", "5m", "65g", "1.5g", "1gb", "1t", "-1g", " 1g", "1g\n", "\u0661g", "1" * 16]


@pytest.mark.parametrize("text", MEMORY_OK + MEMORY_BAD)
def test_memory_rule_shape_is_the_schemas(text):
    """The schema checks the shape; parse_memory_limit the shape and the range."""
    shape_ok = Draft202012Validator(PROPS["memoryLimit"]).is_valid(text)
    assert shape_ok is (re.fullmatch(policy.MEMORY_LIMIT_PATTERN, text) is not None)
    try:
        policy.parse_memory_limit(text)
    except ValueError:
        parsed = False
    else:
        parsed = True
    assert parsed is (text in MEMORY_OK)
    if parsed:
        assert shape_ok


def test_shell_copies_name_the_policy_values():
    """Shell cannot import the policy: its copies are checked here."""
    action = (REPO_ROOT / ".github" / "action" / "bq-action.sh").read_text(encoding="utf-8")
    assert "\n    " + "|".join(policy.LAUNCHABLE_RUNTIMES) + ")\n" in action
    images = (REPO_ROOT / ".ci" / "build-images").read_text(encoding="utf-8")
    assert f"sandbox/image/build.sh {policy.DEFAULT_IMAGE}\n" in images
    required = (REPO_ROOT / ".ci" / "require-provisioned").read_text(encoding="utf-8")
    assert f"for image in {policy.DEFAULT_IMAGE} " in required
    engine = (REPO_ROOT / ".ci" / "provision-engine").read_text(encoding="utf-8")
    oci = policy.OCI_RUNTIMES[policy.RUNTIME_GVISOR]
    assert f'{{"runtimes": {{"{oci}": {{"path": "/usr/bin/{oci}"' in engine
