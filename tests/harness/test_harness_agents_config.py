"""The ``boundedAgents`` section, its API target and ``container.enableDind`` (spec 15.2)."""

from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from bounded_query.broker.protocol import policy
from bounded_query.harness.__main__ import main
from bounded_query.harness.configuration.agents import (
    AGENTS_SCHEMA_PATH,
    normalize_agents,
    parse_api_target,
    validate_agents,
)
from bounded_query.harness.configuration.config import (
    SCHEMA_PATH,
    ApiTarget,
    BoundedAgentsConfig,
    ConfigError,
    PrivateRepo,
    load_config,
    parse_document,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
#: spec 15.2's example, verbatim.
SPEC_EXAMPLE: dict[str, Any] = {
    "boundedAgents": {
        "enabled": True,
        "privateRepos": [{"repo": "my-org/private-service", "sensitivity": "internal"}],
        "runtime": "docker",
        "engine": "copilot",
        "model": "gpt-4o-mini",
        "timeout": 120,
        "memoryLimit": "512m",
        "cpuLimit": "1",
        "pidsLimit": 128,
        "tmpfsLimit": "64m",
        "maxOutputBytes": 8192,
        "maxTaskBytes": 4096,
        "maxInvocations": 8,
    }
}
MINIMAL: dict[str, Any] = {
    "enabled": True,
    "privateRepos": [{"repo": "octo/alpha", "sensitivity": "confidential"}],
    "engine": "claude",
    "model": "claude-sonnet-4-5",
}


def doc(section: object = None, **others: Any) -> dict[str, Any]:
    return {"boundedAgents": MINIMAL if section is None else section, **others}


def with_(**fields: Any) -> dict[str, Any]:
    return {**MINIMAL, **fields}


def problems(document: Any) -> list[Any]:
    return validate_agents(document)


def only(document: Any) -> Any:
    found = problems(document)
    assert len(found) == 1, [str(p) for p in found]
    return found[0]


def test_spec_example_is_valid_and_normalizes():
    assert problems(SPEC_EXAMPLE) == []
    config = normalize_agents(SPEC_EXAMPLE)
    assert config.enabled is True
    assert config.private_repos == (PrivateRepo("my-org/private-service", "internal"),)
    assert (config.engine, config.model, config.profile) == ("copilot", "gpt-4o-mini", "openai")
    assert config.memory_bytes == 512 * 1024**2
    assert config.tmpfs_bytes == policy.ENCLAVE_TMPFS_BYTES
    assert config.nano_cpus == policy.NANO_CPUS_PER_CPU
    # copilot's default target: the provider's public API over https.
    assert config.target == ApiTarget("https", "api.githubcopilot.com", 443, "")


def test_defaults_are_the_spec_table():
    config = normalize_agents(doc())
    assert config.runtime == "docker"
    assert config.timeout == 120
    assert (config.memory_limit, config.cpu_limit, config.tmpfs_limit) == ("512m", "1", "64m")
    assert config.pids_limit == 128
    assert (config.max_output_bytes, config.max_task_bytes, config.max_invocations) == (
        8192,
        4096,
        8,
    )
    assert (config.max_model_requests, config.max_model_tokens) == (8, 1024)
    assert config.target == ApiTarget("https", "api.anthropic.com", 443, "")
    assert normalize_agents({"boundedAgents": {}}).engine == "copilot"


def test_absent_section_is_disabled_and_other_sections_stay_awfs():
    """Without boundedAgents nothing of apiProxy or container is judged (they are AWF's)."""
    document = {"apiProxy": {"targets": {"vertex": 1}}, "container": {"enableDind": "yes"}}
    assert problems(document) == []
    assert normalize_agents(document) == BoundedAgentsConfig()
    assert BoundedAgentsConfig().enabled is False


def test_only_an_explicit_true_enables():
    assert normalize_agents(doc({"model": "m"})).enabled is False
    found = only(doc({"enabled": "true"}))
    assert found.location == "boundedAgents.enabled"
    assert found.hint == "use true or false"
    yaml_doc = parse_document(b"boundedAgents:\n  enabled: yes\n", "c.yaml")
    assert only(yaml_doc).location == "boundedAgents.enabled"


BOUNDS = [
    ("timeout", 1, 540),
    ("pidsLimit", policy.MIN_AGENT_PIDS_LIMIT, policy.MAX_AGENT_PIDS_LIMIT),
    ("maxOutputBytes", 1, 8192),
    ("maxTaskBytes", 1, 65536),
    ("maxInvocations", policy.MIN_INVOCATIONS, policy.MAX_INVOCATIONS),
    ("maxModelRequests", 1, 64),
    ("maxModelTokens", 1, 32768),
]


@pytest.mark.parametrize(("field", "low", "high"), BOUNDS)
def test_every_integer_field_has_its_bounds(field, low, high):
    for good in (low, high):
        assert problems(doc(with_(**{field: good}))) == [], good
    key = {
        "timeout": "timeout",
        "pidsLimit": "pids_limit",
        "maxOutputBytes": "max_output_bytes",
        "maxTaskBytes": "max_task_bytes",
        "maxInvocations": "max_invocations",
        "maxModelRequests": "max_model_requests",
        "maxModelTokens": "max_model_tokens",
    }[field]
    assert getattr(normalize_agents(doc(with_(**{field: high}))), key) == high
    for bad, word in ((low - 1, "minimum"), (high + 1, "maximum")):
        found = only(doc(with_(**{field: bad})))
        assert found.location == f"boundedAgents.{field}"
        assert word in found.message
        assert f"from {low} to {high}" in found.hint
    for bad in (float(low), True, str(low), None):
        found = only(doc(with_(**{field: bad})))
        assert found.location == f"boundedAgents.{field}"
        assert "not of type 'integer'" in found.message


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("runtime", "podman", '"docker", "gvisor" or "sbx"'),
        ("engine", "aider", '"copilot", "claude", "codex" or "gemini"'),
        ("profile", "google", '"openai" or "anthropic"'),
    ],
)
def test_enumerations(field, value, fragment):
    found = only(doc(with_(**{field: value})))
    assert found.location == f"boundedAgents.{field}"
    assert "is not one of" in found.message
    assert fragment in found.hint
    for good in {"runtime": policy.RUNTIMES, "engine": policy.AGENT_ENGINES}.get(
        field, policy.AGENT_PROFILES
    ):
        assert problems(doc(with_(**{field: good}))) == []


