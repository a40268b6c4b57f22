#!/usr/bin/env bash
# Installs the Debian packages hetra needs to build and test, only those missing. Used by `make`.
#   scripts/install-deps.sh [build|bench]    build: compile, test and make image (default);
#     bench: also the peers
set -euo pipefail

build_packages=(
  cmake ninja-build g++ make pkg-config
  nlohmann-json3-dev libcli11-dev libtomlplusplus-dev
  libgtest-dev libgmock-dev libssl-dev zlib1g-dev
  libtorch-dev libopenblas0-pthread dataset-fashion-mnist
  iproute2 clang libclang-rt-14-dev libopenmpi-dev openmpi-bin
  # hetra report (matplotlib), and its tests: the page in headless chromium, the bar in tmux
  python3-matplotlib chromium tmux
  libyaml-cpp-dev  # hetra k8s writes its Volcano Job with yaml-cpp
  # make image and its test: buildah builds the image, debootstrap makes its Debian base
  buildah debootstrap
  # The Python module hetra._core and its tests (make test-python; pip install into a venv)
  python3-dev pybind11-dev python3-pytest python3-venv python3-torch
  # The ROCm build (make build-rocm): HIP's compiler, runtime headers and the AMD device libraries
  hipcc libamdhip64-dev rocm-device-libs
)
bench_packages=(python3 python3-torch)

wanted=("${build_packages[@]}")
[[ "${1:-build}" == bench ]] && wanted+=("${bench_packages[@]}")

missing=()
for pkg in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "hetra: installing missing Debian packages: ${missing[*]}"
sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
