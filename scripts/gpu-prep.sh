#!/usr/bin/env bash
# gpu-prep.sh — runs HERE, before a device session.  The GPU machine has the
# CUDA toolkit, PyTorch and compute-sanitizer but not the Debian libraries
# we build against (cJSON, cmocka, OpenBLAS) and no network, so nothing is
# configured or built there: this script builds with CUDA here and packs
# what the check runs into one folder that travels as is (under 64 MiB):
#
#   build-gpu/pack/bin/    mlo, platform_cuda, platform_cuda_gather, the
#                          contract tests, the example
#   build-gpu/pack/modules/  libmlo-cuda.so and libmlo-workload-cuda.so, which
#                          the programs load at run time (gpu-check.sh sets
#                          MLO_MODULE_PATH to this folder: docs/modules.md)
#   build-gpu/pack/nccl/   a second libmlo-cuda.so, built with NCCL, for the
#                          check's one-rank gather (platform_cuda_gather)
#                          alone: the device has libnccl only in torch's
#                          wheel, so the step finds it there at run time
#                          and skips without it; nothing else loads it
#   build-gpu/pack/libs/   every shared library they need that is neither
#                          glibc nor CUDA's (the GPU machine has those)
#   build-gpu/pack/python/ the mlo package with this build's libmlo in it,
#                          the CPU tests' fixtures (tiny.py) and
#                          gpu-torch.py, for the torch step
#   build-gpu/pack/wheels/ diffusers and transformers, the two the device's
#                          torch install lacks (it has huggingface_hub,
#                          tokenizers, safetensors, regex, pyyaml, tqdm:
#                          carrying newer ones would shadow them), installed
#                          there with --no-index --no-deps (no PyPI there)
#   build-gpu/pack/MANIFEST  what was packed, from which commit
#
# libstdc++ and libgcc_s are never carried: every machine has them, and a
# carried one would shadow torch's.
#
# Then, on the device, the one command: OUT=$OUT scripts/gpu-check.sh
# (carry build-gpu/pack).  Exit status: 0 when the pack is complete and
# small enough.
#
# MLO_GPU_BUILD names the build folder (build-gpu); MLO_GPU_NO_BUILD=1
# packs an existing build as it is, which must have been configured as below
# (NCCL off: a module that links libnccl is refused; MLO_GPU_NCCL_MODULE=ON
# for pack/nccl/); MLO_GPU_TARGETS=pack
# builds only what is packed; MLO_GPU_JOBS sets the build's -j (nproc);
# MLO_GPU_PACK_DIR puts the pack elsewhere; MLO_GPU_NO_WHEELS=1 carries no
# wheels (the torch step then reports itself skipped).  CI's dry run of the
# check (tests/scripts/gpu_dryrun.sh) builds in a temporary folder with
# MLO_GPU_TARGETS=pack and no wheels: it packs what travels, not the CI
# build (review D17).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MLO_GPU_BUILD:-build-gpu}
pack=${MLO_GPU_PACK_DIR:-$build/pack}
limit_mib=${MLO_GPU_PACK_MIB:-60}

if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  echo "gpu-prep: no CUDA toolkit here (/usr/local/cuda): cannot build the CUDA platform" >&2
  exit 1
