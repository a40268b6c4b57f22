#!/usr/bin/env bash
# The CPU image (deploy/Containerfile.cpu) built with buildah from this build's hetra, as `make
# image` builds it, and the demo run inside it with `buildah run --isolation chroot`: hetra probe,
# then examples/fashion_mnist_hetero.toml (shortened to 60 steps), the dataset mounted read-only.
# Also checks what the image holds: the entry point hetra, no compiler. Skipped (exit 77, with the
# reason) where buildah cannot create and commit a container, or, for a first run, debootstrap cannot
# run; never passes without building.
# The first run makes the Debian base with debootstrap (here 5.5 minutes, then a minute to import
# it; cached under /var/tmp/hetra-base and in buildah's store); later runs took 16 s, demo included.
#   tests/image_test.sh SOURCE_DIR HETRA_BINARY
set -euo pipefail
skip() { echo "SKIP: $*" && exit 77; }
src=$(realpath "$1") hetra=$(realpath "$2")
command -v buildah >/dev/null || skip "buildah is not installed (scripts/install-deps.sh installs it)"
probe=$(buildah from scratch 2>&1) || skip "buildah cannot create a container here: $probe"
# Committing applies a layer, which buildah does by remounting / in a mount namespace: that fails
# where / is not a mount point (a chroot), whatever the image.
if ! committed=$(buildah commit --quiet "$probe" localhost/hetra-probe:commit 2>&1); then
  buildah rm "$probe" >/dev/null
  skip "buildah cannot commit an image here: ${committed##*: }"
fi
buildah rm "$probe" >/dev/null
buildah rmi localhost/hetra-probe:commit >/dev/null 2>&1 || true
base=localhost/hetra-debian12-base
if ! buildah inspect --type image "$base" >/dev/null 2>&1 && ! ls /var/tmp/hetra-base/debian12-*.tar >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || skip "debootstrap is not installed (scripts/install-deps.sh installs it)"
  [[ $(id -u) -eq 0 ]] || skip "debootstrap needs root to make the Debian base"
  timeout 10 bash -c "exec 3<>/dev/tcp/deb.debian.org/80" 2>/dev/null ||
    skip "no Debian mirror reachable for debootstrap (deb.debian.org:80)"
fi
data=/usr/share/datasets/fashion-mnist
[[ -f $data/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist is not installed"

image=localhost/hetra-test:cpu
container=
cleanup() {
  [[ -n $container ]] && buildah rm "$container" >/dev/null 2>&1
  buildah rmi "$image" >/dev/null 2>&1 || true
}
trap cleanup EXIT
started=$SECONDS
"$src/scripts/build-image.sh" "$hetra" "$image"
echo "image built in $((SECONDS - started)) s"

entry=$(buildah inspect --type image --format '{{.OCIv1.Config.Entrypoint}}' "$image")
[[ $entry == "[/usr/local/bin/hetra]" ]] || { echo "FAIL: entry point $entry, not hetra"; exit 1; }
container=$(buildah from "$image")
# buildah's chroot isolation re-executes buildah from a sealed in-memory copy, and sealing it fails
# now and then ("sealing memfd copy: Device or resource busy": the kernel refuses the write seal
# while a writable shared mapping of the copy lingers), before the command starts. That is the
# container tool's, not the image's: such a start is tried once more; any other failure stands.
in_image() {
  local err status=0
  err=$(mktemp)
  for attempt in 1 2; do
    status=0
    buildah run --isolation chroot -v "$data:$data:ro" "$container" -- "$@" 2>"$err" || status=$?
    cat "$err" >&2
    [[ $status -ne 0 && $attempt -eq 1 ]] && grep -q "sealing memfd copy" "$err" || break
    echo "image test: buildah could not start the command (above); once more" >&2
  done
  rm -f "$err"
  return "$status"
}
compilers=$(in_image sh -c 'for c in cc gcc g++ c++ clang cmake; do command -v $c; done; true')
[[ -z $compilers ]] || { echo "FAIL: the runtime image holds build tools: $compilers"; exit 1; }
in_image hetra probe | grep -q "CPU" || { echo "FAIL: hetra probe in the image"; exit 1; }
in_image hetra run /usr/share/hetra/examples/fashion_mnist_hetero.toml --set train.steps=60 \
  --set train.warmup_steps=10 --set train.eval_every=0 --metrics /work/demo.jsonl |
  tail -5
records=$(in_image sh -c 'grep -c "\"event\":\"step\"" /work/demo.jsonl || true')
accuracy=$(in_image sh -c 'grep "\"event\":\"eval\"" /work/demo.jsonl | tail -1')
echo "the demo in the image recorded $records steps; last evaluation: $accuracy"
[[ $records -ge 1 && -n $accuracy ]] || { echo "FAIL: the demo in the image wrote no step or evaluation record"; exit 1; }
echo "image test took $((SECONDS - started)) s"
