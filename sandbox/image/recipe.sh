# Shared steps of the image recipes (sourced by sandbox/image/build.sh and
# sandbox/agent_image/build.sh; never run on its own). Both images are Debian
# root file systems made by mmdebstrap and `docker import`ed, so no registry
# is needed (docs/architecture.md decision 2).
#
#   recipe_begin IMAGE FILE...   the recipe label is the sha256 of FILE... and
#                                of this file; exits 0 when IMAGE carries it
#                                already; otherwise sets DOCKER, recipe, work
#                                (a temporary directory) and previous (the
#                                image id being replaced, or empty)
#   check_no_setid CHECK...      runs CHECK... python3 -c <program>: fails when
#                                any file under /usr, /bin or /sbin keeps a
#                                setuid or setgid bit
#   recipe_end IMAGE             drops the superseded build (kept if a
#                                container uses it) and says it is done

recipe_begin() {
  local image=$1
  shift
  DOCKER=/usr/bin/docker
  [ -x "$DOCKER" ] || DOCKER=docker
  recipe=$(cat "$@" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)
  local have
  have=$("$DOCKER" image inspect -f '{{ index .Config.Labels "bounded-query.recipe" }}' "$image" 2>/dev/null || true)
  if [ "$have" = "$recipe" ]; then
    echo "build-images: $image is up to date (recipe ${recipe:0:12})" >&2
    exit 0
  fi
  command -v mmdebstrap >/dev/null || { echo "build-images: mmdebstrap missing; run .ci/provision-engine" >&2; exit 1; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "build-images: building $image (recipe ${recipe:0:12})" >&2
  previous=$("$DOCKER" image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
}

check_no_setid() {
  "$@" python3 -c '
import os, sys
bad = []
for top in ("/usr", "/bin", "/sbin"):
    for d, _, fs in os.walk(top):
        bad += [os.path.join(d, f) for f in fs if not os.path.islink(os.path.join(d, f))
                and os.lstat(os.path.join(d, f)).st_mode & 0o6000]
sys.exit("setuid/setgid files in image: " + " ".join(bad) if bad else 0)' >&2
}

recipe_end() {
  local image=$1 current
  current=$("$DOCKER" image inspect -f '{{.Id}}' "$image")
  if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
    "$DOCKER" rmi "$previous" >/dev/null 2>&1 || true
  fi
  echo "build-images: $image built and checked" >&2
}
