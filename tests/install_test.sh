#!/usr/bin/env bash
# The install test (ctest label `install`): what a user of the installed package does.
#   1. cmake --install of this build into a temporary prefix;
#   2. configure examples/custom_model/ (the user's project) with -DCMAKE_PREFIX_PATH=<prefix>;
#   3. build it (one translation unit) and run it: it exits non-zero when training falls short.
# The temporary directory goes on every exit.
# Usage: install_test.sh CMAKE BUILD_DIR SOURCE_DIR GENERATOR CXX_COMPILER
set -euo pipefail
cmake=$1 build=$2 source=$3 generator=$4 cxx=$5

work=$(mktemp -d "${TMPDIR:-/tmp}/hetra-install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

echo "== cmake --install $build --prefix $prefix"
if ! "$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1; then
  cat "$work/install.log"
  exit 1
fi
# The package must not point back into the source or build tree: it has to work once they are gone.
if grep -rlF -e "$source/src" -e "$build" "$prefix/lib/cmake/hetra"; then
  echo "install_test: the installed CMake package names the source or build tree (above)" >&2
  exit 1
fi

echo "== configure examples/custom_model against $prefix"
# Debug (-O0) compiles quickest; the training work runs in the installed, optimised libraries.
"$cmake" -S "$source/examples/custom_model" -B "$work/build" -G "$generator" \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
found=$(sed -n 's/^hetra_DIR:PATH=//p' "$work/build/CMakeCache.txt")
if [[ "$found" != "$prefix/"* ]]; then
  echo "install_test: find_package(hetra) found '$found', not the package in $prefix" >&2
  exit 1
fi

echo "== build"
"$cmake" --build "$work/build"

echo "== run"
"$work/build/custom_model"
