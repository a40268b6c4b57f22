#!/usr/bin/env bash
# Makes the Debian 12 base image of deploy/Containerfile.cpu without an image registry: debootstrap
# builds a minimal root from Debian's packages, buildah imports it as a local image.
#   scripts/debian-base.sh [IMAGE]     (default localhost/hetra-debian12-base)
# The root is cached as a tarball under HETRA_BASE_CACHE (default /var/tmp/hetra-base), so a second
# run only imports it; an image in buildah's store made from the same package list is kept. The
# root holds deploy/runtime-packages.txt, which makes the image build offline and quick; built FROM
# debian:12 instead, the Containerfile installs them itself.
set -euo pipefail

image=${1:-localhost/hetra-debian12-base}
cache=${HETRA_BASE_CACHE:-/var/tmp/hetra-base}
mirror=${HETRA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
here=$(cd "$(dirname "$0")/.." && pwd)

packages=$(grep -v '^#' "$here/deploy/runtime-packages.txt" | xargs | tr ' ' ,)
# An image made from another package list is made again.
made=$(buildah inspect --type image --format '{{index .OCIv1.Config.Labels "hetra.packages"}}' \
  "$image" 2>/dev/null || true)
if [[ $made == "$packages" ]]; then
  echo "debian-base: $image is already there"
  exit 0
fi
for tool in debootstrap buildah; do
  command -v "$tool" >/dev/null ||
    { echo "debian-base: $tool is not installed (scripts/install-deps.sh installs it)" >&2; exit 1; }
done

tarball="$cache/debian12-$(echo "$packages" | sha256sum | cut -c1-12).tar"
if [[ ! -f $tarball ]]; then
  mkdir -p "$cache"
  root=$(mktemp -d "$cache/root.XXXXXX")
  trap 'rm -rf "$root" "$tarball.partial"' EXIT
  echo "debian-base: debootstrap bookworm (minbase + $packages) from $mirror into $root"
  debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror"
  # An image needs neither the package cache nor the lists; a user's apt-get update refills them.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" --numeric-owner -cf "$tarball.partial" .
  mv "$tarball.partial" "$tarball"
  rm -rf "$root"
  trap - EXIT
fi

echo "debian-base: importing $tarball as $image"
container=$(buildah from scratch)
trap 'buildah rm "$container" >/dev/null 2>&1 || true' EXIT
mount=$(buildah mount "$container")
tar -C "$mount" --numeric-owner -xf "$tarball"
buildah umount "$container" >/dev/null
buildah config --label hetra.packages="$packages" --cmd /bin/bash \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$container"
buildah commit --quiet "$container" "$image" >/dev/null
echo "debian-base: $image ready"