def test_model_is_required_when_enabled_and_is_a_plain_name():
    section = {k: v for k, v in MINIMAL.items() if k != "model"}
    found = only(doc(section))
    assert found.location == "boundedAgents.model"
    assert "required while enabled" in found.message
    assert "model" in found.hint
    assert problems(doc({**section, "enabled": False})) == []
    for good in ("claude-sonnet-4-5", "gpt-4o-mini", "ft:gpt-4o-mini:org::id", "m" * 128):
        assert problems(doc(with_(model=good))) == [], good
    for bad in ("", "gpt 4o", "a/b", "https://x.example/m", "-m", "m" * 129, "m\n", 7):
        found = only(doc(with_(model=bad)))
        assert found.location == "boundedAgents.model", bad
        assert "plain model name" in found.hint


def test_private_repos_are_objects_unique_case_insensitively():
    found = only(doc(with_(privateRepos=["octo/alpha"])))
    assert found.location == "boundedAgents.privateRepos[0]"
    assert "no bare-string form" in found.hint
    repos = [
        {"repo": "Octo/Alpha", "sensitivity": "internal"},
        {"repo": "octo/beta", "sensitivity": "public"},
        {"repo": "octo/alpha", "sensitivity": "sealed"},
    ]
    found = only(doc(with_(privateRepos=repos)))
    assert found.location == "boundedAgents.privateRepos[2]"
    assert "duplicate of privateRepos[0]" in found.message
    found = only(doc(with_(privateRepos=[{"repo": "a/b"}])))
    assert "'sensitivity' is a required property" in found.message
    assert '"public"' in found.hint
    found = only(doc(with_(privateRepos=[{"repo": "a/b", "sensitivity": "secret"}])))
    assert found.location == "boundedAgents.privateRepos[0].sensitivity"
    found = only(doc(with_(privateRepos=[{"repo": "a/../b", "sensitivity": "internal"}])))
    assert found.location == "boundedAgents.privateRepos[0].repo"
    assert "not a valid owner/repo slug" in found.message
    found = only(doc(with_(privateRepos=[])))
    assert found.location == "boundedAgents.privateRepos"
    assert "no repository" in found.message
    many = [{"repo": f"o/r{i}", "sensitivity": "internal"} for i in range(65)]
    assert only(doc(with_(privateRepos=many))).location == "boundedAgents.privateRepos"
    extra = [{"repo": "a/b", "sensitivity": "internal", "budget": 99}]
    assert only(doc(with_(privateRepos=extra))).location == "boundedAgents.privateRepos[0].budget"


