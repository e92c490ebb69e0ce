#!/usr/bin/env python3
"""gpu-torch.py — mlo.torch on a real GPU, for scripts/gpu-check.sh (the
device check's torch step); runs THERE, from the pack gpu-prep.sh made.

1. A tiny real diffusers pipeline (python/tests/tiny.py, the CPU tests'
   fixtures, built in memory: no download) runs plain on CUDA, then through
   mlo.torch.enable_model_offload(pipe, device="cuda") on torch's default
   stream, then on a side stream (enabled inside `with torch.cuda.stream`):
   the frames must equal the plain pipeline's.
2. One pinned-bandwidth figure at 1 GiB: mlo's load of a 1 GiB component
   against torch's pinned copy_, median of 5 each.

Exit status: 0 when every comparison holds; 77 (skipped) when what it
needs is not there (no GPU torch sees, diffusers or transformers not
importable), with the reason on stderr; 1 otherwise.
"""
import ctypes
import faulthandler
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the pack's python/: mlo, tiny.py


faulthandler.dump_traceback_later(100)  # a hang shows where it stopped, before the limit


def skip(why):
    print("skipped: " + why, file=sys.stderr)
    sys.exit(77)


try:
    import numpy as np
    import torch
except ImportError as e:
    skip("torch or numpy not importable: %s" % e)
if not torch.cuda.is_available():
    skip("torch sees no GPU")
try:
    import tiny
except ImportError as e:
    skip("the fixtures need diffusers, transformers and tokenizers: %s" % e)

# libmlo's one dependency outside glibc, from the pack, loaded by path: the
# pack's library folder never goes on this process's search path (torch
# brings its own libstdc++ and BLAS)
libs = os.environ.get("MLO_PACK_LIBS")
if libs:
    for name in sorted(os.listdir(libs)):
        if name.startswith("libcjson"):
            ctypes.CDLL(os.path.join(libs, name), mode=ctypes.RTLD_GLOBAL)
import mlo  # noqa: E402
import mlo.torch  # noqa: E402

try:  # the pack, then the device: neither is a defect of mlo.torch
    mlo.lib()
except OSError as e:
    print("the pack's libmlo did not load (gpu-prep.sh?): %s" % e)
    sys.exit(1)
try:
    mlo.Platform("cuda").close()
except mlo.MloError as e:
    if e.name == "MLO_ENODEV":
        skip("libmlo's CUDA platform sees no device: %s" % e)
    raise

failed = []


def frames(pipe):
    return np.asarray(tiny.run_wan(pipe))


def plain():
    pipe = tiny.wan(num_layers=4, ffn_dim=4096)
    return pipe.to("cuda")


ref = frames(plain())
print("plain pipeline on cuda: frames %s" % (ref.shape,))
for label in ("default stream", "side stream"):
    pipe = tiny.wan(num_layers=4, ffn_dim=4096)
    side = torch.cuda.Stream() if label == "side stream" else None
    with torch.cuda.stream(side):  # None: torch's default stream, as it is
        b = mlo.torch.enable_model_offload(pipe, device="cuda")
        outs = [frames(pipe) for _ in range(2)]
    st = b.pipeline.stats()
    for i, out in enumerate(outs):
        diff = float(np.abs(out - ref).max())
        ok = diff == 0.0
        print("mlo.torch, %s, generation %d: max difference %g from plain %s"
              % (label, i + 1, diff, "(identical)" if ok else "DIFFERENT"))
        if not ok:
            failed.append("%s generation %d" % (label, i + 1))
    print("  loads %d, evictions %d, h2d %.1f MiB, d2h %d B, written back %d"
          % (st["loads"], st["evictions"], st["h2d_bytes"] / 2**20, st["d2h_bytes"],
             sum(m.written_back for m in b.managed)))
    mlo.torch.close_model_offload(pipe)

# 1 GiB: mlo's load (acquire of a one-tensor component, its slab pinned)
# against torch's pinned copy_
n = 1 << 30
plat = mlo.Platform("cuda")
pipe = mlo.Pipeline(plat)
src = (ctypes.c_uint8 * n)()
dit = pipe.add_component("transformer", "dit")
dit.add_tensor("w", "U8", [n], ctypes.addressof(src))
enc = pipe.add_component("text_encoder", "encoder")
enc.add_tensor("w", "U8", [16], ctypes.addressof(src))
pipe.materialize()
pipe.enable()
mlo_s = []
for _ in range(6):
    enc.acquire()  # evicts the DiT (C4)
    enc.release()
    plat.synchronize()
    t0 = time.perf_counter()
    dit.acquire()
    plat.synchronize()
    mlo_s.append(time.perf_counter() - t0)
    dit.release()
pipe.free()
plat.close()
host = torch.empty(n, dtype=torch.uint8).pin_memory()
dev = torch.empty(n, dtype=torch.uint8, device="cuda")
torch_s = []
for _ in range(6):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    torch_s.append(time.perf_counter() - t0)
m, t = statistics.median(mlo_s[1:]), statistics.median(torch_s[1:])
print("pinned 1 GiB host to device, median of 5: mlo load %.2f GB/s, torch copy_ %.2f GB/s "
      "(mlo / torch %.3f)" % (n / m / 1e9, n / t / 1e9, t / m))
if failed:
    print("FAILED: " + ", ".join(failed))
    sys.exit(1)
