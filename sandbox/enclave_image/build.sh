#!/usr/bin/env bash
# Builds a bounded-agent enclave image (spec 15.5, 15.8) without any container
# registry: Debian packages via mmdebstrap, the engine from its pinned npm
# package, then `docker import` -- the pattern of the query image
# (sandbox/image/build.sh).
#
#   sandbox/enclave_image/build.sh ENGINE [IMAGE]
#       ENGINE: claude | copilot     default IMAGE: bounded-query-enclave-ENGINE:latest
#
# Contents: Debian's "essential" set (bash, coreutils, grep, sed, findutils,
# ...) plus python3 (the adapter) and git (read-only history for the engine's
# shell tool) and the engine's own libraries (copilot: libstdc++6), the
# engine's native binary at /opt/engine/bin/<engine>, the
# adapter (sandbox/enclave_adapter.py) at /awf/adapter.py as the fixed
# entrypoint, and the mount points the enclave spec uses (/awf/seed,
# /awf/task.txt, /awf/schema.json, /agent). dpkg and apt are removed after
# installation (nothing can be installed at run time), as are perl's CPAN
# client, debconf, documentation and locales; no file keeps a setuid or
# setgid bit.
#
# The engine: `npm install --ignore-scripts` of the pinned package (its
# platform package, with the native glibc binary, is an optional dependency
# npm fetches with it). Claude: then the package's own install.cjs, which
# only links that binary over the placeholder (no network;
# .ci/install-test-tools does the same). Copilot: the platform package
# @github/copilot-linux-x64 holds the binary itself (the main package's
# npm-loader.js only finds and spawns it, and would need Node.js). npm's
# cache makes a rebuild offline once the package was fetched.
#
# Labels: bounded-query.recipe=<sha256 of this script, the adapter and
# recipe.sh> (an image with the same label is not rebuilt),
# bounded-query.engine=<engine>, bounded-query.engine-version=<version>.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
engine=${1:?usage: build.sh ENGINE [IMAGE]}
case "$engine" in
  claude)
    package=@anthropic-ai/claude-code
    version=2.1.328
    binary=@anthropic-ai/claude-code/bin/claude.exe
    link=install.cjs
    libraries=
    env=
    ;;
  copilot)
    package=@github/copilot
    version=1.0.102
    binary=@github/copilot-linux-x64/copilot
    link=
    libraries=,libstdc++6,ca-certificates
    env=" COPILOT_PKG_CACHE_HOME=/opt/engine/cache"
    ;;
  *)
    echo "build-images: no enclave recipe for engine '$engine'" >&2
    exit 2
    ;;
esac
image=${2:-bounded-query-enclave-$engine:latest}
adapter="$here/../enclave_adapter.py"
# shellcheck source=../image/recipe.sh
. "$here/../image/recipe.sh"
recipe_begin "$image" "$here/build.sh" "$adapter"
# Node.js comes with the machine; Debian's nodejs/npm are the fallback (as in
# .ci/install-test-tools). npm only fetches and links: the image has no Node.js.
if ! command -v npm >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
mkdir -p "$work/npm" "$work/engine/bin"
echo '{"name":"bq-enclave-engine","private":true}' >"$work/npm/package.json"
npm install --prefix "$work/npm" --no-audit --no-fund --ignore-scripts --prefer-offline \
  --loglevel=error "$package@$version" >&2
[ -z "$link" ] || (cd "$work/npm" && node "node_modules/$package/$link" >&2)
cp "$work/npm/node_modules/$binary" "$work/engine/bin/$engine"
chmod 0755 "$work/engine/bin/$engine"
# `claude --version` prints "2.1.328 (Claude Code)"; `copilot --version`
# prints "GitHub Copilot CLI 1.0.102." and a hint line.
engine_version() { "$@" --version 2>/dev/null | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -1; }
got=$(engine_version "$work/engine/bin/$engine" || true)
[ "$got" = "$version" ] || { echo "build-images: $package binary reports '$got', expected $version" >&2; exit 1; }
if [ "$engine" = copilot ]; then
  # Copilot's single executable unpacks its package (235 MB: the JS bundle,
  # native addons, ripgrep) into ~/.cache/copilot/pkg on first use; in the
  # enclave HOME is a small noexec tmpfs. Unpack it here, once, read-only
  # in the image (the adapter points COPILOT_PKG_CACHE_HOME at it).
  rm -rf "$work/engine/cache"
  COPILOT_SEA_EXTRACT_ONLY=1 COPILOT_PKG_CACHE_HOME="$work/engine/cache" \
    "$work/engine/bin/copilot" --binary-version >/dev/null
  [ -f "$work/engine/cache/pkg/linux-x64/$version/index.js" ] \
    || { echo "build-images: copilot did not unpack its package" >&2; exit 1; }
