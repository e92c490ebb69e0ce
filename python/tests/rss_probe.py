#!/usr/bin/env python3
"""rss_probe.py MODE DIR OUT [DEVICE HOST_MEMORY] — loads the Wan pipeline
saved in DIR, plainly (MODE diffusers) or with mlo.torch.from_pretrained
(MODE mlo, on DEVICE with HOST_MEMORY), runs it to its latents (saved to
OUT with torch.save) and prints one JSON line: the kernel's peak RSS of
this process since just before loading (after the load, and after
the run) (VmHWM, reset through
/proc/self/clear_refs) and its RSS then, with mlo's stand-in device peak
and staging ring.  test_torch's FromPretrainedTests runs it in a fresh
process so that nothing else the tests did counts."""
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


def main():
    mode, path, out = sys.argv[1:4]
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS now
    before = status("VmRSS")
    if mode == "mlo":
        pipe = mlo.torch.from_pretrained(WanPipeline, path, device=sys.argv[4],
                                         host_memory=sys.argv[5])
    else:
        pipe = WanPipeline.from_pretrained(path)
    loaded_peak = status("VmHWM")
    with torch.no_grad():
        latents = pipe(tiny.PROMPT, num_inference_steps=4, height=16, width=16, num_frames=5,
                       max_sequence_length=8, guidance_scale=3.0, guidance_scale_2=2.0,
                       generator=torch.Generator().manual_seed(0), output_type="latent").frames
    report = {"before": before, "loaded_peak": loaded_peak, "peak": status("VmHWM"), "device_peak": 0, "staging": 0}
    backend = getattr(pipe, "_mlo_offload", None)
    if backend is not None:
        backend.pipeline.synchronize()
        stats = backend.pipeline.stats()
        report.update(device_peak=backend.platform.memory()["peak_bytes"],
                      staging=stats["staging_bytes"], disk_bytes=stats["disk_bytes"],
                      host_slab_bytes=stats["host_slab_bytes"],
                      disk_read_bytes=stats["disk_read_bytes"])
    torch.save(latents, out)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
