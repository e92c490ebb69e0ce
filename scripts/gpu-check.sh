#!/usr/bin/env bash
# gpu-check.sh — runs ON THE GPU MACHINE, from the repository root, on the
# pack scripts/gpu-prep.sh made here (carry build-gpu/pack).  Nothing is
# configured or built there.  One prepared command, so scarce device time
# goes to measuring:
#
#   1 platform_cuda        the CUDA platform's own tests (label gpu)
#   2 memcheck             the same under compute-sanitizer memcheck with
#                          stream-ordered race tracking and leak checks
#   3 contract             C1-C17 with MLO_TEST_PLATFORM=cuda:0
#   4 example              the example, strict and budget, on cuda:0
#   5 torch-bandwidth      an independent pinned host-to-device copy rate
#                          through PyTorch, the baseline for 6
#   6 bench                mlo bench --platform cuda:0 --json
#   7 run                  mlo run --verify on a multi-GiB Wan2.2-shaped
#                          pipeline under --device-memory (strict, then budget)
#   8 run-pressure         the same run while another process holds all of
#                          the device but what the run needs: same digest
#
# Every step has a time limit and the whole an overall deadline (default
# 540 s); a step that is skipped (exit 77), runs out of time or finds no
# tests is a failure.  nvidia-smi's memory is sampled throughout.  Logs,
# summary.txt and everything else end up in $OUT/gpu-check.tar.gz.
# Exit status: 0 only if every step passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
pack=${MLO_GPU_PACK:-build-gpu/pack}
out=${OUT:-gpu-check-out}
deadline=$((SECONDS + ${MLO_GPU_DEADLINE:-540}))
scale=${MLO_GPU_SCALE:-0.05} # ~3.5 GB of bf16 weights
mkdir -p "$out/logs"
summary="$out/summary.txt"
: >"$summary"
status=0
say() { echo "$*" | tee -a "$summary"; }

if [ ! -x "$pack/bin/mlo" ]; then
  say "FAIL: no pack at $pack (run scripts/gpu-prep.sh where the project builds, carry $pack)"
  exit 1
fi
export LD_LIBRARY_PATH="$PWD/$pack/libs:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
# the CUDA platform and the workload's cuBLAS back-end are modules
export MLO_MODULE_PATH="$PWD/$pack/modules"
export MLO_LOG=${MLO_LOG:-warn}
bin="$PWD/$pack/bin"
say "pack: $(head -1 "$pack/MANIFEST" 2>/dev/null)"

# step NAME LIMIT_S COMMAND... : runs it with a timeout, logs to logs/NAME.log
# (a shell function runs as `bash -c NAME` after export -f: timeout runs
# programs only)
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((deadline - SECONDS))
  if [ "$left" -lt 10 ]; then
    say "FAIL $name: not run, the deadline was reached"
    status=1
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" >"$out/logs/$name.log" 2>&1
  local rc=$?
  local verdict=ok
  case $rc in
  0) ;;
  77) verdict="FAIL (skipped: exit 77 — no device seen?)" ;;
  124 | 137) verdict="FAIL (timed out after $limit s)" ;;
  *) verdict="FAIL (exit $rc)" ;;
  esac
  say "$verdict $name: $((SECONDS - t0)) s"
  [ "$rc" -ne 0 ] && status=1
  return $rc
}

nvidia-smi >"$out/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=timestamp,memory.used,memory.total,utilization.gpu --format=csv \
  -lms 500 >"$out/nvidia-smi-memory.csv" 2>/dev/null &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT

step platform_cuda 120 "$bin/platform_cuda"
if command -v compute-sanitizer >/dev/null; then
  step memcheck 240 compute-sanitizer --tool memcheck --track-stream-ordered-races all \
    --leak-check full --error-exitcode 3 "$bin/platform_cuda"
else
  say "FAIL memcheck: compute-sanitizer not found"
  status=1
fi

contract() { # every contract program on cuda:0; none found is a failure
  local n=0 failed=0
  for t in "$bin"/C[0-9]*_*; do
    [ -x "$t" ] || continue
    n=$((n + 1))
    MLO_TEST_PLATFORM=cuda:0 timeout -k 5 60 "$t" || { echo "FAILED: $(basename "$t") ($?)"; failed=1; }
  done
  echo "$n contract programs"
  [ "$n" -gt 0 ] && [ "$failed" -eq 0 ]
}
export -f contract
export bin
step contract 180 bash -c contract

