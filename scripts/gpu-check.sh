#!/usr/bin/env bash
# The device check for a session that is lent a GPU machine (issue 5): one
# prepared script, so the scarce device time goes to measuring, not typing.
#   build with CUDA -> ctest -L gpu -> mlo bench --platform cuda --json
#   -> mlo run --verify on a multi-GiB Wan2.2-shaped pipeline with
#      --device-memory below its total
# Logs go to $OUT (or ./gpu-check-out).  Exit status: the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
scale=${MLO_GPU_SCALE:-0.05} # ~3.5 GB of bf16 weights
status=0
step() { # name, command...
  local name=$1; shift
  echo "== $name: $*" | tee -a "$out/summary.txt"
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "   exit $rc after $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
  [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
  return $rc
}
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
step configure cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMLO_WITH_OPENCL=OFF
step build cmake --build build-gpu -j "$(nproc)"
step ctest-gpu ctest --test-dir build-gpu -L gpu --output-on-failure
step bench build-gpu/tools/mlo/mlo bench --platform cuda:0 --json
cp "$out/bench.log" "$out/bench.json" 2>/dev/null
ckpt=${TMPDIR:-/tmp}/mlo-gpu-wan
step synth build-gpu/tools/mlo/mlo synth wan2.2-t2v "$ckpt" --scale "$scale"
need=$(build-gpu/tools/mlo/mlo inspect "$ckpt" --json | python3 -c \
  'import json,sys; d=json.load(sys.stdin); print(d["model_offload_bytes"] * 9 // 8)')
step run build-gpu/tools/mlo/mlo run "$ckpt" --platform cuda:0 --device-memory "$need" \
  --steps 8 --verify --json --trace "$out/trace.json"
step run-literal build-gpu/tools/mlo/mlo run "$ckpt" --platform cuda:0 --device-memory "$need" \
  --steps 8 --literal --json
cat "$out/summary.txt"
exit $status
