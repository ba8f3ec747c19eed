#!/usr/bin/env bash
# Traces the system calls of a bounded-agent engine (Claude Code, Copilot)
# driven by the enclave adapter on the enclave image's root file system,
# against the scripted fake provider of its wire protocol
# (seccomp/recipe/README.md, "The enclave profile").
#
#   seccomp/recipe/trace_enclave.sh OUT_FILE [IMAGE]
#       IMAGE: default bounded-query-enclave-claude:latest; the engine is
#       the image's bounded-query.engine label
#
# Needs root, strace and a Docker engine (only to export the image's files).
# Like trace.sh: the image's root file system is exported, a throwaway seed,
# the task, the schema and the result file are mounted where the enclave has
# them, /agent and /tmp are tmpfs, and strace follows the adapter (uid 65534)
# and every child. The fake provider (harness/example/anthropic_provider.py)
# listens on the host's loopback; its scripted tool call runs a shell
# pipeline, git and python3 the way an engine's Bash tool does. OUT_FILE gets
# the sorted, unique syscall names made after the adapter's execve.
set -euo pipefail
out=$1
image=${2:-bounded-query-enclave-claude:latest}
here=$(cd "$(dirname "$0")" && pwd)
engine=$(docker image inspect -f '{{ index .Config.Labels "bounded-query.engine" }}' "$image")
case "$engine" in
  claude)
    fake="$here/../../harness/example/anthropic_provider.py"
    endpoint=(ANTHROPIC_BASE_URL=http://127.0.0.1:18765 ANTHROPIC_API_KEY=0123456789abcdef0123456789abcdef)
    ;;
  copilot)
    fake="$here/../../tests/fakes/openai_provider.py"
    endpoint=(COPILOT_PROVIDER_BASE_URL=http://127.0.0.1:18765/v1 COPILOT_PROVIDER_API_KEY=0123456789abcdef0123456789abcdef)
    ;;
  *) echo "trace_enclave.sh: $image has no known engine label ('$engine')" >&2; exit 2 ;;
esac
command -v strace >/dev/null || { echo "trace_enclave.sh: install strace" >&2; exit 1; }
work=$(mktemp -d)
fake_pid=
cleanup() {
  [ -n "$fake_pid" ] && kill "$fake_pid" 2>/dev/null || true
  umount -R "$work/rootfs" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir "$work/rootfs" "$work/seed"
cid=$(docker create "$image")
docker export "$cid" | tar -C "$work/rootfs" -x
docker rm -f "$cid" >/dev/null
marker=trace-marker-$RANDOM$RANDOM
echo "$marker" > "$work/seed/marker.txt"
printf 'print("hello")\n' > "$work/seed/hello.py"
git -C "$work/seed" -c init.templateDir= init -q -b main
git -C "$work/seed" -c user.name=t -c user.email=t@example.invalid add -A
git -C "$work/seed" -c user.name=t -c user.email=t@example.invalid commit -q -m seed
chmod -R a+rX "$work/seed"
printf 'What does marker.txt hold?' > "$work/task.txt"
printf '{"type":"boolean"}' > "$work/schema.json"
: > "$work/result.json"
chown 65534:65534 "$work/result.json"
cmd="cat marker.txt | tr a-z A-Z; ls -la; git log --oneline | head -1; python3 hello.py; sleep 0.1 & wait"
python3 -c 'import json, sys; json.dump({"command": sys.argv[1], "marker": sys.argv[2].upper(), "answer": "true", "wrong_answer": "false"}, open(sys.argv[3], "w"))' \
  "$cmd" "$marker" "$work/script.json"
python3 "$fake" "$work/script.json" "$work/record.jsonl" 18765 > "$work/fake.out" &
fake_pid=$!
for _ in $(seq 1 50); do grep -q ready "$work/fake.out" 2>/dev/null && break; sleep 0.1; done
unshare -m --propagation private bash -euc '
  r=$1/rootfs
  mount --bind "$1/seed" "$r/awf/seed" && mount -o remount,bind,ro "$r/awf/seed"
  mount --bind "$1/task.txt" "$r/awf/task.txt"
  mount --bind "$1/schema.json" "$r/awf/schema.json"
  mount -t tmpfs -o size=64m,uid=65534,gid=65534,mode=0755 tmpfs "$r/agent"
  touch "$r/agent/result.json" && mount --bind "$1/result.json" "$r/agent/result.json"
  mount -t tmpfs -o size=64m,mode=1777 tmpfs "$r/tmp"
  mount -t proc proc "$r/proc"
  mount --rbind /dev "$r/dev"
  cd "$r/awf/seed"
  env -i PATH=/opt/engine/bin:/usr/bin:/bin LANG=C.UTF-8 HOME=/agent/home TMPDIR=/tmp \
    "${@:4}" \
    strace -f -qq -o "$1/trace" /usr/sbin/chroot --userspec=65534:65534 "$r" \
    /usr/bin/python3 -I -S /awf/adapter.py "$2" "$3"
' trace "$work" "$engine" "$engine-trace-model" "${endpoint[@]}"
[ "$(cat "$work/result.json")" = true ] || { echo "trace_enclave.sh: the engine did not answer (result: $(cat "$work/result.json"))" >&2; exit 1; }
python3 - "$work/trace" "$out" <<'PY'
import re, sys
names, started = set(), False
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    m = re.match(r"\d+\s+(?:<\.\.\. )?([a-z0-9_]+)(?:\(| resumed>)", line)
    if not m:
        continue
    if not started:
        started = bool(re.match(r'\d+\s+execve\("/usr/bin/python3"', line))
        if not started:
            continue
    names.add(m.group(1))
open(sys.argv[2], "w").write("".join(n + "\n" for n in sorted(names)))
print(f"trace_enclave.sh: {len(names)} distinct syscalls", file=sys.stderr)
PY
cp "$work/trace" /tmp/enclave-strace.txt 2>/dev/null || true