step example 60 bash -c "'$bin/wan22_offload' cuda:0 8 && '$bin/wan22_offload' cuda:0 8 budget"

step torch-bandwidth 60 python3 - <<'EOF'
import time, torch
n = 1 << 30
src = torch.empty(n, dtype=torch.uint8).pin_memory()
dst = torch.empty(n, dtype=torch.uint8, device="cuda")
for _ in range(2):
    dst.copy_(src, non_blocking=True)
torch.cuda.synchronize()
times = []
for _ in range(5):
    t0 = time.perf_counter()
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
times.sort()
print(f"pinned h2d, 1 GiB, median of 5: {n / times[2] / 1e9:.2f} GB/s")
EOF

step bench 150 "$bin/mlo" bench --platform cuda:0 --json
cp "$out/logs/bench.log" "$out/bench.json" 2>/dev/null

ckpt=${TMPDIR:-/tmp}/mlo-gpu-wan
step synth 90 "$bin/mlo" synth wan2.2-t2v "$ckpt" --scale "$scale"
need=$("$bin/mlo" inspect "$ckpt" --json 2>/dev/null | python3 -c \
  'import json,sys; d=json.load(sys.stdin); print(d["model_offload_bytes"] * 9 // 8 + (64 << 20))' \
  2>/dev/null || echo 0)
ahead=$("$bin/mlo" inspect "$ckpt" --json 2>/dev/null | python3 -c \
  'import json,sys; d=json.load(sys.stdin); print(d["budget_policy"]["prefetch_bytes"] + (64 << 20))' \
  2>/dev/null || echo 0)
if [ "$need" -gt 0 ]; then
  step run 120 "$bin/mlo" run "$ckpt" --platform cuda:0 --device-memory "$need" --steps 8 \
    --prompts 2 --verify --json --trace "$out/trace.json"
  cp "$out/logs/run.log" "$out/run.json" 2>/dev/null
  step run-budget 120 "$bin/mlo" run "$ckpt" --platform cuda:0 --device-memory "$ahead" \
    --policy budget --steps 8 --prompts 3 --verify --json
  cp "$out/logs/run-budget.log" "$out/run-budget.json" 2>/dev/null

  # Another process takes every byte but the run's need (and a margin).
  pressure() {
    python3 - "$need" <<'EOF' &
import sys, time, torch
need = int(sys.argv[1])
free, total = torch.cuda.mem_get_info()
hold = max(0, free - need - (256 << 20))
block = torch.empty(hold, dtype=torch.uint8, device="cuda")
print(f"holding {hold / 2**30:.2f} GiB of {total / 2**30:.2f} GiB", flush=True)
time.sleep(600)
EOF
    local holder=$!
    sleep 8
    # no --verify: its all-resident reference cannot fit beside the holder;
    # the digest is compared with the verified run above instead
    "$bin/mlo" run "$ckpt" --platform cuda:0 --steps 8 --json
    local rc=$?
    kill "$holder" 2>/dev/null
    return $rc
  }
  export -f pressure
  export need ckpt
  step run-pressure 120 bash -c pressure
  python3 - "$out/logs/run.log" "$out/logs/run-pressure.log" >>"$summary" 2>&1 <<'EOF' || status=1
import json, sys
def digest(path):
    text = open(path).read()
    return json.loads(text[text.index("{"):])["digest"]
a, b = digest(sys.argv[1]), digest(sys.argv[2])
print(f"digest under memory pressure: {b} vs {a}: {'same' if a == b else 'DIFFERENT'}")
sys.exit(0 if a == b else 1)
EOF
else
  say "FAIL run: the pipeline's size could not be read"
  status=1
fi

kill $smi 2>/dev/null
say "overall: $([ $status -eq 0 ] && echo PASS || echo FAIL) in $SECONDS s"
tar czf "$out/gpu-check.tar.gz" -C "$out" --exclude gpu-check.tar.gz . 2>/dev/null
exit $status