@pytest.mark.parametrize("field", ["memoryLimit", "tmpfsLimit"])
def test_byte_sizes_use_the_shared_parser(field):
    for bad in ("5m", "65g", "1t", "512mb", "-1m", "1.5g", "", "1g\n", 512):
        found = only(doc(with_(**{"memoryLimit": "64g", field: bad})))
        assert found.location == f"boundedAgents.{field}", bad
        assert found.hint.startswith("use a Docker-style")
    assert problems(doc(with_(memoryLimit="6m", tmpfsLimit="6m"))) == []


def test_tmpfs_is_at_most_the_memory_limit():
    found = only(doc(with_(memoryLimit="256m", tmpfsLimit="257m")))
    assert found.location == "boundedAgents.tmpfsLimit"
    assert "larger than memoryLimit" in found.message
    assert problems(doc(with_(memoryLimit="256m", tmpfsLimit="256m"))) == []
    # The default memory limit (512m) bounds an explicit tmpfs too.
    assert only(doc(with_(tmpfsLimit="1g"))).location == "boundedAgents.tmpfsLimit"


CPUS_OK = {"1": 10**9, "0.5": 5 * 10**8, "0.01": 10**7, "64": 64 * 10**9, "1.123456789": 1123456789}
CPUS_BAD = [
    "0",
    "0.001",
    "0.009999999",
    "64.000000001",
    "65",
    "100",
    "1e3",
    "1E0",
    "-1",
    "+1",
    ".5",
    "1.",
    "1.0000000001",
    " 1",
    "1 ",
    "1\n",
    "\u0661",
    "0x10",
    "inf",
    "nan",
    "",
    "1,5",
    1,
    1.5,
    True,
]


@pytest.mark.parametrize("text", list(CPUS_OK))
def test_cpu_limit_becomes_exact_nano_cpus(text):
    assert problems(doc(with_(cpuLimit=text))) == []
    assert normalize_agents(doc(with_(cpuLimit=text))).nano_cpus == CPUS_OK[text]
    assert policy.parse_cpu_limit(text) == CPUS_OK[text]


@pytest.mark.parametrize("value", CPUS_BAD)
def test_cpu_limit_refuses_sign_exponent_and_garbage(value):
    found = only(doc(with_(cpuLimit=value)))
    assert found.location == "boundedAgents.cpuLimit"
    assert "--cpus" in found.hint
    with pytest.raises(ValueError, match="cpuLimit"):
        policy.parse_cpu_limit(value)


def test_unknown_keys_are_refused_everywhere_we_read():
    found = only(doc(with_(image="evil:latest")))
    assert (found.location, found.message) == ("boundedAgents.image", "unknown property")
    assert "allowed: cpuLimit, enabled, engine" in found.hint
    found = only(doc(apiProxy={"targets": {"vertex": {"host": "x.example"}}}))
    assert found.location == "apiProxy.targets.vertex"
    found = only(doc(apiProxy={"targets": {"anthropic": {"host": "a.example", "authHeader": "x"}}}))
    assert found.location == "apiProxy.targets.anthropic.authHeader"
    assert found.hint == "remove it; allowed: basePath, host"


def test_every_problem_is_reported_not_just_the_first():
    found = problems(doc(with_(timeout=0, engine="x", bogus=1, maxTaskBytes=65537)))
    assert len(found) == 4
    assert all(p.hint and "spec 15.2" not in p.hint for p in found)


