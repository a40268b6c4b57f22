#!/usr/bin/env bash
# Builds a hetra container image from a binary already built (nothing is compiled in the image):
# stages a small build context (the binary without its debug sections, deploy/runtime-packages.txt,
# examples/) and runs buildah bud with chroot isolation (no user namespaces or setrlimit needed).
#   scripts/build-image.sh BINARY IMAGE [BASE] [CONTAINERFILE] [BUILDAH_BUD_ARGS...]
#     BASE           default localhost/hetra-debian12-base, made first by scripts/debian-base.sh;
#                    debian:12 where a registry is reachable
#     CONTAINERFILE  default deploy/Containerfile.cpu
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
binary=${1:?usage: build-image.sh BINARY IMAGE [BASE] [CONTAINERFILE] [ARGS...]}
image=${2:?usage: build-image.sh BINARY IMAGE [BASE] [CONTAINERFILE] [ARGS...]}
base=${3:-localhost/hetra-debian12-base}
containerfile=${4:-$here/deploy/Containerfile.cpu}
shift $(($# < 4 ? $# : 4))

[[ -x $binary ]] || { echo "build-image: $binary is not an executable (run make first)" >&2; exit 1; }
[[ $base == localhost/hetra-debian12-base ]] && "$here/scripts/debian-base.sh" "$base"

context=$(mktemp -d "${TMPDIR:-/tmp}/hetra-image.XXXXXX")
trap 'rm -rf "$context"' EXIT
strip --strip-debug -o "$context/hetra" "$binary" 2>/dev/null || cp "$binary" "$context/hetra"
cp "$here/deploy/runtime-packages.txt" "$context/"
mkdir "$context/examples"
cp "$here"/examples/*.toml "$context/examples/"
buildah bud --isolation chroot --layers --quiet -f "$containerfile" --build-arg BASE="$base" \
  -t "$image" "$@" "$context" >/dev/null
echo "build-image: $image built from $binary (base $base)"
