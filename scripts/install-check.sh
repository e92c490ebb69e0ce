#!/usr/bin/env bash
# Installs mlo from a build folder into a temporary prefix and builds, as an
# integrator would, a small consumer (tests/install/consumer.c) against it:
#   - with pkg-config: C and C++, linked dynamically and statically;
#   - with find_package(mlo): C and C++, mlo::mlo and mlo::mlo_static;
#   - as a subproject (add_subdirectory): only the library is built.
# Every program must run and print "consumer ok".  Also checks that
# libmlo.so exports only mlo_ symbols, has a versioned SONAME, and needs
# nothing but libc, pthreads and cJSON (docs/modules.md): the device
# runtimes are the modules' (installed in LIBDIR/mlo), MPI is libmlo-mpi's,
# BLAS is the tool's workload's.  The consumer then runs with every CUDA,
# MPI, OpenCL and BLAS library hidden from the loader (bind-mounted over in
# a mount namespace of its own; where there is none, the loader's trace
# must show none of them opened), on the host platform, and opening cuda:0
# there is an error naming what is missing.
#
#   scripts/install-check.sh BUILD_DIR      (make test runs it on build/)
set -euo pipefail
# (no `ldd ... | grep -q`: grep -q exits at its first match, ldd then dies of
# SIGPIPE and pipefail fails the check at random; plain grep reads it all)
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
want=$(sed -n 's/^#define MLO_VERSION_\(MAJOR\|MINOR\) //p' "$src/include/mlo/mlo.h" | paste -sd.)
[ "$soname" = "libmlo.so.$want" ] || fail "SONAME is '$soname', expected libmlo.so.$want (major.minor)"
others=$(nm -D --defined-only "$libdir/libmlo.so" | awk '{print $3}' | grep -v '^mlo_' || true)
[ -z "$others" ] || fail "libmlo.so exports symbols without the mlo_ prefix: $others"
# What libmlo.so asks the loader for, directly and through its dependencies.
needed=$(readelf -d "$libdir/libmlo.so" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | sort | tr '\n' ' ')
for lib in $needed; do
  case $lib in ld-linux*.so.* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | libcjson.so.* | liburing.so.*) ;;
  *) fail "libmlo.so needs $lib (only libc, pthreads and cJSON are allowed): $needed" ;;
  esac
done
heavy='cuda|cublas|nccl|OpenCL|clblast|openblas|blas|mpi|open-pal|open-rte'
if ldd "$libdir/libmlo.so" | grep -Ei "$heavy"; then fail "libmlo.so loads one of the above"; fi
step "libmlo.so needs: $needed"
# The modules and libmlo-mpi, where this build has them.
modules=$(cd "$build/mlo" 2>/dev/null && ls libmlo-*.so 2>/dev/null || true)
for m in $modules; do
  [ -e "$libdir/mlo/$m" ] || fail "module $m is not installed in $libdir/mlo"
  syms=$(nm -D --defined-only "$libdir/mlo/$m" | awk '{print $3}')
  echo "$syms" | grep -qx mlo_module_init || fail "$m does not export mlo_module_init"
  extra=$(echo "$syms" | grep -vx mlo_module_init | grep -v '^_' || true)
  [ -z "$extra" ] || fail "$m exports more than mlo_module_init: $extra"
done
[ -z "$modules" ] || step "modules in lib/mlo: $(echo $modules)"
moddir=$(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --variable=moduledir mlo)
for m in $modules; do
  [ -e "$moddir/$m" ] || fail "pkg-config's moduledir ($moddir) does not hold $m"
done
have_mpi=0
if ls "$build"/src/mpi/libmlo-mpi.so* >/dev/null 2>&1; then
  have_mpi=1
  [ -e "$libdir/libmlo-mpi.so" ] && [ -e "$libdir/libmlo-mpi.a" ] && [ -e "$libdir/pkgconfig/mlo-mpi.pc" ] &&
    [ -e "$prefix/include/mlo/mpi.h" ] || fail "libmlo-mpi, mlo-mpi.pc or mlo/mpi.h is not installed"
fi
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
  ldd "$work/pc_${lang}_static" | grep libmlo >/dev/null && fail "pc_${lang}_static links libmlo.so"
  run "pc_${lang}_shared"
  run "pc_${lang}_static"
