#!/usr/bin/env bash
# The device check's own logic, where no GPU is (ctest gpu_check_dryrun):
# scripts/gpu-prep.sh builds and packs what travels to the device (its own
# configuration: NCCL, MPI and OpenCL off) in a temporary folder, only the
# pack's targets (MLO_GPU_TARGETS=pack; no wheels: no download), not the CI
# build, which links NCCL (review D17); the packed libmlo-cuda.so must NEED
# no libnccl, and its NCCL copy (nccl/libmlo-cuda.so, for the one-rank
# gather) must.  Then scripts/gpu-check.sh runs on that pack three times.
# MLO_GPU_DRYRUN=1 must exit 0 with its plan printed (each step in the order
# it runs, its limit, the sum: platform_cuda, memcheck, torch and run first,
# the limits and the reserves within the default deadline of 330 s), the
# preflight run, every step of the plan reported SKIPPED (dry run) with the
# plan's limit, no FAIL, its summary and archive written and $OUT within the
# device tool's limits; with a deadline the plan cannot fit
# (MLO_GPU_DEADLINE=200) it must fail, saying so.  MLO_GPU_DRYRUN=2, the rehearsal, runs every step for real on the
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
# the one-rank gather's copy of the module does link NCCL, and its program travels
readelf -d "$tmp/pack/nccl/libmlo-cuda.so" | grep -q "NEEDED.*libnccl" ||
  { echo "gpu_dryrun: the pack's nccl/libmlo-cuda.so needs no NCCL"; exit 1; }
[ -x "$tmp/pack/bin/platform_cuda_gather" ] || { echo "gpu_dryrun: no bin/platform_cuda_gather"; exit 1; }
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
[ -f "$tmp/pack/python/mlo/libmlo.so.0.7" ] || fail "the pack's python package has no libmlo.so.0.7"
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
# the plan: "plan: N NAME LIMIT s" in the order the steps run, then the sum
plan=$(sed -n 's/^plan: *\([0-9][0-9]*\) \([a-z_-]*\) *\([0-9][0-9]*\) s$/\1 \2 \3/p' "$summary")
[ -n "$plan" ] || fail "no plan printed"
steps=$(awk '{ print $2 }' <<<"$plan" | tr '\n' ' ')
for s in platform_cuda memcheck torch synth run nccl_gather contract example run-budget run-stream \
  run-pressure bench; do
  [[ " $steps" == *" $s "* ]] || fail "step $s not in the plan"
done
[[ "$steps" == "platform_cuda memcheck torch "* ]] || fail "the plan does not start with platform_cuda, memcheck, torch: $steps"
pos() { awk -v n="$1" '$2 == n { print $1 }' <<<"$plan"; }
[ "$(pos run)" -lt "$(pos contract)" ] && [ "$(pos run)" -lt "$(pos bench)" ] ||
  fail "run is not planned before contract and bench: $steps"
sum=$(awk '{ s += $3 } END { print s }' <<<"$plan")
line=$(grep "^plan: sum of the limits" "$summary") || fail "no sum printed"
read -r said pre fin total deadline < <(sed -n 's/^plan: sum of the limits \([0-9]*\) s + preflight \([0-9]*\) s + finish \([0-9]*\) s = \([0-9]*\) s, deadline \([0-9]*\) s$/\1 \2 \3 \4 \5/p' <<<"$line")
[ "${said:-}" = "$sum" ] || fail "the printed sum (${said:-none}) is not the limits' ($sum)"
[ "$total" -eq $((sum + pre + fin)) ] || fail "the printed total $total is not $sum + $pre + $fin"
[ "$deadline" -eq 330 ] || fail "the default deadline is $deadline s, not 330"
[ "$total" -le "$deadline" ] || fail "the plan needs $total s, over the deadline of $deadline s"
# every planned step reported, under the plan's limit
while read -r _ s limit; do
  if [ "$s" = memcheck ] && grep -q "^SKIPPED memcheck: compute-sanitizer not found" "$summary"; then
    continue
  fi
  grep -q "^SKIPPED (dry run) $s: .*(limit $limit s)$" "$summary" ||
    fail "step $s not reported with its limit of $limit s"
done <<<"$plan"
# and run in the plan's order
ran=$(sed -n 's/^SKIPPED (dry run) \([a-z_-]*\): .*/\1/p; s/^SKIPPED \(memcheck\): .*/\1/p' "$summary" |
  tr '\n' ' ')
[ "$ran" = "$steps" ] || fail "the steps ran in another order than the plan's: $ran"
grep -q "^  nccl_gather: bin/platform_cuda_gather" "$summary" || fail "the dry run does not say what nccl_gather runs"
grep -q "^overall: PASS" "$summary" || fail "no overall PASS"
# a deadline the plan cannot fit: the dry run fails, saying so
if MLO_GPU_DRYRUN=1 MLO_GPU_DEADLINE=200 MLO_GPU_PACK="$tmp/pack" OUT="$tmp/short" \
  bash "$repo/scripts/gpu-check.sh" >"$tmp/short.log" 2>&1; then
  summary="$tmp/short/summary.txt"
  fail "a dry run with a 200 s deadline passed"
fi
grep -q "^FAIL plan: the steps' limits need [0-9]* s, over the deadline of 200 s" "$tmp/short/summary.txt" ||
  { summary="$tmp/short/summary.txt"; fail "the short deadline's failure does not say why"; }
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
grep -q "^SKIPPED .* nccl_gather:" "$summary" || fail "rehearsal: nccl_gather not skipped"
grep -q "^digest under memory pressure: .*: same" "$summary" || fail "rehearsal: no digest check"
grep -q "^overall: PASS" "$summary" || fail "rehearsal: no overall PASS"
n=$(find "$tmp/rehearsal" -type f | wc -l)
[ "$n" -le 8 ] || fail "rehearsal: $n files in \$OUT"
echo "gpu_dryrun: ok, pack $((size_kib / 1024)) MiB, dry run ($total s of $deadline s planned), short deadline refused, rehearsal"
