#!/usr/bin/env bash
# Installs mlo from a build folder into a temporary prefix and builds, as an
# integrator would, a small consumer (tests/install/consumer.c) against it:
#   - with pkg-config: C and C++, linked dynamically and statically;
#   - with find_package(mlo): C and C++, mlo::mlo and mlo::mlo_static;
#   - as a subproject (add_subdirectory): only the library is built.
# Every program must run and print "consumer ok".  Also checks that
# libmlo.so exports only mlo_ symbols and has a versioned SONAME.
#
#   scripts/install-check.sh BUILD_DIR      (make test runs it on build/)
set -euo pipefail
build=${1:?usage: install-check.sh BUILD_DIR}
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/mlo-install-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() { echo "install-check: FAIL: $*" >&2; exit 1; }
step() { echo "install-check: $*"; }

cmake --install "$build" --prefix "$prefix" >"$work/install.log" || fail "cmake --install"
libdir=$prefix/lib
[ -d "$libdir" ] || libdir=$(dirname "$(find "$prefix" -name libmlo.a | head -1)")
for f in include/mlo/mlo.h include/mlo/checkpoint.h bin/mlo; do
  [ -e "$prefix/$f" ] || fail "$f is not installed"
done
[ -e "$libdir/libmlo.a" ] && [ -e "$libdir/pkgconfig/mlo.pc" ] || fail "libmlo.a or mlo.pc missing"
soname=$(readelf -d "$libdir/libmlo.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "libmlo.so.0" ] || fail "SONAME is '$soname', expected libmlo.so.0"
others=$(nm -D --defined-only "$libdir/libmlo.so" | awk '{print $3}' | grep -v '^mlo_' || true)
[ -z "$others" ] || fail "libmlo.so exports symbols without the mlo_ prefix: $others"
step "installed: libmlo.a, $soname ($(nm -D --defined-only "$libdir/libmlo.so" | grep -c ' T mlo_') mlo_ symbols, nothing else), headers, mlo, mlo.pc, CMake package"

export PKG_CONFIG_PATH=$libdir/pkgconfig
run() { # NAME: runs $work/NAME, which must say "consumer ok"
  out=$(LD_LIBRARY_PATH=$libdir "$work/$1") || fail "$1 exited $?"
  case $out in "consumer ok"*) step "$1: $out" ;; *) fail "$1 printed '$out'" ;; esac
}
static_libs=$(pkg-config --static --libs mlo | sed 's/-lmlo\b//')
for lang in c cxx; do
  cc=${CC:-cc} file=consumer.c
  [ $lang = cxx ] && cc=${CXX:-c++} file=consumer.cpp
  # shellcheck disable=SC2046
  $cc -o "$work/pc_${lang}_shared" "$src/tests/install/$file" $(pkg-config --cflags --libs mlo) ||
    fail "pkg-config $lang shared build"
  # shellcheck disable=SC2046,SC2086
  $cc -o "$work/pc_${lang}_static" "$src/tests/install/$file" $(pkg-config --cflags mlo) \
    -Wl,-Bstatic -L"$libdir" -lmlo -Wl,-Bdynamic $static_libs || fail "pkg-config $lang static build"
  ldd "$work/pc_${lang}_static" | grep -q libmlo && fail "pc_${lang}_static links libmlo.so"
  run "pc_${lang}_shared"
  run "pc_${lang}_static"
done

cmake -S "$src/tests/install" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" >"$work/cmake.log" ||
  { cat "$work/cmake.log"; fail "find_package(mlo) project did not configure"; }
cmake --build "$work/cmake" -j "$(nproc)" >>"$work/cmake.log" ||
  { cat "$work/cmake.log"; fail "find_package(mlo) project did not build"; }
for exe in c_shared c_static cxx_shared cxx_static; do
  cp "$work/cmake/$exe" "$work/cm_$exe"
  run "cm_$exe"
done
ldd "$work/cm_c_static" | grep -q libmlo && fail "cm_c_static links libmlo.so"

cmake -S "$src/tests/install/subproject" -B "$work/sub" -DMLO_SOURCE_DIR="$src" \
  -DPKG_CONFIG_EXECUTABLE="$(command -v pkg-config)" >"$work/sub.log" ||
  { cat "$work/sub.log"; fail "mlo as a subproject did not configure"; }
cmake --build "$work/sub" -j "$(nproc)" --target consumer_sub >>"$work/sub.log" ||
  { cat "$work/sub.log"; fail "mlo as a subproject did not build"; }
cp "$work/sub/consumer_sub" "$work/consumer_sub"
run consumer_sub
step "passed"