done

# Every library a device platform, MPI or BLAS would bring in, as the loader
# would find them: hidden below by bind-mounting an empty file over each.
hidden_libs() {
  ldconfig -p | awk '{print $NF}' | grep -Ei "/lib[^/]*($heavy)[^/]*\.so" || true
  find /usr/local/cuda*/ -name 'lib*.so*' \( -type f -o -type l \) 2>/dev/null | grep -Ei "$heavy" || true
}
run_hidden() { # NAME: runs $work/NAME on the host platform with the heavy libraries hidden
  local list=$work/hidden.txt how
  hidden_libs | sort -u >"$list"
  if command -v unshare >/dev/null && unshare -m true 2>/dev/null; then
    out=$(unshare -m sh -c 'list=$1 lib=$2; shift 2
      while read -r f; do mount --bind /dev/null "$f" 2>/dev/null || true; done <"$list"
      LD_LIBRARY_PATH=$lib CONSUMER_CUDA=absent "$@"' sh "$list" "$libdir" "$work/$1") ||
      fail "$1 with CUDA/MPI/BLAS hidden exited $?"
    how="$(wc -l <"$list") library files hidden"
  else
    # no mount namespace here: the loader's own trace says what was opened
    out=$(LD_DEBUG=files LD_DEBUG_OUTPUT=$work/ld LD_LIBRARY_PATH=$libdir MLO_MODULE_PATH=$work/none \
      CONSUMER_CUDA=absent "$work/$1") || fail "$1 without modules exited $?"
    if cat "$work"/ld.* | grep -Ei "file=[^ ]*($heavy)"; then fail "$1 opened one of the above"; fi
    how="none of them opened, by the loader's trace"
  fi
  case $out in "consumer ok"*) step "$1, CUDA/MPI/BLAS hidden ($how): $out" ;; *) fail "$1 printed '$out'" ;; esac
}
run_hidden pc_c_shared
run_hidden pc_c_static

if [ $have_mpi = 1 ]; then
  # shellcheck disable=SC2046
  ${CC:-cc} -o "$work/pc_mpi_shared" "$src/tests/install/consumer_mpi.c" $(pkg-config --cflags --libs mlo-mpi) ||
    fail "pkg-config mlo-mpi build"
  ldd "$work/pc_mpi_shared" | grep libmlo-mpi >/dev/null || fail "pc_mpi_shared does not link libmlo-mpi.so"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 run pc_mpi_shared
fi
mods=""
for m in $modules; do
  case $m in libmlo-cuda.so) mods="$mods;cuda" ;; libmlo-opencl.so) mods="$mods;opencl" ;; esac
done
cmake -S "$src/tests/install" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" \
  -DMLO_CHECK_MPI=$([ $have_mpi = 1 ] && echo ON || echo OFF) -DMLO_CHECK_MODULES="${mods#;}" >"$work/cmake.log" ||
  { cat "$work/cmake.log"; fail "find_package(mlo) project did not configure"; }
cmake --build "$work/cmake" -j "$(nproc)" >>"$work/cmake.log" ||
  { cat "$work/cmake.log"; fail "find_package(mlo) project did not build"; }
exes="c_shared c_static cxx_shared cxx_static"
[ $have_mpi = 1 ] && exes="$exes mpi_shared mpi_static"
for exe in $exes; do
  cp "$work/cmake/$exe" "$work/cm_$exe"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 run "cm_$exe"
done
step "find_package(mlo COMPONENTS ${mods#;}$([ $have_mpi = 1 ] && echo ' mpi')): found"
ldd "$work/cm_c_static" | grep libmlo >/dev/null && fail "cm_c_static links libmlo.so"

cmake -S "$src/tests/install/subproject" -B "$work/sub" -DMLO_SOURCE_DIR="$src" \
  -DPKG_CONFIG_EXECUTABLE="$(command -v pkg-config)" >"$work/sub.log" ||
  { cat "$work/sub.log"; fail "mlo as a subproject did not configure"; }
cmake --build "$work/sub" -j "$(nproc)" --target consumer_sub >>"$work/sub.log" ||
  { cat "$work/sub.log"; fail "mlo as a subproject did not build"; }
cp "$work/sub/consumer_sub" "$work/consumer_sub"
run consumer_sub
step "passed"
