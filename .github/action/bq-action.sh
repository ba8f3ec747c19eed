#!/usr/bin/env bash
# The steps of the composite action in action.yml (issue 14 item 4).
#
#   bq-action.sh install   install the project, the engine prerequisites
#                          (Debian/Ubuntu packages, runsc registered with
#                          dockerd) and the images, on a GitHub-hosted runner
#   bq-action.sh run       run `bounded-query-harness run` from the INPUT_*
#                          variables set by action.yml, as root (through sudo
#                          when the runner's user is not root, keeping the
#                          environment by name); writes exit-code to
#                          $GITHUB_OUTPUT and exits with the harness's status
#
# Inputs (run): INPUT_CONFIG, INPUT_AGENT_COMMAND (required); INPUT_SEED_SOURCES
# and INPUT_EXTRA_ARGS (one item per line); INPUT_RUNTIME (docker|gvisor or
# empty); INPUT_WORKSPACE. BQ_HARNESS overrides the harness command (tests).
# Input errors are the caller's fault: exit 2 with a message naming the input.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)

fail_input() { echo "bounded-query action: input $1: $2" >&2; exit 2; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

cmd_install() {
  local need=()
  command -v docker >/dev/null || need+=(docker.io)
  for pkg in runsc mmdebstrap debian-archive-keyring docker-compose; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  fi
  # Register runsc next to whatever the runner's daemon.json already holds;
  # the snippet exits 10 when it changed the file, so dockerd is restarted.
  local changed=0
  as_root python3 - <<'PY' || changed=$?
import json, pathlib
path = pathlib.Path("/etc/docker/daemon.json")
doc = json.loads(path.read_text()) if path.exists() and path.read_text().strip() else {}
want = {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--oci-seccomp", "--file-access-mounts=exclusive"]}
if doc.get("runtimes", {}).get("runsc") != want:
    doc.setdefault("runtimes", {})["runsc"] = want
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    raise SystemExit(10)
PY
  case "$changed" in
    0) ;;
    10) as_root systemctl restart docker ;;
    *) echo "bounded-query action: cannot register runsc in /etc/docker/daemon.json" >&2; exit 1 ;;
  esac
  python3 -m pip install -q "$here"
  # Ubuntu's apt sources hold no bookworm: build the images from Debian's mirror.
  local mirror=""
  grep -q '^ID=debian$' /etc/os-release 2>/dev/null || mirror=http://deb.debian.org/debian
  as_root env BQ_DEBIAN_MIRROR="${BQ_DEBIAN_MIRROR:-$mirror}" "$here/.ci/build-images"
}

# The names of the environment variables the root harness keeps (comma-separated):
# every exported one but those that change how a root process loads code or that
# name the invoking user (sudo sets its own).
kept_variables() {
  local names=() name
  while IFS= read -r name; do
    case "$name" in
      LD_*|BASH_ENV|ENV|BASH_FUNC_*|SHELLOPTS|BASHOPTS|PS4|IFS|PYTHONSTARTUP|PYTHONHOME|PYTHONINSPECT) ;;
      HOME|USER|LOGNAME|MAIL|SHELL|SUDO_*|PATH) ;;
      *) names+=("$name") ;;
    esac
  done < <(compgen -e)
  local IFS=,
  echo "${names[*]}"
}

cmd_run() {
  [ -n "${INPUT_CONFIG:-}" ] || fail_input config "is required (the AWF configuration file)"
  [ -f "$INPUT_CONFIG" ] || fail_input config "no such file: $INPUT_CONFIG"
  [ -n "${INPUT_AGENT_COMMAND:-}" ] || fail_input agent-command "is required"
  local config=$INPUT_CONFIG
  case "${INPUT_RUNTIME:-}" in
    "") ;;
    docker|gvisor)
      bq_tmp=$(mktemp -d)
      trap 'rm -rf "$bq_tmp"' EXIT
      python3 - "$INPUT_CONFIG" "$INPUT_RUNTIME" "$bq_tmp/awf-config.json" <<'PY' || fail_input runtime "cannot apply it to $INPUT_CONFIG (not a mapping with boundedQueries?)"
import json, sys, yaml
source, runtime, target = sys.argv[1:]
with open(source, encoding="utf-8") as handle:
    doc = yaml.safe_load(handle)
if not isinstance(doc, dict) or not isinstance(doc.get("boundedQueries"), dict):
    sys.exit(1)
doc["boundedQueries"]["runtime"] = runtime
with open(target, "w", encoding="utf-8") as handle:
    json.dump(doc, handle)
PY
      config=$bq_tmp/awf-config.json ;;
    *) fail_input runtime "must be docker or gvisor, not '$INPUT_RUNTIME'" ;;
  esac
  local args=(run --config "$config" --workspace "${INPUT_WORKSPACE:-$PWD}")
  local line
  while IFS= read -r line; do
    [ -z "$line" ] || args+=(--seed-source "$line")
  done <<< "${INPUT_SEED_SOURCES:-}"
  while IFS= read -r line; do
    [ -z "$line" ] || args+=("$line")
  done <<< "${INPUT_EXTRA_ARGS:-}"
  local harness=(${BQ_HARNESS:-bounded-query-harness})
  if [ "$(id -u)" != 0 ]; then
    # The broker needs root for per-invocation storage (README "Cross-invocation
    # channels"): a runner user's harness would run with weaker guarantees.
    # sudo keeps the variables by name only (no value, so no token, on argv):
    # the staging tokens, GITHUB_*, and the agent's own.
    harness=(sudo --non-interactive --preserve-env="$(kept_variables)" -- env "PATH=$PATH" "${harness[@]}")
  fi
  local status=0
  "${harness[@]}" "${args[@]}" -- bash -c "$INPUT_AGENT_COMMAND" || status=$?
  if [ -n "${GITHUB_OUTPUT:-}" ]; then echo "exit-code=$status" >> "$GITHUB_OUTPUT"; fi
  return "$status"
}

case "${1:-}" in
  install) cmd_install ;;
  run) cmd_run ;;
  *) echo "usage: bq-action.sh install|run" >&2; exit 2 ;;
esac