TARGETS_OK = {
    "api.anthropic.com": ("https", "api.anthropic.com", 443),
    "https://gw.example:8443": ("https", "gw.example", 8443),
    "http://127.0.0.1:8080": ("http", "127.0.0.1", 8080),
    "http://[::1]:8080": ("http", "[::1]", 8080),
    "10.0.0.1": ("https", "10.0.0.1", 443),
    "h:1": ("https", "h", 1),
    "h:65535": ("https", "h", 65535),
}
TARGETS_BAD = [
    "API.anthropic.com",
    "ftp://x.example",
    "https://x.example/v1",
    "x.example/v1",
    "user@x.example",
    "https://user:pw@x.example",
    "x.example:0",
    "x.example:65536",
    "x.example:",
    "x.example?q=1",
    "x.example#f",
    "-x.example",
    "x.example.",
    " x.example",
    "x.example\n",
    "",
    "https://",
    "x_y.example",
]


@pytest.mark.parametrize("host", list(TARGETS_OK))
def test_api_target_hosts_accepted(host):
    document = doc(apiProxy={"targets": {"anthropic": {"host": host, "basePath": "/p/q"}}})
    assert problems(document) == []
    scheme, name, port = TARGETS_OK[host]
    assert normalize_agents(document).target == ApiTarget(scheme, name, port, "/p/q")
    assert normalize_agents(document).target == parse_api_target(host, "/p/q")


@pytest.mark.parametrize("host", TARGETS_BAD)
def test_api_target_hosts_refused(host):
    found = only(doc(apiProxy={"targets": {"anthropic": {"host": host}}}))
    assert found.location == "apiProxy.targets.anthropic.host"
    assert "HOST[:PORT]" in found.hint
    with pytest.raises(ValueError, match=r"^host "):
        parse_api_target(host)


@pytest.mark.parametrize(
    "base", ["/a/..", "/a/./b", "/", "/a/", "a", "/a b", "/%2e", "//a", "/a?x"]
)
def test_api_target_base_paths_refused(base):
    found = only(doc(apiProxy={"targets": {"anthropic": {"basePath": base}}}))
    assert found.location == "apiProxy.targets.anthropic.basePath"


def test_the_engines_provider_is_the_target_and_others_are_ignored():
    targets = {
        "anthropic": {"host": "claude-gw.example", "basePath": "/anthropic"},
        "openai": {"host": "openai-gw.example"},
    }
    config = normalize_agents(doc(apiProxy={"targets": targets}))
    assert config.target == ApiTarget("https", "claude-gw.example", 443, "/anthropic")
    assert config.target.url == "https://claude-gw.example:443/anthropic"
    only_base = normalize_agents(doc(apiProxy={"targets": {"anthropic": {"basePath": "/b"}}}))
    assert only_base.target == ApiTarget("https", "api.anthropic.com", 443, "/b")
    copilot = normalize_agents(doc(with_(engine="copilot"), apiProxy={"targets": targets}))
    assert copilot.target == ApiTarget("https", "api.githubcopilot.com", 443, "")


def test_enable_dind_is_refused_while_agents_are_enabled():
    found = only(doc(container={"enableDind": True}))
    assert found.location == "container.enableDind"
    assert "bypass every" in found.message
    assert "false" in found.hint
    assert problems(doc(container={"enableDind": False})) == []
    assert problems(doc(with_(enabled=False), container={"enableDind": True})) == []
    found = only(doc(container={"enableDind": "no"}))
    assert found.location == "container.enableDind"


def test_load_config_carries_the_section_and_refuses_it_located(tmp_path):
    data = json.dumps({**SPEC_EXAMPLE, "boundedQueries": {"enabled": False}}).encode()
    loaded = load_config("-", io.BytesIO(data))
    assert loaded.agents == normalize_agents(SPEC_EXAMPLE)
    assert loaded.config.enabled is False
    bad = copy.deepcopy(SPEC_EXAMPLE)
    bad["boundedAgents"]["timeout"] = 600
    bad["boundedQueries"] = {"timeout": 0}
    with pytest.raises(ConfigError) as caught:
        load_config("-", io.BytesIO(json.dumps(bad).encode()))
    assert {p.location for p in caught.value.problems} == {
        "boundedAgents.timeout",
        "boundedQueries.timeout",
    }


