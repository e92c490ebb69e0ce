#!/usr/bin/env bash
# Installs the Python that mlo.torch's tests run under: torch (PyPI's build,
# which carries CUDA and runs on the CPU), diffusers, transformers and peft,
# pinned to the versions the tests were written against, in a venv of the
# project's own (.cache/torch-venv, ignored by git).  `make test` runs it
# and hands the venv's python to ctest (python_torch); MLO_TORCH=0 skips
# it, and python_torch then reports itself skipped.
#
# Measured on a 2-core CI machine from an empty pip cache: 2 min 31 s and
# 5.7 GB installed (docs/python.md).  Safe to run repeatedly: it installs
# only when the venv cannot import what the tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.cache/torch-venv
pins=python/tests/torch-requirements.txt # the versions, shared with gpu-prep.sh
if [ "${MLO_TORCH:-1}" = 0 ]; then
  exit 0
fi
# every package the pins name, so a venv made before one was added gets it
if "$venv/bin/python" -c 'import torch, diffusers, transformers, peft, accelerate, torchao, gguf' \
  2>/dev/null; then
  exit 0
fi
echo "torch-venv: installing $(grep -v '^#' "$pins" | tr '\n' ' ')into $venv (about 6 GB, a few minutes; MLO_TORCH=0 skips)"
python3 -m venv "$venv"
start=$(date +%s)
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$pins"
echo "torch-venv: installed in $(( $(date +%s) - start )) s"
