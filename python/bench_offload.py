#!/usr/bin/env python3
"""bench_offload.py — mlo.torch beside diffusers' own enable_model_cpu_offload()
on the same pipelines, in one run: bytes moved each way, transfers, host
memory, per generation (the second of --prompts, the steady state).

diffusers' model offload (accelerate's CpuOffload hooks) moves a whole
module to the GPU before its forward and the previous module back with
module.to("cpu") — a device-to-host copy of every weight — and again for
every module at the end of a call.  On a machine without a GPU those moves
are no-ops, so the script counts them by running accelerate's own decision
(CpuOffload.pre_forward, UserCpuOffloadHook.offload: which module is where,
which moves) on a virtual device: the same calls in the same order, each
counted with its module's bytes instead of moved.  mlo's figures are
libmlo's counters on the host platform.  With --cuda (a GPU and a CUDA
build of libmlo) both run for real and the script also prints wall time per
generation and peak device memory, with an all-resident run beside them.

    MLO_LIBRARY=build/libmlo.so python python/bench_offload.py [--prompts 2] [--cuda]

--stalls compares strict with the budget policy on the schedule libmlo
learns from the first generation (mlo.torch declares none): a Wan2.2
pipeline with 51 MB experts on the host platform, its link throttled to
2 GB/s (a 51 MB expert loads in about 25 ms, as a 14 GB bf16 expert on a
PCIe 4.0 x16 link at 25 GB/s takes 0.6 s against seconds of compute),
and a budget that holds one expert with the encoder and VAE, not both:
per generation, the stall (libmlo's wait_ns, every wait for a load),
loads and prefetches.
"""
import argparse
import os
import resource
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "tests"))

import torch  # noqa: E402

import mlo.torch  # noqa: E402
import tiny  # noqa: E402


def module_bytes(m):
    seen, n = set(), 0
    for t in list(m.parameters()) + list(m.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            n += t.numel() * t.element_size()
    return n


class VirtualDevice:
    """accelerate's model-offload decisions, counted instead of executed."""

    def __init__(self):
        self.where, self.h2d, self.d2h, self.transfers = {}, 0, 0, 0

    def install(self):
        import accelerate.hooks as h
        dev = self

        def pre_forward(hook, module, *args, **kwargs):
            prev = hook.prev_module_hook
            if isinstance(prev, h.UserCpuOffloadHook) and dev.where.get(id(prev.model)) == "gpu":
                prev.offload()
            if dev.where.get(id(module)) != "gpu":  # accelerate: skip if already there
                dev.where[id(module)] = "gpu"
                dev.h2d += module_bytes(module)
                dev.transfers += 1
            return args, kwargs

        def to_cpu(module):  # what module.to("cpu") moves
            if dev.where.get(id(module)) == "gpu":
                dev.where[id(module)] = "cpu"
                dev.d2h += module_bytes(module)
                dev.transfers += 1
            return module

        h.CpuOffload.pre_forward = pre_forward
        h.UserCpuOffloadHook.offload = lambda user_hook: to_cpu(user_hook.model)
        h.CpuOffload.init_hook = lambda hook, module: to_cpu(module)


def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def stalls(prompts):
    """Strict against budget + the learned schedule, per generation."""
    device = "host:capacity=512M,bw=2e9"
    sizes = None
    print("stall per generation, Wan2.2 with 51 MB experts, host platform at 2 GB/s:")
    print("%-22s %s" % ("", "  ".join("gen %d: stall, loads, prefetches" % g
                                      for g in range(1, prompts + 1))))
    for policy in ("strict", "budget"):
        pipe = tiny.wan(ffn_dim=200000)
        if sizes is None:
            b = mlo.torch.enable_model_offload(pipe, device=device)
            sizes = {m.name: m.comp.bytes for m in b.managed}
            mlo.torch.close_model_offload(pipe)
        budget = sizes["vae"] + sizes["transformer"] + sizes["text_encoder"]
        b = mlo.torch.enable_model_offload(pipe, device=device, policy=policy,
                                           budget=budget if policy == "budget" else 0)
        cells = []
        for _ in range(prompts):
            b.pipeline.reset_stats()
            tiny.run_wan(pipe, steps=8)
            st = b.pipeline.stats()
            cells.append("%6.1f ms %3d %3d" % (st["wait_ns"] / 1e6, st["loads"], st["prefetches"]))
        label = "strict" if policy == "strict" else "budget, learned sched."
        print("%-22s %s" % (label, "  ".join(cells)))
        mlo.torch.close_model_offload(pipe)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--cuda", action="store_true", help="run both on a GPU for real")
    ap.add_argument("--stalls", action="store_true",
                    help="strict against budget on a learned schedule (see above)")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    if a.stalls:
        stalls(max(a.prompts, 3))
        return
    rows = []
    for name, (build, run) in tiny.PIPELINES.items():
        weights = module_bytes(torch.nn.ModuleList(
            [m for m in build().components.values() if isinstance(m, torch.nn.Module)]))
        # diffusers' model offload
        pipe = build()
        vd = VirtualDevice()
        if not a.cuda:
            vd.install()
        pipe.enable_model_cpu_offload(device="cuda" if a.cuda else "cpu")
        for p in range(a.prompts):
            vd.h2d = vd.d2h = vd.transfers = 0
            t0 = time.perf_counter()
            run(pipe)
            wall = time.perf_counter() - t0
        rows.append((name, "diffusers", vd.h2d, vd.d2h, vd.transfers, weights, 0, wall))
        # mlo, strict and budget
        for policy in ("strict", "budget"):
            pipe = build()
            b = mlo.torch.enable_model_offload(
                pipe, device="cuda" if a.cuda else "host:capacity=64M", policy=policy,
                budget=(8 << 20) if policy == "budget" else 0)
            for p in range(a.prompts):
                b.pipeline.reset_stats()
                t0 = time.perf_counter()
                run(pipe)
                wall = time.perf_counter() - t0
            st = b.pipeline.stats()
            rows.append((name, "mlo " + policy, st["h2d_bytes"], st["d2h_bytes"], st["loads"],
                         st["host_slab_bytes"], st["pinned_bytes"], wall))
    print("per generation (the last of %d), %s" % (a.prompts, "CUDA" if a.cuda else
                                                     "host platform / accelerate's decisions"))
    print("%-6s %-12s %10s %10s %9s %11s %11s %8s" % ("pipe", "offload", "h2d", "d2h", "transfers",
                                                     "host", "pinned", "wall"))
    for name, who, h2d, d2h, n, host, pinned, wall in rows:
        print("%-6s %-12s %9dB %9dB %9d %10dB %10dB %7.3fs" % (name, who, h2d, d2h, n, host, pinned,
                                                               wall))
    print("(host: the weights' host copies — diffusers keeps the modules' own tensors, mlo one "
          "slab per component; max RSS of this process %.0f MiB)" % (rss() / 2**20))


if __name__ == "__main__":
    main()