fi
if [ "${MLO_GPU_NO_BUILD:-0}" != 1 ]; then
mkdir -p "$build"
# NCCL off: the check does not run sharded loads, and a standard toolkit on
# the device has no libnccl for the module to load; the NCCL copy of the
# module is built beside it (MLO_GPU_NCCL_MODULE: build-gpu/mlo-nccl/)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMLO_WITH_CUDA=ON \
  -DMLO_WITH_OPENCL=OFF -DMLO_WITH_MPI=OFF -DMLO_BUILD_TESTS=ON -DMLO_BUILD_EXAMPLES=ON \
  -DMLO_NCCL_INCLUDE=MLO_NCCL_INCLUDE-NOTFOUND -DMLO_NCCL_LIBRARY=MLO_NCCL_LIBRARY-NOTFOUND \
  -DMLO_BUILD_BENCH=OFF -DMLO_GPU_NCCL_MODULE=ON \
  -DMLO_WERROR=ON >"$build/gpu-prep.configure.log" 2>&1 || {
  tail -20 "$build/gpu-prep.configure.log" >&2
  exit 1
}
# MLO_GPU_TARGETS=pack: only what the pack holds (the modules, libmlo, the
# programs below), not the unit tests; CI's dry run builds this way
targets=()
if [ "${MLO_GPU_TARGETS:-all}" = pack ]; then
  targets=(--target mlo_module_cuda mlo_module_workload-cuda mlo_shared mlo_cli platform_cuda
    wan22_offload mlo_module_cuda_nccl platform_cuda_gather)
  for c in tests/contract/C[0-9]*_*.c; do
    c=${c##*/}
    targets+=("${c%.c}")
  done
fi
cmake --build "$build" -j"${MLO_GPU_JOBS:-$(nproc)}" "${targets[@]}" >"$build/gpu-prep.build.log" 2>&1 || {
  tail -30 "$build/gpu-prep.build.log" >&2
  exit 1
}
fi

bins=("$build/tools/mlo/mlo" "$build/tests/platform/platform_cuda"
  "$build/tests/platform/platform_cuda_gather" "$build/examples/wan22_offload")
for t in "$build"/tests/C[0-9]*_*; do
  [ -x "$t" ] && [ -f "$t" ] && bins+=("$t")
done
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "gpu-prep: missing $b (is CUDA built?)" >&2; exit 1; }
done
if [ "${#bins[@]}" -lt 18 ]; then
  echo "gpu-prep: found ${#bins[@]} programs; the contract tests are missing" >&2
  exit 1
fi

rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/libs" "$pack/modules" "$pack/nccl"
for b in "${bins[@]}"; do
  cp "$b" "$pack/bin/"
  strip --strip-unneeded "$pack/bin/$(basename "$b")"
done
for m in libmlo-cuda.so libmlo-workload-cuda.so; do
  [ -f "$build/mlo/$m" ] || { echo "gpu-prep: missing module $build/mlo/$m" >&2; exit 1; }
  cp "$build/mlo/$m" "$pack/modules/"
  strip --strip-unneeded "$pack/modules/$m"
done
# The module that travels links no NCCL: the device has no libnccl beyond
# what a wheel ships (review D17).  is_system below exempts libnccl, so a
# NCCL build (say MLO_GPU_NO_BUILD=1 on a normal build) is refused here.
if readelf -d "$pack/modules/libmlo-cuda.so" | grep -E 'NEEDED.*libnccl' >&2; then
  echo "gpu-prep: $build/mlo/libmlo-cuda.so links NCCL; build it with NCCL off (this script's own build)" >&2
  exit 1
fi
# The NCCL copy, for the one-rank gather alone: it must link NCCL, or the
# step would prove nothing (a pack of a build configured without
# MLO_GPU_NCCL_MODULE=ON has none).
nccl_module="$build/mlo-nccl/libmlo-cuda.so"
[ -f "$nccl_module" ] || { echo "gpu-prep: missing $nccl_module (MLO_GPU_NCCL_MODULE=ON)" >&2; exit 1; }
cp "$nccl_module" "$pack/nccl/"
strip --strip-unneeded "$pack/nccl/libmlo-cuda.so"
readelf -d "$pack/nccl/libmlo-cuda.so" | grep -qE 'NEEDED.*libnccl' ||
  { echo "gpu-prep: $nccl_module links no NCCL" >&2; exit 1; }