def test_validate_command_exits_2_with_located_events(tmp_path, capsys):
    path = tmp_path / "agents.yaml"
    path.write_text(
        "boundedAgents:\n  enabled: true\n  privateRepos: ['a/b']\n  engine: claude\n"
        "  model: m\n  cpuLimit: '1e9'\n"
    )
    assert main(["validate", "--config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    events = [json.loads(line) for line in err.splitlines()]
    errors = [e for e in events if e["event"] == "config_error"]
    assert {e["location"] for e in errors} == {
        "boundedAgents.privateRepos[0]",
        "boundedAgents.cpuLimit",
    }
    assert all(e["hint"] for e in errors)


# ------------------------------------------------- the schema and the loader agree

#: Documents both must accept.
AGREE_OK: list[dict[str, Any]] = [
    SPEC_EXAMPLE,
    doc(),
    {"boundedAgents": {}},
    {"boundedAgents": {"enabled": False, "runtime": "sbx"}},
    doc(with_(runtime="gvisor", cpuLimit="0.25", tmpfsLimit="128m", memoryLimit="1g")),
    doc(apiProxy={"targets": {"anthropic": {"host": "http://127.0.0.1:9", "basePath": ""}}}),
    doc(apiProxy={"enabled": True, "maxTurns": 3}, container={"enableDind": False, "tty": 1}),
    {"network": {"allowDomains": ["x"]}},
]
#: Documents both must refuse (what a JSON Schema can state).
AGREE_BAD: list[dict[str, Any]] = [
    doc(with_(timeout=541)),
    doc(with_(timeout="30")),
    doc(with_(enabled=1)),
    doc(with_(engine="aider")),
    doc(with_(privateRepos=["a/b"])),
    doc(with_(privateRepos=[])),
    doc({"enabled": True, "privateRepos": MINIMAL["privateRepos"]}),
    doc(with_(model="a b")),
    doc(with_(cpuLimit="1e3")),
    doc(with_(cpuLimit=1)),
    doc(with_(memoryLimit="512mb")),
    doc(with_(maxOutputBytes=8193)),
    doc(with_(maxModelTokens=0)),
    doc(with_(x=1)),
    doc(apiProxy={"targets": {"anthropic": {"host": "https://a.example/v1"}}}),
    doc(apiProxy={"targets": {"anthropic": {"host": "a.example:65536"}}}),
    doc(apiProxy={"targets": {"anthropic": {"basePath": "/a/"}}}),
    doc(apiProxy={"targets": {"azure": {}}}),
    doc(container={"enableDind": "false"}),
    {"boundedAgents": []},
    {"boundedAgents": None},
]
#: Documents only the loader refuses: what no JSON Schema keyword states, each
#: with its reason. The schema's description names these.
LOADER_ONLY: list[tuple[dict[str, Any], str]] = [
    (doc(with_(memoryLimit="5m")), "the memory range (6m-64g)"),
    (doc(with_(tmpfsLimit="65g")), "the tmpfs range"),
    (doc(with_(memoryLimit="64m", tmpfsLimit="65m")), "tmpfsLimit at most memoryLimit"),
    (doc(with_(cpuLimit="0")), "the CPU range (0.01-64)"),
    (doc(with_(cpuLimit="64.5")), "the CPU range (0.01-64)"),
    (
        doc(
            with_(
                privateRepos=[
                    {"repo": "a/b", "sensitivity": "internal"},
                    {"repo": "A/B", "sensitivity": "internal"},
                ]
            )
        ),
        "unique case-insensitively",
    ),
    (doc(container={"enableDind": True}), "enableDind refused while enabled"),
    (doc(with_(timeout=30.0)), "JSON Schema counts 30.0 as an integer; the loader does not"),
]


def _schema() -> Draft202012Validator:
    schema = json.loads(AGENTS_SCHEMA_PATH.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


@pytest.mark.parametrize("document", AGREE_OK)
def test_schema_and_loader_both_accept(document):
    assert list(_schema().iter_errors(document)) == []
    assert problems(document) == []


@pytest.mark.parametrize("document", AGREE_BAD)
def test_schema_and_loader_both_refuse(document):
    assert list(_schema().iter_errors(document)) != []
    assert problems(document) != []


@pytest.mark.parametrize(("document", "reason"), LOADER_ONLY)
def test_only_the_loader_refuses_what_no_schema_keyword_states(document, reason):
    assert list(_schema().iter_errors(document)) == [], reason
    assert problems(document) != [], reason


@pytest.mark.parametrize("value", [*CPUS_OK, *(v for v in CPUS_BAD if isinstance(v, str))])
def test_cpu_shape_is_the_schemas(value):
    """The schema checks the shape; ``parse_cpu_limit`` the shape and the range."""
    shape = _schema().schema["$defs"]["section"]["properties"]["cpuLimit"]
    shape_ok = Draft202012Validator(shape).is_valid(value)
    try:
        policy.parse_cpu_limit(value)
    except ValueError:
        parsed = False
    else:
        parsed = True
    assert parsed is (value in CPUS_OK)
    if parsed:
        assert shape_ok
    if not shape_ok:
        assert not parsed


@pytest.mark.parametrize("host", [*TARGETS_OK, *TARGETS_BAD])
def test_target_host_rule_is_the_proxys(host):
    """The schema's host pattern accepts exactly what the API proxy's URL parser accepts."""
    shape = _schema().schema["$defs"]["apiTarget"]["properties"]["host"]
    try:
        parse_api_target(host)
    except ValueError:
        parsed = False
    else:
        parsed = True
    assert Draft202012Validator(shape).is_valid(host) is parsed is (host in TARGETS_OK)


# ------------------------------------------------- one source per fact (the policy)


def test_schema_limits_and_names_are_the_policy():
    schema = json.loads(AGENTS_SCHEMA_PATH.read_text(encoding="utf-8"))
    props = schema["$defs"]["section"]["properties"]

    def bounds(name: str) -> tuple[int, int]:
        assert props[name]["type"] == "integer"
        return props[name]["minimum"], props[name]["maximum"]

    assert bounds("timeout") == (policy.MIN_TIMEOUT_S, policy.MAX_AGENT_TIMEOUT_S)
    assert bounds("pidsLimit") == (policy.MIN_AGENT_PIDS_LIMIT, policy.MAX_AGENT_PIDS_LIMIT)
    assert bounds("maxOutputBytes") == (
        policy.MIN_AGENT_OUTPUT_BYTES,
        policy.ENCLAVE_MAX_OUTPUT_BYTES,
    )
    assert bounds("maxTaskBytes") == (policy.MIN_AGENT_TASK_BYTES, policy.ENCLAVE_MAX_TASK_BYTES)
    assert bounds("maxInvocations") == (policy.MIN_INVOCATIONS, policy.MAX_INVOCATIONS)
    assert bounds("maxModelRequests") == (policy.MIN_MODEL_REQUESTS, policy.MAX_MODEL_REQUESTS)
    assert bounds("maxModelTokens") == (policy.MIN_MODEL_TOKENS, policy.MAX_MODEL_TOKENS)
    assert tuple(props["runtime"]["enum"]) == policy.RUNTIMES
    assert tuple(props["engine"]["enum"]) == policy.AGENT_ENGINES
    assert tuple(props["profile"]["enum"]) == policy.AGENT_PROFILES
    anchored = "^{}$(?![\\s\\S])".format
    assert props["model"]["pattern"] == anchored(policy.AGENT_MODEL_PATTERN)
    assert props["cpuLimit"]["pattern"] == anchored(policy.CPU_LIMIT_PATTERN)
    assert props["memoryLimit"]["pattern"] == anchored(policy.MEMORY_LIMIT_PATTERN)
    assert props["tmpfsLimit"]["pattern"] == anchored(policy.MEMORY_LIMIT_PATTERN)
    assert props["privateRepos"]["maxItems"] == policy.MAX_PRIVATE_REPOS
    targets = schema["properties"]["apiProxy"]["properties"]["targets"]["properties"]
    assert set(targets) == set(policy.AGENT_PROVIDER_HOSTS)
    assert set(policy.AGENT_ENGINE_PROVIDERS) == set(policy.AGENT_ENGINES)
    assert set(policy.AGENT_ENGINE_PROVIDERS.values()) <= set(policy.AGENT_PROVIDER_HOSTS)
    # The repository rule is the boundedQueries schema's, verbatim.
    queries = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))["$defs"]
    assert schema["$defs"]["slug"] == queries["slug"]
    assert schema["$defs"]["repoEntry"] == queries["repoEntry"]


def test_defaults_satisfy_the_schema_and_the_loader():
    config = BoundedAgentsConfig()
    assert policy.MIN_TIMEOUT_S <= config.timeout <= policy.MAX_AGENT_TIMEOUT_S
    assert config.tmpfs_bytes <= config.memory_bytes
    assert policy.MIN_AGENT_NANO_CPUS <= config.nano_cpus <= policy.MAX_AGENT_NANO_CPUS
    assert policy.MIN_AGENT_PIDS_LIMIT <= config.pids_limit <= policy.MAX_AGENT_PIDS_LIMIT
    assert config.tmpfs_bytes == policy.ENCLAVE_TMPFS_BYTES


def test_the_enclave_recipe_pins_the_policys_engine_version():
    """Shell cannot import the policy: build.sh's pin is checked here."""
    script = (REPO_ROOT / "sandbox" / "enclave_image" / "build.sh").read_text(encoding="utf-8")
    for engine, version in policy.ENCLAVE_ENGINE_VERSIONS.items():
        assert re.search(
            rf"\n  {engine}\)\n(?:    .*\n)*?    version={re.escape(version)}\n", script
        )
    for key in (
        policy.LABEL_IMAGE_RECIPE,
        policy.LABEL_IMAGE_ENGINE,
        policy.LABEL_IMAGE_ENGINE_VERSION,
    ):
        assert f'--change "LABEL {key}=' in script
    assert set(policy.ENCLAVE_ENGINE_VERSIONS) == set(policy.ENCLAVE_ENGINES)


# ------------------------------------------ nothing but our own error (STYLE 10)

_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
_KEYS = st.sampled_from(
    [
        *json.loads(AGENTS_SCHEMA_PATH.read_text(encoding="utf-8"))["$defs"]["section"][
            "properties"
        ],
        "repo",
        "sensitivity",
        "host",
        "basePath",
        "x",
    ]
)
_VALUES = st.recursive(
    _SCALARS
    | st.sampled_from(["claude", "sbx", "1", "0.5", "64m", "a/b", "internal", "http://h:1"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    section=st.dictionaries(_KEYS, _VALUES, max_size=8) | _VALUES,
    targets=st.dictionaries(st.sampled_from(["anthropic", "copilot", "x"]), _VALUES, max_size=2),
    dind=_VALUES,
)
def test_any_document_gives_problems_or_a_config_never_an_exception(section, targets, dind):
    document = {
        "boundedAgents": section,
        "apiProxy": {"targets": targets},
        "container": {"enableDind": dind},
    }
    found = problems(document)
    assert all(p.location and p.message and p.hint for p in found)
    if not found:
        config = normalize_agents(document)
        assert config.target is not None
        assert config.tmpfs_bytes <= config.memory_bytes
        assert config.nano_cpus >= policy.MIN_AGENT_NANO_CPUS


def test_validate_prints_the_bounded_agents_summary_without_secrets(tmp_path, capsys):
    path = tmp_path / "agents.json"
    path.write_text(
        json.dumps(
            {
                "boundedAgents": {
                    "enabled": True,
                    "privateRepos": [{"repo": "o/r", "sensitivity": "internal"}],
                    "engine": "claude",
                    "model": "claude-haiku-4-5",
                },
                "apiProxy": {"targets": {"anthropic": {"host": "gw.example:8443"}}},
            }
        )
    )
    assert main(["validate", "--config", str(path)]) == 0
    summary = json.loads(capsys.readouterr().out)["boundedAgents"]
    assert summary["privateRepos"] == [{"repo": "o/r", "sensitivity": "internal", "budgetBits": 64}]
    assert (summary["engine"], summary["model"]) == ("claude", "claude-haiku-4-5")
    assert summary["target"] == "https://gw.example:8443"
    assert (summary["maxModelRequests"], summary["maxModelTokens"]) == (8, 1024)
