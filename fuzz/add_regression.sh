#!/usr/bin/env bash
# Turns a crash found by the safetensors fuzzer into a checked-in regression
# input (docs/reliability.md, "Fuzzing"): minimizes it when the libFuzzer
# binary is built, copies it into fuzz/corpus/ as regress-NAME.safetensors
# (fuzz_replay runs every corpus file in the default suite, and under ASan in
# make test-asan), and replays it once so you see it fail before the fix and
# pass after.
#
#   fuzz/add_regression.sh build/fuzz/crash-<sha1> header-overflow [BUILD_DIR]
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 ARTIFACT NAME [BUILD_DIR]   (NAME: a few words, [a-z0-9-])" >&2
  exit 2
fi
artifact=$1 name=$2 build=${3:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
[[ $name =~ ^[a-z0-9-]+$ ]] || { echo "$0: NAME must match [a-z0-9-]+" >&2; exit 2; }
[ -f "$artifact" ] || { echo "$0: no such file: $artifact" >&2; exit 2; }
dest=$root/fuzz/corpus/regress-$name.safetensors
[ -e "$dest" ] && { echo "$0: $dest exists; pick another NAME" >&2; exit 2; }

fuzzer=$build/fuzz/fuzz_safetensors
if [ -x "$fuzzer" ]; then
  # -minimize_crash keeps the smallest input that still fails the same way.
  tmp=$(mktemp)
  trap 'rm -f "$tmp"' EXIT
  if "$fuzzer" -minimize_crash=1 -runs=20000 -exact_artifact_path="$tmp" "$artifact" \
      >/dev/null 2>&1 && [ -s "$tmp" ]; then
    artifact=$tmp
  fi
fi
cp "$artifact" "$dest"
echo "added $dest ($(stat -c %s "$dest") bytes)"
if [ -x "$build/fuzz/fuzz_replay" ]; then
  "$build/fuzz/fuzz_replay" "$root/fuzz/corpus" && echo "replay: passes" ||
    echo "replay: fails (expected until the reader is fixed)"
fi
