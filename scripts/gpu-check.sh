#!/usr/bin/env bash
# gpu-check.sh — runs ON THE GPU MACHINE, from the repository root, on the
# pack scripts/gpu-prep.sh made here (carry build-gpu/pack).  Nothing is
# configured or built there.  One prepared command, so scarce device time
# goes to measuring.  The steps, in the order they run (the most important
# first: the deadline cuts from the end), each under the limit in seconds
# that `plan` below gives it:
#
#   0 preflight            nvidia-smi, driver and runtime versions, the CUDA
#                          libraries and NCCL found, ldd of every carried
#                          binary, where compute-sanitizer is
#   1 platform_cuda        the CUDA platform's own tests (label gpu)
#   2 memcheck             platform_cuda under compute-sanitizer memcheck with
#                          stream-ordered race tracking and leak checks
#                          (API errors not reported; the deliberate
#                          allocation failure, the unordered negative control
#                          and the driver-memory figures left out:
#                          MLO_UNDER_SANITIZER=1): the only step that sees a
#                          device-side stream-ordered race (review D18)
#   3 torch                mlo.torch on CUDA (scripts/gpu-torch.py): a tiny
#                          real diffusers pipeline on torch's default stream
#                          and on a side stream, frames against the plain
#                          pipeline's; mlo's 1 GiB load against torch's
#                          pinned copy_; then two tables, each part under
#                          its own limit: torch-bandwidth.md (pinned host
#                          to device and device to host at 1, 2, 4 GiB,
#                          median of 3) and torch-compare.md (a ~2.2 GB
#                          Wan2.2-shaped pipeline under a 1.5 GiB cap: all
#                          resident, diffusers' model CPU offload and group
#                          offload with streams, mlo.torch budget and
#                          streaming: wall per generation, peak device
#                          memory, peak host RSS, latents against all
#                          resident); both come back in $OUT and in
#                          summary.txt
#   4 synth                a ~3.5 GB Wan2.2-shaped checkpoint at full depth,
#                          and its mlo inspect
#   5 run                  mlo run --verify on it under --device-memory
#                          (strict)
#   6 nccl_gather          one NCCL rank's all-gather through the CUDA
#                          platform (platform_cuda_gather with the pack's
#                          NCCL copy of the module, pack/nccl/), on the
#                          libnccl.so.2 found here: torch's wheel
#                          (nvidia/nccl/lib), else the toolkit's; SKIPPED
#                          (77) when there is none (the pack carries none)
#   7 contract             C1-C17 with MLO_TEST_PLATFORM=cuda:0
#   8 example              the example, strict and budget, on cuda:0
#   9 run-budget           the run of 5 under the budget policy, room to
#                          prefetch
#  10 run-stream           a budget of 60% of a DiT: its blocks stream and
#                          every switch of the prompt joins, with compute
#                          asynchronous to the copies as nowhere else
#  11 run-pressure         the run while another process holds all of the
#                          device but what the run needs: same digest as 5
#  12 bench                mlo bench --platform cuda:0 --json --quick
#
# Every step has a time limit and the whole a deadline (MLO_GPU_DEADLINE,
# default 330 s: six minutes of device time less the machine's start), and
# the limits, with the preflight's and the finish's reserves, fit in the
# deadline: the plan is printed first (each step, its limit, the sum), and
# a dry run whose limits do not fit fails.  A
# step FAILs only for a real defect: one that cannot run here (exit 77: no
# device seen, a dependency missing, compute-sanitizer's "Device not
# supported") is SKIPPED with its reason, and one the deadline cut short is
# NOT RUN (the verdict is then INCOMPLETE, exit 2, unless something failed).
# nvidia-smi's memory is sampled throughout.  Work files live outside $OUT
# (the device tool returns at most 8 files of 16 MiB): $OUT gets
# summary.txt, preflight.txt and gpu-check.tar.gz (every log, each capped
# at 1 MiB), whatever happens, and the torch step's two tables when it
# wrote them.
#
# The pack's libraries go on the library path of mlo's own programs only,
# never on python3's (torch brings its own libstdc++ and BLAS).
#
# MLO_GPU_DRYRUN=1 runs the script's own logic on a machine without a GPU:
# the plan is printed and checked, the preflight runs, every step is
# reported SKIPPED (dry run) with its command and limit, and the exit
# status is 0 when the pack is complete and the plan fits the deadline.
# MLO_GPU_DRYRUN=2 is a rehearsal there: every step runs for real on libmlo's
# host platform instead of cuda:0 (a tiny pipeline, bench --quick, a holder
# that holds nothing, gpu-torch.py --rehearse-cpu: its side-by-side on the
# CPU, the rows that need CUDA marked so), so the steps' own commands,
# variables and verdicts are exercised; the ones that need a GPU report
# themselves SKIPPED.  CI
# runs both (tests/scripts/gpu_dryrun.sh).
#
# Exit status: 0 when every step passed or was skipped; 1 when one failed;
# 2 when none failed but the deadline left some not run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
pack=${MLO_GPU_PACK:-build-gpu/pack}
pack=$(cd "$pack" 2>/dev/null && pwd || echo "$pack")
result=${OUT:-gpu-check-out}
dry=${MLO_GPU_DRYRUN:-0}
plat=cuda:0 # the device the steps use; the rehearsal's is the host platform
if [ "$dry" = 2 ]; then
  plat=host
  MLO_GPU_SCALE=${MLO_GPU_SCALE:-0.0005}
