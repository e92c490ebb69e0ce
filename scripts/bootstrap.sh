#!/usr/bin/env bash
# Installs what mlo needs on a fresh Debian machine: the Debian packages the
# build and tests use, and the PyPI tools the tests cross-check against.
# Safe to run repeatedly: it installs only what is missing.  As non-root it
# only reports what is missing.
set -euo pipefail

debs=(cmake make gcc g++ pkg-config libcjson-dev libcmocka-dev libopenblas-dev
      ocl-icd-opencl-dev opencl-headers pocl-opencl-icd libclblast-dev clang
      libclang-rt-dev libopenmpi-dev openmpi-bin
      librsvg2-bin)  # rsvg-convert: the timeline test renders the SVG to PNG
# Python is needed by the tests only.  One that is already on PATH (pyenv,
# for example) counts: Debian's is installed only where there is none, and
# its pip only where that python has no pip.
command -v python3 >/dev/null || debs+=(python3 python3-pip)
command -v python3 >/dev/null && ! python3 -m pip --version >/dev/null 2>&1 && debs+=(python3-pip)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: missing Debian packages (run as root to install): ${missing[*]}" >&2
    exit 1
  fi
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Test-time cross-check tools from PyPI (never used by the library itself).
if ! python3 -c 'import safetensors, numpy, gguf' 2>/dev/null; then
  echo "bootstrap: installing safetensors, gguf and numpy from PyPI (tests only)"
  python3 -m pip install --quiet --disable-pip-version-check safetensors gguf numpy ||
    python3 -m pip install --quiet --break-system-packages safetensors gguf numpy
fi
