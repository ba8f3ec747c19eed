#!/usr/bin/env bash
# Traces the system calls of python3 and git running the query entrypoint on
# the query image's root file system (seccomp/recipe/README.md).
#
#   seccomp/recipe/trace.sh SEED_DIR OUT_FILE [IMAGE]
#
# Needs root, strace and a Docker engine (only to export the image's files).
# The trace runs on the host kernel in a private mount namespace: the image
# root file system is exported to a temporary directory, the seed, the
# workload script, /query (tmpfs) and the result file are mounted where the
# container would have them, and strace follows the entrypoint (as uid 65534)
# and every child. OUT_FILE receives the sorted, unique syscall names made
# after the entrypoint's execve (what the container's profile must allow).
set -euo pipefail
seed=$(realpath "$1")
out=$2
image=${3:-bounded-query-python:latest}
here=$(cd "$(dirname "$0")" && pwd)
command -v strace >/dev/null || { echo "trace.sh: install strace" >&2; exit 1; }
work=$(mktemp -d)
trap 'umount -R "$work/rootfs" 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir "$work/rootfs"
cid=$(docker create "$image")
docker export "$cid" | tar -C "$work/rootfs" -x
docker rm -f "$cid" >/dev/null
cp "$here/workload.py" "$work/workload.py"
: > "$work/out"
chown 65534:65534 "$work/out"
unshare -m --propagation private bash -euc '
  r=$1/rootfs
  mount --bind "$2" "$r/awf/seed" && mount -o remount,bind,ro "$r/awf/seed"
  mount --bind "$1/workload.py" "$r/awf/query-script.py"
  mount -t tmpfs -o size=512m,uid=65534,gid=65534,mode=0755 tmpfs "$r/query"
  touch "$r/query/out" && mount --bind "$1/out" "$r/query/out"
  mount -t tmpfs -o size=64m,mode=1777 tmpfs "$r/tmp"
  mount -t proc proc "$r/proc"
  mount --rbind /dev "$r/dev"
  cd "$r/query"
  env -i PATH=/usr/bin:/bin LANG=C.UTF-8 HOME=/tmp PYTHONDONTWRITEBYTECODE=1 GIT_CONFIG_NOSYSTEM=1 \
    strace -f -qq -o "$1/trace" /usr/sbin/chroot --userspec=65534:65534 "$r" \
    /usr/bin/python3 -I -S /awf/entrypoint.py
' trace "$work" "$seed"
[ "$(cat "$work/out")" = true ] || { echo "trace.sh: workload did not finish" >&2; exit 1; }
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
print(f"trace.sh: {len(names)} distinct syscalls", file=sys.stderr)
PY