fi
deadline_s=${MLO_GPU_DEADLINE:-330}
deadline=$((SECONDS + deadline_s))
scale=${MLO_GPU_SCALE:-0.05} # ~3.5 GB of bf16 weights
mkdir -p "$result"
result=$(cd "$result" && pwd)
out=$(mktemp -d "${TMPDIR:-/tmp}/mlo-gpu-check.XXXXXX") # the work folder
mkdir -p "$out/logs"
summary="$out/summary.txt"
: >"$summary"
status=0
incomplete=0
smi=
holder_pid_file="$out/holder.pid"
say() { echo "$*" | tee -a "$summary"; }

finish() {
  [ -n "$smi" ] && kill "$smi" 2>/dev/null
  [ -f "$holder_pid_file" ] && kill "$(cat "$holder_pid_file")" 2>/dev/null
  rm -f "$holder_pid_file"
  local verdict=PASS
  [ $incomplete -eq 1 ] && verdict=INCOMPLETE
  [ $status -ne 0 ] && verdict=FAIL
  say "overall: $verdict in $SECONDS s$([ "$dry" = 1 ] && echo ' (dry run)')$([ "$dry" = 2 ] && echo ' (rehearsal on the host platform)')"
  # what comes back: three files, every log capped at 1 MiB in the archive
  mkdir -p "$out/archive"
  for f in "$out"/*.txt "$out"/*.json "$out"/*.csv "$out"/*.md "$out"/*.log "$out"/logs/*.log; do
    [ -f "$f" ] && tail -c 1048576 "$f" >"$out/archive/$(basename "$f")"
  done
  tar czf "$result/gpu-check.tar.gz" -C "$out/archive" . 2>/dev/null
  cp "$summary" "$result/summary.txt"
  [ -f "$out/preflight.txt" ] && cp "$out/preflight.txt" "$result/preflight.txt"
  for f in "$out"/torch-bandwidth.md "$out"/torch-compare.md; do
    [ -f "$f" ] && cp "$f" "$result/"
  done
  rm -rf "$out"
  [ $status -ne 0 ] && exit 1
  [ $incomplete -eq 1 ] && exit 2
  exit 0
}
trap finish EXIT

# The plan: every step in the order it runs and its limit in seconds.  The
# limits, the preflight's reserve (its own timeouts: nvidia-smi, nvcc,
# torch's import, the wheels' folders) and the finish's (the last kill's
# grace, the archive) fit in the deadline; a step not listed here fails.
plan="platform_cuda 20
memcheck 40
torch 115
synth 20
run 15
nccl_gather 10
contract 20
example 8
run-budget 15
run-stream 15
run-pressure 15
bench 8"
preflight_s=20
finish_s=8
limit_of() { awk -v n="$1" '$1 == n { print $2; found = 1 } END { exit !found }' <<<"$plan"; }
plan_sum=$(awk '{ s += $2 } END { print s }' <<<"$plan")
plan_total=$((plan_sum + preflight_s + finish_s))
say "plan: $(wc -l <<<"$plan") steps in this order, each under its limit:"
awk '{ printf "plan: %2d %-14s %4d s\n", NR, $1, $2 }' <<<"$plan" | tee -a "$summary"
say "plan: sum of the limits $plan_sum s + preflight $preflight_s s + finish $finish_s s = $plan_total s, deadline $deadline_s s"
if [ "$plan_total" -gt "$deadline_s" ]; then
  if [ "$dry" = 1 ]; then
    say "FAIL plan: the steps' limits need $plan_total s, over the deadline of $deadline_s s"
    status=1
    exit 1
  fi
  say "plan: over the deadline by $((plan_total - deadline_s)) s: the last steps may be NOT RUN"
fi

if [ ! -x "$pack/bin/mlo" ]; then
  say "FAIL: no pack at $pack (run scripts/gpu-prep.sh where the project builds, carry $pack)"
  status=1
  exit 1
fi
export out bin holder_pid_file plat dry
bin="$pack/bin"
# the pack's libraries, the large ones unpacked from xz (gpu-prep.sh)
libs="$out/libs"
rm -rf "$libs"
mkdir -p "$libs"
for lib in "$pack"/libs/*; do
  case $lib in
  *.xz)
    dst="$libs/$(basename "$lib" .xz)"
    xz -dc "$lib" >"$dst" 2>/dev/null ||
      python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        "$lib" "$dst" || { say "FAIL: cannot unpack $lib (no xz, no python3 lzma)"; status=1; }
    ;;
  *) cp "$lib" "$libs/" ;;
  esac
done
# The CUDA runtime and cuBLAS the modules NEED (libcudart, libcublas,
# libcublasLt): the toolkit's, then those of pip wheels in the python's
# site-packages (nvidia/<name>/lib: nvidia/cu13/lib, nvidia/cuda_runtime/lib,
# nvidia/cublas/lib), where an image has no toolkit of its own.
wheel_libs=$(timeout 10 python3 -c 'import glob, os, nvidia
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))' \
  2>/dev/null || true)
libpath="$libs:/usr/local/cuda/lib64:/usr/local/cuda/lib${wheel_libs:+:$wheel_libs}"
# NCCL, for the one-rank gather alone (step nccl_gather): the pack carries
# none, so the libnccl.so.2 of torch's wheel (nvidia/nccl/lib: the one the
# device's torch runs with), else the toolkit's; none: the step skips.
nccl_dir=
for d in ${wheel_libs//:/ } /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [ -e "$d/libnccl.so.2" ] && nccl_dir=$d && break
done
# mlo's programs: the pack's libraries, its modules (the CUDA platform and
# the workload's cuBLAS back-end: docs/modules.md)
mlo_env=(env "LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  "MLO_MODULE_PATH=$pack/modules" "MLO_LOG=${MLO_LOG:-warn}")
# libmlo opens a module only from a file and folder owned by root or by the
# process's user and writable by no one else (docs/modules.md).  A pack
# copied onto the device may arrive owned by another uid or group-writable:
# it is this check's own copy, so it is made ours before any step opens it.
for d in "$pack/modules" "$pack/nccl"; do
  [ -d "$d" ] || continue
  chown -R "$(id -u)" "$d" 2>/dev/null || true
  chmod -R go-w "$d" 2>/dev/null || true
done
say "pack: $(head -1 "$pack/MANIFEST" 2>/dev/null)"

# step NAME COMMAND... : runs it under the plan's limit, logs to logs/NAME.log
step() {
  local name=$1 limit
  shift
  if ! limit=$(limit_of "$name"); then
    say "FAIL $name: not in the plan (a step without a limit)"
    status=1
    return 1
  fi
  if [ "$dry" = 1 ]; then
    local cmd="" a
    for a in "$@"; do # the program and its arguments, not the environment
      case $a in
      *declare*) cmd+="${a##*; } " ;; # bash -c "$(declare -p mlo_env); FUNCTION"
      env | *=*) ;;
      *) cmd+="${a##*/} " ;;
      esac
    done
    say "SKIPPED (dry run) $name: ${cmd:0:110} (limit $limit s)"
    printf '%q ' "$@" >"$out/logs/$name.log"
    return 0
  fi
  local left=$((deadline - SECONDS - finish_s)) # the kill grace and finish() fit
  if [ "$left" -lt 10 ]; then
    say "NOT RUN $name: the deadline was reached"
    incomplete=1
    return 1
  fi
  local cut=0
  [ "$limit" -gt "$left" ] && limit=$left && cut=1
  local t0=$SECONDS
  timeout -k 3 "$limit" "$@" >"$out/logs/$name.log" 2>&1
  local rc=$?
  local verdict=ok
  case $rc in
  0) ;;
  77) verdict="SKIPPED ($(grep -i 'skipped' "$out/logs/$name.log" | tail -1 | cut -c1-160))" ;;
  124 | 137)
    if [ $cut -eq 1 ]; then
      verdict="NOT RUN (cut at $limit s by the deadline)"
      incomplete=1
    else
      verdict="FAIL (timed out after $limit s)"
    fi
    ;;
  *) verdict="FAIL (exit $rc)" ;;
  esac
  say "$verdict $name: $((SECONDS - t0)) s"
  case $rc in 0 | 77) ;; 124 | 137) [ $cut -eq 1 ] || status=1 ;; *) status=1 ;; esac
  return $rc
}

