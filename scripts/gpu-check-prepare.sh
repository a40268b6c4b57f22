#!/usr/bin/env bash
# Prepares, on one of our Debian 12 machines, what scripts/gpu-check.sh needs on a GPU machine that
# has nvcc, CMake, ninja and Python with PyTorch but no Debian packages and no network: the
# libraries hetra builds against that such an image lacks, and Fashion-MNIST's test set.
#
#   scripts/gpu-check-prepare.sh [DIR]        (default: gpu-prep, which git ignores)
#
# DIR is laid out as a prefix (include/, lib/x86_64-linux-gnu/ with the packages' CMake files,
# share/) so that `-DCMAKE_PREFIX_PATH=DIR` finds each package by its own config file, whose paths
# are relative to it. Taken from the installed Debian packages (scripts/install-deps.sh):
#   headers                    nlohmann_json, CLI11, toml++, yaml-cpp, OpenSSL, zlib
#   static libraries           GoogleTest and GoogleMock (built by Debian with g++ 12, the
#                              C++11 string ABI, as PyTorch 2.x wheels use)
#   shared libraries           yaml-cpp, toml++, libcrypto and libz, with their link names (an image
#                              may have other versions or no link names); rpaths point at them
#   data                       Fashion-MNIST t10k (10000 images), also as the training split: the
#                              job trains and evaluates on it (the real training set, 26 MiB
#                              more, would pass the size limit)
# Fails when DIR would exceed 40 MiB (it travels with the tree to the GPU machine).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/gpu-prep}"
LIMIT_MIB=40
ARCH=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
LIB=/usr/lib/$ARCH

"$ROOT/scripts/install-deps.sh" build

rm -rf "$DIR"
mkdir -p "$DIR"

# copy PATH...: each path under /usr, to the same path under DIR. Links are copied as the files
# they point to: the tree travels to the GPU machine as plain files.
copy() {
  local path
  for path in "$@"; do
    [[ -e "$path" || -L "$path" ]] || { echo "gpu-check-prepare: missing $path" >&2; exit 1; }
    mkdir -p "$DIR/$(dirname "${path#/usr/}")"
    cp -rL "$path" "$DIR/$(dirname "${path#/usr/}")/"
  done
}

copy /usr/include/nlohmann /usr/share/cmake/nlohmann_json
copy /usr/include/CLI /usr/share/cmake/CLI11
copy /usr/include/toml++ "$LIB/cmake/tomlplusplus" "$LIB"/libtomlplusplus.so*
copy /usr/include/openssl "$LIB"/libcrypto.so*
# The architecture's configuration headers, which Debian keeps apart, go beside the others: the
# GPU machine's compiler does not search include/$ARCH of this prefix.
cp -L "/usr/include/$ARCH/openssl/"*.h "$DIR/include/openssl/"
copy /usr/include/zlib.h /usr/include/zconf.h "$LIB"/libz.so "$LIB"/libz.so.1
copy /usr/include/gtest /usr/include/gmock "$LIB/cmake/GTest" "$LIB"/libgtest*.a "$LIB"/libgmock*.a
copy /usr/include/yaml-cpp "$LIB/cmake/yaml-cpp" "$LIB"/libyaml-cpp.so*
copy /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz \
  /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz
# The dataset reader opens train-* for the training split: the test set stands in for it.
data="$DIR/share/datasets/fashion-mnist"
cp "$data/t10k-images-idx3-ubyte.gz" "$data/train-images-idx3-ubyte.gz"
cp "$data/t10k-labels-idx1-ubyte.gz" "$data/train-labels-idx1-ubyte.gz"

cat >"$DIR/README" <<EOF
gpu-prep of $(date -u +%FT%TZ), from Debian $(cat /etc/debian_version) packages
Made by scripts/gpu-check-prepare.sh for scripts/gpu-check.sh. A CMake prefix: -DCMAKE_PREFIX_PATH=<this dir>.
share/datasets/fashion-mnist holds the test set only, copied under the train-* names too.
EOF

mib=$(du -sm "$DIR" | cut -f1)
if ((mib > LIMIT_MIB)); then
  echo "gpu-check-prepare: $DIR is $mib MiB, over the $LIMIT_MIB MiB it may carry" >&2
  exit 1
fi
echo "gpu-check-prepare: $DIR ready, $mib MiB"
