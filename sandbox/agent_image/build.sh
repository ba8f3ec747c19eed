#!/usr/bin/env bash
# Builds the default agent image (issue 8; spec 14.8) without any registry:
# Debian packages via mmdebstrap, then `docker import` -- the same pattern as
# the query image (sandbox/image/build.sh).
#
#   sandbox/agent_image/build.sh [IMAGE]   default: bounded-query-agent:latest
#
# Contents: Debian's "essential" set plus python3, git, curl and the CA
# certificates -- what an agent needs to run scripts, read its workspace and
# reach its model. The harness starts it with a non-root user, every
# capability dropped and no-new-privileges, and mounts the run's wrapper
# directory at its host path and puts it first on PATH, so nothing of the
# broker is baked in. No file keeps a setuid or setgid bit (no-new-privileges
# would neutralize them anyway).
#
# Idempotent: the image carries the label bounded-query.recipe=<sha256 of this
# script>; an image with the same label is not rebuilt.
set -euo pipefail
# BQ_DEBIAN_MIRROR (optional): a Debian mirror URL for hosts whose own apt
# sources are not Debian's (for example an Ubuntu CI runner); by default
# mmdebstrap uses the host's apt sources.
here=$(cd "$(dirname "$0")" && pwd)
image=${1:-bounded-query-agent:latest}
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=docker
recipe=$(sha256sum <"$here/build.sh" | cut -d' ' -f1)
have=$("$DOCKER" image inspect -f '{{ index .Config.Labels "bounded-query.recipe" }}' "$image" 2>/dev/null || true)
if [ "$have" = "$recipe" ]; then
  echo "build-images: $image is up to date (recipe ${recipe:0:12})" >&2
  exit 0
fi
command -v mmdebstrap >/dev/null || { echo "build-images: mmdebstrap missing; run .ci/provision-engine" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "build-images: building $image (recipe ${recipe:0:12})" >&2
SOURCE_DATE_EPOCH=1700000000 mmdebstrap --quiet --variant=essential \
  --include=python3,git,curl,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='find "$1" -xdev -type f -perm /6000 -exec chmod ug-s {} +' \
  bookworm "$work/rootfs.tar" ${BQ_DEBIAN_MIRROR:+"$BQ_DEBIAN_MIRROR"}
previous=$("$DOCKER" image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
"$DOCKER" import \
  --change 'USER 65533:65533' \
  --change 'WORKDIR /tmp' \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 HOME=/tmp' \
  --change "LABEL bounded-query.recipe=$recipe" \
  "$work/rootfs.tar" "$image" >/dev/null
# Check the result the way the harness runs it (non-root, no capabilities).
check() { "$DOCKER" run --rm --network none --user 20000:20000 --cap-drop ALL \
  --security-opt no-new-privileges:true "$image" "$@"; }
check python3 -c 'import json, subprocess, ssl; print("python ok")' >&2
check git --version >&2
check curl --version >/dev/null
check python3 -c '
import os, sys
bad = []
for top in ("/usr", "/bin", "/sbin"):
    for d, _, fs in os.walk(top):
        bad += [os.path.join(d, f) for f in fs if not os.path.islink(os.path.join(d, f))
                and os.lstat(os.path.join(d, f)).st_mode & 0o6000]
sys.exit("setuid/setgid files in image: " + " ".join(bad) if bad else 0)' >&2
current=$("$DOCKER" image inspect -f '{{.Id}}' "$image")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
  "$DOCKER" rmi "$previous" >/dev/null 2>&1 || true
fi
echo "build-images: $image built and checked" >&2
