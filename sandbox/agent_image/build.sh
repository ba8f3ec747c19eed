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
# shellcheck source=../image/recipe.sh
. "$here/../image/recipe.sh"
recipe_begin "$image" "$here/build.sh"
SOURCE_DATE_EPOCH=1700000000 mmdebstrap --quiet --variant=essential \
  --include=python3,git,curl,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='find "$1" -xdev -type f -perm /6000 -exec chmod ug-s {} +' \
  bookworm "$work/rootfs.tar" ${BQ_DEBIAN_MIRROR:+"$BQ_DEBIAN_MIRROR"}
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
check_no_setid check
recipe_end "$image"
