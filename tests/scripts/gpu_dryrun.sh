#!/usr/bin/env bash
# The device check's own logic, where no GPU is (ctest gpu_check_dryrun):
# scripts/gpu-prep.sh builds and packs what travels to the device (its own
# configuration: NCCL, MPI and OpenCL off) in a temporary folder, only the
# pack's targets (MLO_GPU_TARGETS=pack; no wheels: no download), not the CI
# build, which links NCCL (review D17); the packed libmlo-cuda.so must NEED
# no libnccl.  Then scripts/gpu-check.sh runs on that pack twice.  MLO_GPU_DRYRUN=1 must
# exit 0 with the preflight run, every step reported SKIPPED (dry run), no
# FAIL, its summary and archive written and $OUT within the device tool's
# limits.  MLO_GPU_DRYRUN=2, the rehearsal, runs every step for real on the
# host platform: the steps that need no GPU must pass (their commands,
# variables and verdicts), with the same digest under the stub holder, and
# those that need one report themselves SKIPPED.  Everything is written
# under a temporary folder this script makes and removes.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
MLO_GPU_BUILD="$tmp/build" MLO_GPU_TARGETS=pack MLO_GPU_JOBS="${MLO_GPU_JOBS:-2}" MLO_GPU_NO_WHEELS=1 \
  MLO_GPU_PACK_DIR="$tmp/pack" bash "$repo/scripts/gpu-prep.sh"
# the module that travels: the CUDA runtime and no NCCL (review D17)
needed=$(readelf -d "$tmp/pack/modules/libmlo-cuda.so" | grep NEEDED)
if grep -q libnccl <<<"$needed"; then
  echo "gpu_dryrun: the packed libmlo-cuda.so needs NCCL:"
  echo "$needed"
  exit 1
fi
grep -q "libcudart" <<<"$needed" || { echo "gpu_dryrun: the packed libmlo-cuda.so needs no libcudart?"; exit 1; }
# a CUDA runtime only in a pip wheel (review D3): the preflight lists it
mkdir -p "$tmp/site/nvidia/cu13/lib"
: >"$tmp/site/nvidia/cu13/lib/libcudart.so.13"
PYTHONPATH="$tmp/site${PYTHONPATH:+:$PYTHONPATH}" MLO_GPU_DRYRUN=1 MLO_GPU_PACK="$tmp/pack" \
  OUT="$tmp/out" bash "$repo/scripts/gpu-check.sh"
summary="$tmp/out/summary.txt"
fail() {
  echo "gpu_dryrun: $*"
  cat "$summary"
  exit 1
}
python3 -m py_compile "$tmp/pack/python/gpu-torch.py" || fail "gpu-torch.py does not compile"
[ -f "$tmp/pack/python/mlo/libmlo.so.0.6" ] || fail "the pack's python package has no libmlo.so.0.6"
[ -s "$tmp/out/gpu-check.tar.gz" ] || fail "no archive"
[ -s "$tmp/out/preflight.txt" ] || fail "no preflight"
grep -q "^-- bin/platform_cuda" "$tmp/out/preflight.txt" || fail "the preflight did not ldd the binaries"
grep -qx "$tmp/site/nvidia/cu13/lib/libcudart.so.13" "$tmp/out/preflight.txt" ||
  fail "the preflight did not list the wheel's libcudart"
# memcheck runs right after platform_cuda, before the deadline can cut it (D18)
m=$(grep -n "memcheck" "$summary" | head -1 | cut -d: -f1)
c=$(grep -n " contract:" "$summary" | head -1 | cut -d: -f1)
[ -n "$m" ] && [ -n "$c" ] && [ "$m" -lt "$c" ] || fail "memcheck is not reported before contract"
# what the device tool brings back: at most 8 files, each under 16 MiB
n=$(find "$tmp/out" -type f | wc -l)
[ "$n" -le 8 ] || fail "$n files in \$OUT (the device tool returns 8)"
big=$(find "$tmp/out" -type f -size +16M)
[ -z "$big" ] || fail "over 16 MiB in \$OUT: $big"
! grep -q "^FAIL" "$summary" || fail "a step failed in a dry run"
for s in platform_cuda contract example torch bench synth run run-budget run-stream run-pressure; do
  grep -q "^SKIPPED (dry run) $s:" "$summary" || fail "step $s not reported"
done
grep -q "^overall: PASS" "$summary" || fail "no overall PASS"
# the pack as it travels: under 64 MiB, no libstdc++ or libgcc_s in it
size_kib=$(du -sk "$tmp/pack" | cut -f1)
[ "$size_kib" -lt $((64 * 1024)) ] || fail "the pack is $((size_kib / 1024)) MiB"
! ls "$tmp/pack/libs" | grep -qE "libstdc\+\+|libgcc_s" || fail "libstdc++ or libgcc_s carried"

# the rehearsal
MLO_GPU_DRYRUN=2 MLO_GPU_PACK="$tmp/pack" OUT="$tmp/rehearsal" bash "$repo/scripts/gpu-check.sh" ||
  { summary="$tmp/rehearsal/summary.txt"; fail "the rehearsal did not pass"; }
summary="$tmp/rehearsal/summary.txt"
for s in contract example bench synth run run-budget run-stream run-pressure; do
  grep -q "^ok $s:" "$summary" || fail "rehearsal: step $s did not pass"
done
grep -q "^SKIPPED .* platform_cuda:" "$summary" || fail "rehearsal: platform_cuda not skipped"
grep -q "^digest under memory pressure: .*: same" "$summary" || fail "rehearsal: no digest check"
grep -q "^overall: PASS" "$summary" || fail "rehearsal: no overall PASS"
n=$(find "$tmp/rehearsal" -type f | wc -l)
[ "$n" -le 8 ] || fail "rehearsal: $n files in \$OUT"
echo "gpu_dryrun: ok, pack $((size_kib / 1024)) MiB, dry run and rehearsal"