fi
SOURCE_DATE_EPOCH=1700000000 mmdebstrap --quiet --variant=essential --include="python3,git$libraries" \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='mkdir -p "$1/awf/seed" "$1/agent" "$1/opt"' \
  --customize-hook=': > "$1/awf/task.txt" && : > "$1/awf/schema.json"' \
  --customize-hook="copy-in $adapter /awf" \
  --customize-hook="copy-in $work/engine /opt" \
  --customize-hook='mv "$1/awf/enclave_adapter.py" "$1/awf/adapter.py"' \
  --customize-hook='chown -R 0:0 "$1/awf" "$1/opt/engine" && chmod -R go-w "$1/opt/engine" && chmod 0755 "$1/awf" "$1/awf/seed" "$1/agent" "$1/opt/engine" "$1/opt/engine/bin" && chmod 0444 "$1/awf/adapter.py" "$1/awf/task.txt" "$1/awf/schema.json"' \
  --customize-hook='rm -rf "$1"/usr/bin/dpkg* "$1"/usr/sbin/dpkg* "$1"/usr/bin/apt* "$1"/usr/sbin/update-alternatives "$1"/usr/bin/update-alternatives "$1"/var/lib/dpkg "$1"/etc/dpkg "$1"/usr/share/dpkg "$1"/var/cache/debconf "$1"/var/log/* "$1"/usr/bin/cpan* "$1"/usr/bin/debconf* "$1"/usr/share/perl5/CPAN* "$1"/usr/share/perl/5.36*/CPAN*' \
  --customize-hook='find "$1" -xdev -type f -perm /6000 -exec chmod ug-s {} +' \
  bookworm "$work/rootfs.tar" ${BQ_DEBIAN_MIRROR:+"$BQ_DEBIAN_MIRROR"}
"$DOCKER" import \
  --change 'USER 65534:65534' \
  --change 'WORKDIR /awf/seed' \
  --change "ENV PATH=/opt/engine/bin:/usr/bin:/bin LANG=C.UTF-8 HOME=/agent/home$env" \
  --change 'ENTRYPOINT ["/usr/bin/python3", "-I", "-S", "/awf/adapter.py"]' \
  --change "LABEL bounded-query.recipe=$recipe" \
  --change "LABEL bounded-query.engine=$engine" \
  --change "LABEL bounded-query.engine-version=$version" \
  "$work/rootfs.tar" "$image" >/dev/null
# Check the result with the hardening an enclave gets (read-only, no privileges).
check() { "$DOCKER" run --rm --network none --read-only --user 65534:65534 --cap-drop ALL \
  --security-opt no-new-privileges:true --entrypoint "$1" "$image" "${@:2}"; }
got=$(engine_version check "/opt/engine/bin/$engine")
[ "$got" = "$version" ] || { echo "build-images: $image runs $engine '$got', expected $version" >&2; exit 1; }
check python3 -I -S -c 'import json, subprocess; print("python ok")' >&2
check bash -c 'git --version' >&2
check python3 -c '
import shutil, sys
bad = [n for n in ("dpkg", "apt", "cpan", "debconf", "apt-get", "aptitude", "pip", "pip3", "npm", "node",
       "docker", "dockerd", "containerd", "runc", "ctr", "podman", "gcc", "cc", "c++", "g++", "clang",
       "tcc", "as", "ld", "make", "curl", "wget", "sudo") if shutil.which(n)]
sys.exit("forbidden tools in image: " + " ".join(bad) if bad else 0)' >&2
check_no_setid check
recipe_end "$image"
