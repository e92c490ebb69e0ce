#!/usr/bin/env python3
"""rss_probe.py MODE DIR OUT [DEVICE HOST_MEMORY] — loads the Wan pipeline
saved in DIR, plainly (MODE diffusers) or with mlo.torch.from_pretrained
(MODE mlo, on DEVICE with HOST_MEMORY), or plainly and then offloaded by
enable_model_offload with HOST_MEMORY (MODE enable: enable_loaded), runs it to its latents (saved to
OUT with torch.save) and prints one JSON line: the kernel's peak RSS of
this process since just before loading (after the load, and after
the run) (VmHWM, reset through
/proc/self/clear_refs) and its RSS then, with mlo's stand-in device peak
and staging ring, and the resident set of the stand-in device's arena
(the host platform's device memory is host memory: its touched pages
count in RSS, and are never given back while the platform lives).
Before measuring, a tiny pipeline is run once, so the pages of torch's
kernels and its thread pools count in "before" rather than as the
weights'.  test_torch's FromPretrainedTests runs it in a fresh process so
that nothing else the tests did counts."""
import ctypes
import gc
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

import torch  # noqa: E402
from diffusers import WanPipeline  # noqa: E402

import mlo.torch  # noqa: E402
import tiny  # noqa: E402


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def mapping_rss(address):
    """The resident bytes of the mapping that holds address (smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            field = line.split()
            if "-" in field[0] and not field[0].endswith(":"):
                lo, hi = (int(x, 16) for x in field[0].split("-"))
                inside = lo <= address < hi
            elif inside and field[0] == "Rss:":
                return int(field[1]) * 1024
    raise KeyError(hex(address))


def device_rss(backend):
    """The stand-in device's arena as host memory holds it: the mapping of a
    resident component's device block."""
    for m in backend.managed:
        for e in m.entries:
            ptr = mlo.Component.device_ptr(e.handle) if m.comp.resident else None
            if ptr:
                return mapping_rss(ptr)
    return backend.platform.memory()["peak_bytes"]


def warm_up():
    """torch's kernels paged in and its thread pools started, on weights of
    a few KiB, so that what follows measures weights."""
    tiny.run_wan(tiny.wan())
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def run(pipe):
    with torch.no_grad():
        return pipe(tiny.PROMPT, num_inference_steps=4, height=16, width=16, num_frames=5,
                    max_sequence_length=8, guidance_scale=3.0, guidance_scale_2=2.0,
                    generator=torch.Generator().manual_seed(0), output_type="latent").frames


def enable_loaded(path, out, device, host_memory):
    """MODE enable: plain diffusers loads and runs the pipeline (its
    weights now in memory), then enable_model_offload(host_memory=) sends
    what does not fit to disk: RSS before and after enable (the collector
    run and the heap trimmed before each), and the latents of a run after."""
    pipe = WanPipeline.from_pretrained(path)
    run(pipe)
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    before = status("VmRSS")
    backend = mlo.torch.enable_model_offload(pipe, device=device, host_memory=host_memory)
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    after = status("VmRSS")
    stats = backend.pipeline.stats()
    report = {"before": before, "after": after, "disk_bytes": stats["disk_bytes"],
              "host_slab_bytes": stats["host_slab_bytes"], "staging": stats["staging_bytes"],
              "device_rss": device_rss(backend)}
    torch.save(run(pipe), out)
    report["disk_read_bytes"] = backend.pipeline.stats()["disk_read_bytes"]
    print(json.dumps(report))


def main():
    mode, path, out = sys.argv[1:4]
    warm_up()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS now
    before = status("VmRSS")
    if mode == "enable":
        return enable_loaded(path, out, *sys.argv[4:6])
    if mode == "mlo":
        pipe = mlo.torch.from_pretrained(WanPipeline, path, device=sys.argv[4],
                                         host_memory=sys.argv[5])
    else:
        pipe = WanPipeline.from_pretrained(path)
    loaded_peak = status("VmHWM")
    latents = run(pipe)
    report = {"before": before, "loaded_peak": loaded_peak, "peak": status("VmHWM"),
              "device_peak": 0, "device_rss": 0, "staging": 0}
    backend = getattr(pipe, "_mlo_offload", None)
    if backend is not None:
        backend.pipeline.synchronize()
        stats = backend.pipeline.stats()
        report.update(device_peak=backend.platform.memory()["peak_bytes"],
                      device_rss=device_rss(backend),
                      staging=stats["staging_bytes"], disk_bytes=stats["disk_bytes"],
                      host_slab_bytes=stats["host_slab_bytes"],
                      disk_read_bytes=stats["disk_read_bytes"])
    torch.save(latents, out)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
