#!/usr/bin/env bash
# Builds the query image (docs/architecture.md decision 2; spec 14.7) without any
# registry: Debian packages via mmdebstrap, then `docker import`.
#
#   sandbox/image/build.sh [IMAGE]        default: bounded-query-python:latest
#
# Contents: Debian's "essential" set plus python3 and git, the fixed entrypoint
# at /awf/entrypoint.py, mount points /awf/seed, /awf/query-script.py and
# /query. dpkg (the only package manager the essential set has) is removed
# after installation, as are perl's CPAN client, debconf, documentation and
# locales; no file keeps a setuid or setgid bit.
#
# Idempotent: the image carries the label bounded-query.recipe=<sha256 of this
# script and the entrypoint>; an image with the same label is not rebuilt.
# Reproducible: SOURCE_DATE_EPOCH is fixed, so the same package versions give
# the same root file system bytes (mmdebstrap's reproducible mode).
# Checks the result: python3 and git work; no package manager, no Docker
# client, no compiler.
set -euo pipefail
# BQ_DEBIAN_MIRROR (optional): a Debian mirror URL for hosts whose own apt
# sources are not Debian's (for example an Ubuntu CI runner); by default
# mmdebstrap uses the host's apt sources.
here=$(cd "$(dirname "$0")" && pwd)
image=${1:-bounded-query-python:latest}
# shellcheck source=recipe.sh
. "$here/recipe.sh"
recipe_begin "$image" "$here/build.sh" "$here/entrypoint.py"
SOURCE_DATE_EPOCH=1700000000 mmdebstrap --quiet --variant=essential --include=python3,git \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='mkdir -p "$1/awf/seed" "$1/query" && : > "$1/awf/query-script.py"' \
  --customize-hook="copy-in $here/entrypoint.py /awf" \
  --customize-hook='chown -R 0:0 "$1/awf" && chmod 0755 "$1/awf" "$1/awf/seed" "$1/query" && chmod 0444 "$1/awf/entrypoint.py" "$1/awf/query-script.py"' \
  --customize-hook='rm -rf "$1"/usr/bin/dpkg* "$1"/usr/sbin/dpkg* "$1"/usr/bin/apt* "$1"/usr/sbin/update-alternatives "$1"/usr/bin/update-alternatives "$1"/var/lib/dpkg "$1"/etc/dpkg "$1"/usr/share/dpkg "$1"/var/cache/debconf "$1"/var/log/* "$1"/usr/bin/cpan* "$1"/usr/bin/debconf* "$1"/usr/share/perl5/CPAN* "$1"/usr/share/perl/5.36*/CPAN*' \
  --customize-hook='find "$1" -xdev -type f -perm /6000 -exec chmod ug-s {} +' \
  bookworm "$work/rootfs.tar" ${BQ_DEBIAN_MIRROR:+"$BQ_DEBIAN_MIRROR"}
"$DOCKER" import \
  --change 'USER 65534:65534' \
  --change 'WORKDIR /query' \
  --change 'ENV PATH=/usr/bin:/bin LANG=C.UTF-8 HOME=/tmp' \
  --change 'ENTRYPOINT ["/usr/bin/python3", "-I", "-S", "/awf/entrypoint.py"]' \
  --change "LABEL bounded-query.recipe=$recipe" \
  "$work/rootfs.tar" "$image" >/dev/null
# Check the result with the same hardening a query gets (no network, read-only).
check() { "$DOCKER" run --rm --network none --read-only --user 65534:65534 --entrypoint "$1" "$image" "${@:2}"; }
check python3 -c 'import json, sqlite3, subprocess; print("python ok")' >&2
check git --version >&2
check python3 -c '
import shutil, sys
bad = [n for n in ("dpkg", "apt", "cpan", "debconf", "apt-get", "aptitude", "pip", "pip3", "docker", "dockerd",
       "containerd", "runc", "ctr", "podman", "gcc", "cc", "c++", "g++", "clang", "tcc", "as",
       "ld", "make") if shutil.which(n)]
try:
    import ensurepip  # noqa: F401
    bad.append("ensurepip")
except ImportError:
    pass
sys.exit("forbidden tools in image: " + " ".join(bad) if bad else 0)' >&2
check_no_setid check
recipe_end "$image"