# --- 0: preflight (a few seconds; what the rest depends on) ----------------
{
  echo "== nvidia-smi"
  timeout 5 nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
  echo "driver: $(timeout 5 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "runtime (nvcc): $(timeout 5 /usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1)"
  echo "torch: $(timeout 15 python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1)"
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  echo "compute-sanitizer: ${sanitizer:-not found}"
  echo "== CUDA libraries on the path (the toolkit's, then the wheels')"
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib ${wheel_libs//:/ }; do
    ls -1 "$d"/libcudart.so* "$d"/libcublas.so* "$d"/libcublasLt.so* 2>/dev/null
  done
  echo "== NCCL for nccl_gather (torch's wheel, then the toolkit's)"
  if [ -n "$nccl_dir" ]; then
    echo "nccl: $(readlink -f "$nccl_dir/libnccl.so.2")"
  else
    echo "nccl: none found, nccl_gather skips"
  fi
  echo "== ldd of every carried binary (the pack's libraries first)"
  for b in "$bin"/* "$pack"/modules/*; do
    [ -f "$b" ] || continue
    echo "-- ${b#$pack/}"
    "${mlo_env[@]}" ldd "$b" 2>&1 | sed 's/ (0x[0-9a-f]*)//'
  done
  # the NCCL copy of the module, with the NCCL found (none: nothing to see)
  if [ -n "$nccl_dir" ] && [ -f "$pack/nccl/libmlo-cuda.so" ]; then
    echo "-- nccl/libmlo-cuda.so"
    env "LD_LIBRARY_PATH=$libpath:$nccl_dir" ldd "$pack/nccl/libmlo-cuda.so" 2>&1 |
      sed 's/ (0x[0-9a-f]*)//'
  fi
} >"$out/preflight.txt" 2>&1
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
missing_libs=$(grep "=> not found" "$out/preflight.txt" | sort -u | head -5)
say "preflight: $(grep -m1 '^GPU' "$out/preflight.txt" || echo 'no GPU listed'); $(grep -m1 '^driver' "$out/preflight.txt"); compute-sanitizer: ${sanitizer:-not found}; $(grep -m1 '^nccl:' "$out/preflight.txt")"
if [ -n "$missing_libs" ]; then
  say "FAIL preflight: a carried binary has unresolved libraries: $(echo "$missing_libs" | tr '\n' ' ')"
  status=1
fi
if [ ! -f "$pack/nccl/libmlo-cuda.so" ] || [ ! -x "$bin/platform_cuda_gather" ]; then
  say "FAIL preflight: the pack has no nccl/libmlo-cuda.so or no bin/platform_cuda_gather (gpu-prep.sh)"
  status=1
fi
say "preflight: done at $SECONDS s (its reserve: $preflight_s s)"
[ "$SECONDS" -gt "$preflight_s" ] &&
  say "preflight: over its reserve by $((SECONDS - preflight_s)) s: the last steps may be NOT RUN"

if [ "$dry" = 0 ]; then
  nvidia-smi >"$out/nvidia-smi.txt" 2>&1
  nvidia-smi --query-gpu=timestamp,memory.used,memory.total,utilization.gpu --format=csv \
    -lms 500 >"$out/nvidia-smi-memory.csv" 2>/dev/null &
  smi=$!
fi

# The torch step's wheels install while platform_cuda and memcheck run (no
# network there), under a limit that those two steps' limits cover.
pylib=
wheels_pid=
if ls "$pack"/wheels/*.whl >/dev/null 2>&1 && [ "$dry" != 1 ]; then
  pylib="$out/pylib"
  (timeout 45 python3 -m pip install --quiet --no-index --no-deps --no-compile \
    --no-cache-dir --target "$pylib" "$pack"/wheels/*.whl >"$out/logs/wheels.log" 2>&1 ||
    echo "the carried wheels did not install" >>"$out/logs/wheels.log") &
  wheels_pid=$!
fi

# --- 1: the platform's own tests --------------------------------------------
step platform_cuda "${mlo_env[@]}" "$bin/platform_cuda"
# --- 2: memcheck, right after the platform's tests: the only step that sees
# a device-side stream-ordered race, so the deadline must not cut it (D18) --
memcheck() {
  local raw="$out/memcheck-raw.log"
  "${mlo_env[@]}" MLO_UNDER_SANITIZER=1 "$sanitizer" --tool memcheck --report-api-errors no \
    --track-stream-ordered-races all --leak-check full --error-exitcode 3 "$bin/platform_cuda" \
    >"$raw" 2>&1
  local rc=$?
  cat "$raw"
  if [ $rc -ne 0 ] && grep -q "Device not supported" "$raw"; then
    echo "skipped: compute-sanitizer says Device not supported on this machine"
    return 77
  fi
  return $rc
}
if [ -n "$sanitizer" ]; then
  export -f memcheck
  export sanitizer bin out
  step memcheck bash -c "$(declare -p mlo_env); memcheck"
else
  say "SKIPPED memcheck: compute-sanitizer not found (PATH, /usr/local/cuda/bin) (limit $(limit_of memcheck) s)"
fi

# --- 3: mlo.torch on CUDA (python3 with torch; the pack's libraries are not
# on its path: gpu-torch.py loads libcjson from the pack by name) -----------
# Its own deadline (MLO_GPU_TORCH_S) sits 10 s under the step's limit, so
# the tables are written even when a part runs out of time.
[ -n "${wheels_pid:-}" ] && wait "$wheels_pid"
torch_rehearse=
[ "$dry" = 2 ] && torch_rehearse=--rehearse-cpu
step torch env "PYTHONPATH=$pack/python${pylib:+:$pylib}" "MLO_PACK_LIBS=$libs" \
  "MLO_MODULE_PATH=$pack/modules" "MLO_LIBRARY=$pack/python/mlo" PYTHONUNBUFFERED=1 \
  "MLO_GPU_TORCH_S=$(($(limit_of torch) - 10))" MLO_LOG=warn python3 "$pack/python/gpu-torch.py" \
  --out "$out" $torch_rehearse
if [ "$dry" = 1 ]; then
  say "  torch fills torch-bandwidth.md: host to device, device to host x 1, 2, 4 GiB (GB/s, median of 3)"
  say "  and torch-compare.md: all resident | model_cpu_offload | group_offload | mlo budget | mlo streaming"
  say "  x wall per generation, peak device memory, peak host RSS, latents vs all resident"
fi
for f in "$out"/torch-bandwidth.md "$out"/torch-compare.md; do
  [ -f "$f" ] && { echo; cat "$f"; } >>"$summary"
done

# --- 4, 5: the checkpoint and the strict run --------------------------------
ckpt="$out/wan" # in the work folder: removed with it
# at full depth (40 blocks a DiT, as the real model): what streams and joins
# below is what a real Wan2.2 does, and the rehearsal's tiny scale still
# streams; its inspect runs inside the step's limit
synth_checkpoint() {
  "${mlo_env[@]}" "$bin/mlo" synth wan2.2-t2v "$ckpt" --scale "$scale" --full-depth &&
    "${mlo_env[@]}" "$bin/mlo" inspect "$ckpt" --json >"$out/inspect.json"
}
export -f synth_checkpoint
export ckpt scale
step synth bash -c "$(declare -p mlo_env); synth_checkpoint"
if [ "$dry" = 1 ]; then
  need=1
  stream=1
else
  # the strict run's device (9/8 of its need) and the budget run's (room to
  # prefetch the next component), 64 MiB over each; 60% of a DiT to stream
  read -r need ahead stream < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
dit = max(c["device_bytes"] for c in d["components"] if c["role"] == "dit")
print(d["model_offload_bytes"] * 9 // 8 + (64 << 20), d["budget_policy"]["prefetch_bytes"] + (64 << 20), dit * 6 // 10)' \
    "$out/inspect.json" 2>/dev/null || echo 0 0 0)
  need=${need:-0}
fi
ran=0
if [ "$need" -gt 0 ] && [ "${ahead:-1}" -gt 0 ]; then
  ran=1
  step run "${mlo_env[@]}" "$bin/mlo" run "$ckpt" --platform "$plat" --device-memory "$need" \
    --steps 8 --prompts 2 --verify --json --trace "$out/trace.json"
  cp "$out/logs/run.log" "$out/run.json" 2>/dev/null
elif [ ! -s "$out/inspect.json" ] && [ "$incomplete" = 1 ]; then
  say "NOT RUN run, run-budget, run-stream, run-pressure: no checkpoint (the deadline cut synth)"
else
  say "FAIL run: the pipeline's size could not be read (mlo inspect)"
  status=1
fi

# --- 6: one NCCL rank's all-gather through the CUDA platform ----------------
# platform_cuda_gather with the pack's NCCL copy of the module (pack/nccl/),
# on the NCCL found above; none: skipped (77), with the reason.
nccl_gather() {
  if [ -z "$nccl_dir" ]; then
    echo "skipped: no libnccl.so.2 here (torch's nvidia/nccl/lib, /usr/local/cuda/lib64); the pack carries none"
    return 77
  fi
  env "LD_LIBRARY_PATH=$libpath:$nccl_dir" "MLO_MODULE_PATH=$pack/nccl" "MLO_LOG=${MLO_LOG:-warn}" \
    "$bin/platform_cuda_gather"
}
export -f nccl_gather
export nccl_dir libpath pack
step nccl_gather bash -c nccl_gather
[ "$dry" = 1 ] &&
  say "  nccl_gather: bin/platform_cuda_gather with nccl/libmlo-cuda.so; $(grep -m1 '^nccl:' "$out/preflight.txt")"

# --- 7, 8: the contract and the example -------------------------------------
contract() { # every contract program on $plat; none found is a failure
  local n=0 failed=0
  for t in "$bin"/C[0-9]*_*; do
    [ -x "$t" ] || continue
    n=$((n + 1))
    "${mlo_env[@]}" MLO_TEST_PLATFORM=$plat timeout -k 5 60 "$t" ||
      { echo "FAILED: $(basename "$t") ($?)"; failed=1; }
  done
  echo "$n contract programs"
  [ "$n" -gt 0 ] && [ "$failed" -eq 0 ]
}
export -f contract
export bin
step contract bash -c "$(declare -p mlo_env); contract"
step example "${mlo_env[@]}" bash -c "'$bin/wan22_offload' $plat 8 && '$bin/wan22_offload' $plat 8 budget"

# --- 9, 10, 11: the run again: budget, streaming, under pressure ------------
if [ "$ran" = 1 ]; then
  step run-budget "${mlo_env[@]}" "$bin/mlo" run "$ckpt" --platform "$plat" \
    --device-memory "${ahead:-1}" --policy budget --steps 8 --prompts 3 --verify --json
  cp "$out/logs/run-budget.log" "$out/run-budget.json" 2>/dev/null
  step run-stream "${mlo_env[@]}" "$bin/mlo" run "$ckpt" --platform "$plat" \
    --device-memory "${ahead:-1}" --policy budget --budget "${stream:-1}" --steps 8 --prompts 3 \
    --verify --json
  cp "$out/logs/run-stream.log" "$out/run-stream.json" 2>/dev/null

  # Another process takes every byte but the run's need and a margin for
  # mlo's own CUDA context and cuBLAS workspace (1 GiB); the run starts only
  # once it says it holds them, and it never outlives this step.
  pressure() {
    python3 - "$need" "$dry" >"$out/holder.log" 2>&1 <<'EOF' &
import sys, time
if sys.argv[2] == "2":  # the rehearsal: a holder that holds nothing
    print("holding nothing (rehearsal on the host platform)", flush=True)
    time.sleep(600)
import torch
need = int(sys.argv[1])
free, total = torch.cuda.mem_get_info()
hold = max(0, free - need - (1 << 30))
block = torch.empty(hold, dtype=torch.uint8, device="cuda")
print(f"holding {hold / 2**30:.2f} GiB of {total / 2**30:.2f} GiB", flush=True)
time.sleep(600)
EOF
    local holder=$!
    echo "$holder" >"$holder_pid_file"
    for _ in $(seq 60); do
      grep -q holding "$out/holder.log" 2>/dev/null && break
      kill -0 "$holder" 2>/dev/null || break
      sleep 0.5
    done
    if ! grep -q holding "$out/holder.log" 2>/dev/null; then
      echo "the holder never said it held the memory:"
      cat "$out/holder.log"
      kill "$holder" 2>/dev/null
      return 1
    fi
    cat "$out/holder.log"
    # no --verify: its all-resident reference cannot fit beside the holder;
    # the digest is compared with the verified run above instead
    "${mlo_env[@]}" "$bin/mlo" run "$ckpt" --platform "$plat" --steps 8 --json
    local rc=$?
    kill "$holder" 2>/dev/null
    wait "$holder" 2>/dev/null
    rm -f "$holder_pid_file"
    return $rc
  }
  export -f pressure
  export need ckpt holder_pid_file
  step run-pressure bash -c "$(declare -p mlo_env); pressure"
  if [ "$dry" != 1 ] && [ -s "$out/logs/run-pressure.log" ]; then
    python3 - "$out/logs/run.log" "$out/logs/run-pressure.log" >>"$summary" 2>&1 <<'EOF' || status=1
import json, sys
def digest(path):
    text = open(path).read()  # the report's JSON, perhaps with log lines around it
    return json.JSONDecoder().raw_decode(text[text.index("{"):])[0]["digest"]
a, b = digest(sys.argv[1]), digest(sys.argv[2])
print(f"digest under memory pressure: {b} vs {a}: {'same' if a == b else 'DIFFERENT'}")
sys.exit(0 if a == b else 1)
EOF
  fi
fi

# --- 12: the tool's bench, --quick: its full ratios take a minute that the
# six do not have; the card's bandwidth is torch-bandwidth.md's -------------
step bench "${mlo_env[@]}" "$bin/mlo" bench --platform "$plat" --json --quick
cp "$out/logs/bench.log" "$out/bench.json" 2>/dev/null

exit $status
