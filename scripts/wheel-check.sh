#!/usr/bin/env bash
# The Python package as a user installs it: `pip install ./python` into a
# fresh venv (scikit-build-core builds libmlo from this checkout into the
# package), then, from a folder outside the repository and with
# MLO_LIBRARY unset, the installed package finds its own libmlo and its
# modules and runs a pipeline on the host platform.  Everything is written
# under a temporary folder this script makes and removes.  Needs PyPI (the
# build backend) and what the C library needs to build.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="${1:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install --quiet --disable-pip-version-check "$repo/python" \
  > "$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; exit 1; }
cd "$tmp"
env -u MLO_LIBRARY -u MLO_MODULE_PATH "$tmp/venv/bin/python" - <<'PY'
import ctypes, os, sys
import mlo
lib = mlo.lib()._name
site = os.path.dirname(mlo.__file__)
assert lib == os.path.join(site, "libmlo.so.0.7"), "libmlo came from %s, not the package" % lib
assert os.path.isdir(os.path.join(site, "mlo")), "the modules' folder is not in the package"
# mlo.torch is a package of its own (torch is not in this venv: its files, not an import)
for name in ("__init__", "_api", "_backend", "_hooks", "_pretrained"):
    assert os.path.isfile(os.path.join(site, "torch", name + ".py")), "mlo/torch/%s.py" % name
with mlo.Platform("host:capacity=1M") as plat:
    pipe = mlo.Pipeline(plat)
    comp = pipe.add_component("transformer", "dit")
    data = (ctypes.c_float * 4)(1, 2, 3, 4)
    t = comp.add_tensor("w", "F32", [4], ctypes.addressof(data))
    enc = pipe.add_component("text_encoder", "encoder")
    enc.add_tensor("w", "F32", [4], ctypes.addressof(data))
    pipe.materialize()
    pipe.enable()
    with comp:
        got = (ctypes.c_float * 4).from_address(mlo.Component.device_ptr(t))
        assert list(got) == [1, 2, 3, 4], list(got)
    assert pipe.stats()["loads"] >= 1, pipe.stats()
# a platform module, found beside the package's libmlo (its error says so
# when the machine has no GPU: what matters is that it was found and loaded)
try:
    mlo.Platform("opencl")
except mlo.MloError as e:
    assert "not found" not in str(e) and "no such file" not in str(e).lower(), str(e)
print("wheel-check: mlo %s from %s" % (mlo.version(), lib))
PY
