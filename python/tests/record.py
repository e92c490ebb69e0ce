#!/usr/bin/env python3
"""record.py — writes recorded.json: what mlo.torch did on the tiny
diffusers pipelines (tiny.py), for test_replay.py to check in CI, where
torch and diffusers (several GB) are not installed.

For each pipeline: its components as mlo.torch declared them (role, every
tensor's name, dtype and shape), the sequence of acquires and releases its
hooks made during one generation, the libmlo counters after it (loads,
evictions, bytes each way, per component; the pipeline's device peak), and
whether the frames were bit-identical to the same pipeline without offload
(they must be: the recorder refuses to write otherwise).

    MLO_LIBRARY=build/libmlo.so /path/to/venv/bin/python python/tests/record.py
"""
import json
import os
import sys
import warnings

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import mlo.torch  # noqa: E402
import tiny  # noqa: E402


def record(name):
    build, run = tiny.PIPELINES[name]
    ref = np.asarray(run(build()))
    pipe = build()
    backend = mlo.torch.enable_model_offload(pipe, device="host:capacity=64M")
    events = []
    acq, rel = backend.acquire, backend.release
    backend.acquire = lambda m: (events.append(["acquire", m.name]), acq(m))[1]
    backend.release = lambda m: (events.append(["release", m.name]), rel(m))[1]
    backend.pipeline.reset_stats()
    out = np.asarray(run(pipe))
    if not np.array_equal(ref, out):
        raise SystemExit("%s: offloaded output differs; nothing recorded" % name)
    comps = []
    for m in backend.managed:
        st = m.comp.stats()
        comps.append({
            "name": m.name, "role": m.role, "bytes": m.comp.bytes,
            "tensors": [[qname, mlo.torch._DTYPES[e.like.dtype],
                         list(e.like.shape)] for qname, e in zip(names_of(m), m.entries)],
            "loads": st["loads"], "evictions": st["evictions"], "h2d_bytes": st["h2d_bytes"],
            "d2h_bytes": st["d2h_bytes"]})
    ps = backend.pipeline.stats()
    mlo.torch.disable_model_offload(pipe)
    return {"components": comps, "events": events, "identical": True,
            "peak_device_bytes": ps["peak_device_bytes"], "d2h_bytes": ps["d2h_bytes"]}


def names_of(m):
    """The qualified tensor names, in the order the component declared them."""
    out = []
    lib = mlo.lib()
    for e in m.entries:
        # the name libmlo stores is the declaration's: read it back
        out.append(_tensor_name(lib, e.handle))
    return out


def _tensor_name(lib, handle):
    import ctypes
    fn = lib.mlo_tensor_name
    fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    return fn(handle).decode()


def main():
    warnings.simplefilter("ignore")
    out = {"torch": torch.__version__, "pipelines": {n: record(n) for n in tiny.PIPELINES}}
    import diffusers
    out["diffusers"] = diffusers.__version__
    path = os.path.join(HERE, "recorded.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote", path, "(%d bytes)" % os.path.getsize(path))


if __name__ == "__main__":
    main()
