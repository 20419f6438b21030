#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/consumer/run.sh BUILD_DIR -- install the stepgraph built in BUILD_DIR into
# a temporary prefix, then build and run tests/consumer/main.c against it four
# ways: CMake package (shared, static) and pkg-config (shared, static).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
export SG_CACHE_DIR=$work/cache
for link in shared static; do
    cmake -S "$here" -B "$work/cmake-$link" -DCMAKE_PREFIX_PATH="$prefix" -DSG_LINK=$link \
        -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$work/cmake-$link" >/dev/null
    echo -n "cmake package, $link: "
    "$work/cmake-$link/consumer"
done
libdir=$(dirname "$(find "$prefix" -name stepgraph.pc | head -1)")/..
export PKG_CONFIG_PATH=$(cd "$libdir/pkgconfig" && pwd)
libdir=$(cd "$libdir" && pwd)
cc -std=c11 -O2 -o "$work/pc-shared" "$here/main.c" $(pkg-config --cflags --libs stepgraph) \
    -Wl,-rpath,"$libdir" -lm
echo -n "pkg-config, shared: "
"$work/pc-shared"
# The static library by name, with the dependencies pkg-config --static lists.
static_libs=$(pkg-config --static --libs stepgraph | sed "s|-lstepgraph|$libdir/libstepgraph.a|")
cc -std=c11 -O2 -o "$work/pc-static" "$here/main.c" $(pkg-config --cflags stepgraph) $static_libs
echo -n "pkg-config, static: "
"$work/pc-static"