# The libraries to carry: everything ldd resolves outside glibc and CUDA.
is_system() {
  case "$(basename "$1")" in
  libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | linux-vdso*) return 0 ;;
  libstdc++.so* | libgcc_s.so*) return 0 ;;
  libcuda.so* | libcudart.so* | libcublas.so* | libcublasLt.so* | libnccl.so* | libnvidia*) return 0 ;;
  esac
  case "$1" in /usr/local/cuda*) return 0 ;; esac
  return 1
}
for b in "$pack"/bin/* "$pack"/modules/* "$pack"/nccl/*; do
  ldd "$b" | awk '/=>/ {print $3}' | while read -r lib; do
    [ -n "$lib" ] && [ -f "$lib" ] || continue
    is_system "$lib" && continue
    cp -L -n "$lib" "$pack/libs/$(basename "$lib")"
  done
done

# Self-contained: with only the pack, glibc and CUDA on the path, nothing
# is missing (what a machine without our Debian libraries will see).
missing=0
for b in "$pack"/bin/* "$pack"/modules/* "$pack"/nccl/*; do
  while read -r lib; do
    case "$lib" in
    "$pack"/libs/* | /lib*/libc.so* | /lib*/libm.so* | /lib*/ld-linux* | /usr/local/cuda*) ;;
    */libstdc++.so* | */libgcc_s.so*) ;;
    *) is_system "$lib" || { echo "gpu-prep: $(basename "$b") resolves $lib outside the pack" >&2; missing=1; } ;;
    esac
  done < <(env -i LD_LIBRARY_PATH="$pack/libs" ldd "$b" | awk '/=>/ {print $3}')
  if env -i LD_LIBRARY_PATH="$pack/libs:/usr/local/cuda/lib64:/usr/local/cuda/lib" ldd "$b" |
    grep -q "not found"; then
    echo "gpu-prep: $(basename "$b") has unresolved libraries" >&2
    missing=1
  fi
done
[ "$missing" -eq 0 ] || exit 1
# The large ones travel compressed (OpenBLAS is 36 MiB, 4 as xz): the check
# unpacks them into its output folder before anything runs.
for lib in "$pack"/libs/*; do
  [ "$(stat -c %s "$lib")" -gt $((4 << 20)) ] && xz -T0 -6 "$lib"
done

# mlo.torch for the torch step: the package with this build's libmlo, the
# fixtures, the step's script
mkdir -p "$pack/python/mlo"
cp python/mlo/*.py "$pack/python/mlo/"
# this build's libmlo (a reused build folder holds older versions too),
# under its SONAME, where mlo/_lib.py looks first
so=$(readlink -f "$build/libmlo.so" 2>/dev/null || true)
[ -f "$so" ] || { echo "gpu-prep: no shared libmlo in $build" >&2; exit 1; }
soname=$(readelf -d "$so" | sed -n 's/.*SONAME.*\[\(.*\)\].*/\1/p')
[ -n "$soname" ] || { echo "gpu-prep: $so has no SONAME" >&2; exit 1; }
cp "$so" "$pack/python/mlo/$soname"
strip --strip-unneeded "$pack/python/mlo/$soname"
cp python/tests/tiny.py scripts/gpu-torch.py "$pack/python/"
if [ "${MLO_GPU_NO_WHEELS:-0}" != 1 ]; then
  mkdir -p "$pack/wheels"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$pack/wheels" $(grep -E '^(diffusers|transformers)==' python/tests/torch-requirements.txt) \
    >"$build/gpu-prep.wheels.log" 2>&1 || {
    tail -5 "$build/gpu-prep.wheels.log" >&2
    echo "gpu-prep: could not fetch the wheels (PyPI); the torch step will be skipped" >&2
  }
fi

{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) with $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1)"
  echo "programs:"
  for b in "$pack"/bin/*; do echo "  bin/$(basename "$b")"; done
  for m in "$pack"/modules/*; do echo "  modules/$(basename "$m")"; done
  echo "  nccl/libmlo-cuda.so (with NCCL, for the one-rank gather; libnccl.so.2 from the device)"
  echo "python:"
  for f in "$pack"/python/* "$pack"/python/mlo/*; do [ -f "$f" ] && echo "  ${f#$pack/}"; done
  echo "wheels:"
  for w in "$pack"/wheels/*.whl; do [ -f "$w" ] && echo "  wheels/$(basename "$w")"; done
  echo "libraries:"
  for l in "$pack"/libs/*; do echo "  libs/$(basename "$l")"; done
  echo "(libs/*.xz: unpacked by gpu-check.sh)"
} >"$pack/MANIFEST"

size_kib=$(du -sk "$pack" | cut -f1)
echo "gpu-prep: $pack: ${#bins[@]} programs, $(ls "$pack/libs" | wc -l) libraries, $((size_kib / 1024)) MiB"
if [ "$size_kib" -gt $((limit_mib * 1024)) ]; then
  echo "gpu-prep: the pack is over ${limit_mib} MiB" >&2
  exit 1
fi
