#!/usr/bin/env python3
"""gpu-torch.py — mlo.torch on a real GPU, for scripts/gpu-check.sh (the
device check's torch step); runs THERE, from the pack gpu-prep.sh made.

1. A tiny real diffusers pipeline (python/tests/tiny.py, the CPU tests'
   fixtures, built in memory: no download) runs plain on CUDA, then through
   mlo.torch.enable_model_offload(pipe, device="cuda") on torch's default
   stream, then on a side stream (enabled inside `with torch.cuda.stream`):
   the frames must equal the plain pipeline's.
2. One pinned-bandwidth figure at 1 GiB: mlo's load of a 1 GiB component
   against torch's pinned copy_, median of 5 each; before it, the probe of
   review D1: libmlo queries that load while it is in flight, and torch's
   next kernel must run.
3. The card's pinned bandwidth with torch: host to device and device to
   host at 1, 2 and 4 GiB (a size that does not fit in free device memory
   is skipped), median of 3 after one warm-up: table torch-bandwidth.md.
4. One side-by-side on the same Wan2.2-shaped pipeline (tiny.wan widened:
   two DiTs of about 1.1 GB each in fp32, 32 blocks each; ~2.2 GB in all),
   under a device cap of 1.5 GiB that the whole pipeline does not fit and
   one DiT does: all resident (uncapped: the reference), diffusers'
   enable_model_cpu_offload, diffusers' enable_group_offload (block level,
   one block per group, use_stream=True), mlo.torch budget policy with
   budget = the cap, and mlo.torch with budget = 60% of a DiT (its blocks
   stream).  Each way runs in its own process (a fresh torch allocator, a
   fresh host peak): torch's cap is set_per_process_memory_fraction, mlo's
   is its platform's capacity= (mlo's blocks are not torch's, so its peak
   is torch's plus mlo's own).  Per way: wall per generation (4 steps, after
   one warm-up), peak device memory, peak host RSS (ru_maxrss: the peak
   of the whole process, building the pipeline included), and the final
   latents (captured at the last step) against the all-resident ones:
   table torch-compare.md.  The mlo rows run right after the reference,
   then diffusers' (the deadline cuts those first).
Parts 3 and 4 each have a time limit (25 s, 35 s a way, and in all
MLO_GPU_TORCH_S, default 105 s from the start; gpu-check.sh sets it under
its step's limit); a part that fails, times out or is not
reached by the deadline says so in its row, and the script goes on.  The
tables are printed and written, with torch-results.json, to --out DIR
(gpu-check.sh passes its work folder; default $OUT, else the current one).

--rehearse-cpu (or MLO_GPU_TORCH_REHEARSE=1): no GPU needed; runs part 4's
logic on the CPU, mlo on its host platform (host:capacity=<the cap>), a
smaller pipeline, so the tables' code is exercised; the rows that need CUDA
(diffusers' two offloads, the bandwidth) read "skipped: needs CUDA".

Exit status: 0 when every comparison holds; 77 (skipped) when what it
needs is not there (no GPU torch sees, diffusers or transformers not
importable), with the reason on stderr; 1 otherwise (parts 1 and 2 failed,
or an mlo.torch row of part 4 failed or its latents differ; the diffusers
rows and the bandwidth only report).
"""
import argparse
import ctypes
import faulthandler
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the pack's python/: mlo, tiny.py
for _d in ("python", "python/tests"):  # or, from the repository: scripts/../python
    if os.path.isdir(os.path.join(HERE, "..", _d)):
        sys.path.append(os.path.join(HERE, "..", _d))

GIB = 1 << 30
START = time.monotonic()
TOTAL_S = float(os.environ.get("MLO_GPU_TORCH_S", "105"))  # the whole script's own deadline
# parts 3 and 4 inside gpu-check.sh's six minutes: each child imports torch
# (and part 4's diffusers) afresh, which the limits must leave time for
BANDWIDTH_S = 25  # part 3
WAY_S = 35  # part 4, each way
# part 4's pipeline: tiny.wan's DiTs widened (dim 16; one block is ~132 * ffn bytes)
GPU_SHAPE = dict(num_layers=32, ffn_dim=262144, cap=int(1.5 * GIB))
CPU_SHAPE = dict(num_layers=8, ffn_dim=8192, cap=12 << 20)
WAYS = ("resident", "cpu_offload", "group_offload", "mlo_budget", "mlo_stream")
CUDA_ONLY = ("cpu_offload", "group_offload")
# mlo's rows first: they decide the exit status, so the deadline cuts diffusers' rows first
RUN_ORDER = ("resident", "mlo_budget", "mlo_stream", "cpu_offload", "group_offload")


def skip(why):
    print("skipped: " + why, file=sys.stderr)
    sys.exit(77)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rehearse-cpu", action="store_true",
                    default=os.environ.get("MLO_GPU_TORCH_REHEARSE") == "1")
    ap.add_argument("--out", default=os.environ.get("OUT") or ".")
    ap.add_argument("--child", choices=("bandwidth", "way"), help=argparse.SUPPRESS)
    ap.add_argument("--way", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    return ap.parse_args()


ARGS = parse_args()
# a hang shows where it stopped, before the limit (it dumps, it does not kill)
faulthandler.dump_traceback_later(max(30, TOTAL_S - 10) if not ARGS.child else 40)

try:
    import numpy as np
    import torch
except ImportError as e:
    skip("torch or numpy not importable: %s" % e)
if not ARGS.rehearse_cpu and not torch.cuda.is_available():
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


def left():
    return TOTAL_S - (time.monotonic() - START)


def write_json(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)  # a child cut by its limit leaves its last whole result


# --- parts 1 and 2 ----------------------------------------------------------

def correctness_and_load(failed):
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
    n = GIB
    plat = mlo.Platform("cuda")
    pipe = mlo.Pipeline(plat)
    src = (ctypes.c_uint8 * n)()
    dit = pipe.add_component("transformer", "dit")
    dit.add_tensor("w", "U8", [n], ctypes.addressof(src))
    enc = pipe.add_component("text_encoder", "encoder")
    enc.add_tensor("w", "U8", [16], ctypes.addressof(src))
    pipe.materialize()
    # the in-flight query (review D1): libmlo asks whether the 1 GiB load has
    # landed while its copies still run (cudaEventQuery answers "not ready");
    # torch shares libcudart, so its next kernel must not take that as its
    # own launch error.  A load by hand, before offload is enabled.
    lib = mlo.lib()
    lib.mlo_component_load.argtypes = [ctypes.c_void_p]
    rc = lib.mlo_component_load(dit._c)  # returns with its copies issued
    in_flight = rc == 0 and not dit.load_done
    try:
        x = torch.ones(1 << 20, device="cuda") * 2
        torch.cuda.synchronize()
        print("in-flight query: load %s when asked; torch's next kernel ran (sum %g)"
              % ("still copying" if in_flight else "already landed (the probe saw no "
                 "in-flight load)", float(x.sum())))
    except RuntimeError as e:
        print("in-flight query: torch's next kernel FAILED: %s" % e)
        failed.append("torch after an in-flight query")
    plat.synchronize()
    dit.evict()
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
    del src
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
    del host, dev
    torch.cuda.empty_cache()


# --- part 3: pinned bandwidth (child) ----------------------------------------

def child_bandwidth(result):
    rows = []
    free, _ = torch.cuda.mem_get_info()
    sizes = [s for s in (1, 2, 4) if s * GIB + (256 << 20) <= free]
    for s in (1, 2, 4):
        if s not in sizes:
            for d in ("host to device", "device to host"):
                rows.append(dict(direction=d, gib=s, note="skipped: %.1f GiB free on the device"
                                 % (free / GIB)))
    write_json(result, rows)
    if not sizes:
        return
    big = max(sizes) * GIB
    host = torch.empty(big, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(big, dtype=torch.uint8, device="cuda")
    for s in sizes:
        n = s * GIB
        for d in ("host to device", "device to host"):
            dst, src = (dev[:n], host[:n]) if d == "host to device" else (host[:n], dev[:n])
            runs = []
            for _ in range(4):  # one warm-up, three timed
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize()
                runs.append(time.perf_counter() - t0)
            med = statistics.median(runs[1:])
            rows.append(dict(direction=d, gib=s, gbps=n / med / 1e9,
                             runs=[round(r, 4) for r in runs[1:]]))
            write_json(result, rows)


# --- part 4: one way of the side-by-side (child) -----------------------------

def latents_of(pipe, steps=4):
    got = {}

    def last(p, i, t, kw):
        got["latents"] = kw["latents"].detach().float().cpu().clone()
        return {}

    with torch.no_grad():
        pipe(tiny.PROMPT, num_inference_steps=steps, height=16, width=16, num_frames=5,
             max_sequence_length=8, guidance_scale=3.0, guidance_scale_2=2.0,
             generator=torch.Generator().manual_seed(0), output_type="np",
             callback_on_step_end=last, callback_on_step_end_tensor_inputs=["latents"])
    return got["latents"].numpy()


def child_way(way, result):
    import resource
    cpu = ARGS.rehearse_cpu
    shape = CPU_SHAPE if cpu else GPU_SHAPE
    cap = shape["cap"]
    pipe = tiny.wan(num_layers=shape["num_layers"], ffn_dim=shape["ffn_dim"])
    dit_bytes = sum(p.numel() * p.element_size() for p in pipe.transformer.parameters())
    pipe_bytes = sum(p.numel() * p.element_size() for n in ("transformer", "transformer_2",
                     "text_encoder", "vae") for p in getattr(pipe, n).parameters())
    res = dict(way=way, dit_bytes=dit_bytes, pipe_bytes=pipe_bytes)
    if not cpu and way != "resident":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total))
        res["cap"] = cap
    backend = None
    budget = cap if way == "mlo_budget" else int(dit_bytes * 0.6)
    spec = ("host" if cpu else "cuda") + ":capacity=%dM" % (cap >> 20)
    if way.startswith("mlo"):
        res["cap"], res["budget"] = cap, budget
    write_json(result, res)  # what a failure's row shows
    if way == "resident":
        pipe.to("cpu" if cpu else "cuda")
    elif way == "cpu_offload":
        pipe.enable_model_cpu_offload()
    elif way == "group_offload":
        pipe.enable_group_offload(onload_device=torch.device("cuda"),
                                  offload_device=torch.device("cpu"), offload_type="block_level",
                                  num_blocks_per_group=1, use_stream=True)
    elif way in ("mlo_budget", "mlo_stream"):
        backend = mlo.torch.enable_model_offload(pipe, device=spec, policy="budget",
                                                 budget=budget)
    else:
        raise ValueError("unknown way %r" % way)
    latents_of(pipe)  # warm-up (mlo learns its schedule here)
    if not cpu:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    lat = latents_of(pipe)
    if not cpu:
        torch.cuda.synchronize()
    res["wall_s"] = time.perf_counter() - t0
    if not cpu:
        res["torch_peak"] = torch.cuda.max_memory_allocated()
    if backend is not None:
        st = backend.pipeline.stats()
        res["mlo_peak"] = st.get("peak_device_bytes", st.get("peak_bytes"))
        res["h2d"] = st.get("h2d_bytes")
        res["streamed"] = sum(m.comp.stream_info()["streamed_blocks"]
                              for m in backend.managed if m.streams)
        mlo.torch.close_model_offload(pipe)
    res["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    np.save(result + ".npy", lat)
    res["ok"] = True
    write_json(result, res)


# --- the parent: runs each child under its limit, writes the tables ----------

def run_child(kind, way, limit, tmp):
    result = os.path.join(tmp, "%s-%s.json" % (kind, way or "all"))
    if limit < 15:
        return None, "not run: the script's deadline (MLO_GPU_TORCH_S=%g)" % TOTAL_S
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--result", result]
    if way:
        cmd += ["--way", way]
    if ARGS.rehearse_cpu:
        cmd.append("--rehearse-cpu")
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=limit, text=True)
        log, err = p.stdout, None if p.returncode == 0 else "exit %d" % p.returncode
    except subprocess.TimeoutExpired as e:
        log = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = "timed out after %d s" % limit
    sys.stdout.write("".join("  [%s%s] %s\n" % (kind, " " + way if way else "", line)
                             for line in log.splitlines()[-40 if err else -3:]))
    print("  [%s%s] %.1f s%s" % (kind, " " + way if way else "", time.monotonic() - t0,
                                 ", " + err if err else ""))
    got = None
    if os.path.exists(result):
        with open(result) as f:
            got = json.load(f)
    if err:
        lines = [line for line in log.splitlines() if line.strip()]
        if lines and "timed out" not in err:
            err += ": " + lines[-1][:300]
    return got, err


def mib(b):
    return "—" if b is None else "%.0f MiB" % (b / 2**20)


def bandwidth_part(tmp):
    head = ("| direction | size | GB/s (median of 3) | runs (s) | note |\n"
            "|---|---|---|---|---|\n")
    if ARGS.rehearse_cpu:
        rows = ["| host to device, device to host | 1, 2, 4 GiB | — | — | skipped: needs CUDA |"]
        return head + "\n".join(rows) + "\n", []
    got, err = run_child("bandwidth", None, min(BANDWIDTH_S, left()), tmp)
    rows, out = [], got or []
    for r in out:
        rows.append("| %s | %d GiB | %s | %s | %s |" % (
            r["direction"], r["gib"], "%.2f" % r["gbps"] if "gbps" in r else "—",
            ", ".join("%.4f" % x for x in r.get("runs", [])) or "—", r.get("note", "")))
    if err:
        rows.append("| (the part) | | | | %s: %s |" % (
            "NOT RUN" if err.startswith("not run") else "FAILED", err.replace("|", "/")))
    return head + "\n".join(rows) + "\n", out


def compare_part(tmp, failed):
    results, ref = {}, None
    cpu = ARGS.rehearse_cpu
    rows = []
    for way in RUN_ORDER:
        if cpu and way in CUDA_ONLY:
            results[way] = dict(way=way, note="skipped: needs CUDA")
            continue
        got, err = run_child("way", way, min(WAY_S, left()), tmp)
        r = got or dict(way=way)
        if err:
            r["error"] = err
        if r.get("ok") and os.path.exists(os.path.join(tmp, "way-%s.json.npy" % way)):
            lat = np.load(os.path.join(tmp, "way-%s.json.npy" % way))
            if way == "resident":
                ref = lat
            elif ref is None:
                r["latents"] = "no reference (all resident failed)"
            elif lat.shape != ref.shape:
                r["latents"] = "DIFFERENT shape %s" % (lat.shape,)
            else:
                d = float(np.abs(lat - ref).max())
                r["latents"] = "identical" if d == 0.0 and np.array_equal(lat, ref) else (
                    "max abs diff %.3g" % d)
        results[way] = r
        if err and err.startswith("not run"):
            continue  # the deadline, not mlo: the row says NOT RUN
        if way.startswith("mlo") and (not r.get("ok") or not r.get("latents", "").startswith(
                "identical")):
            failed.append("side-by-side %s: %s" % (way, r.get("error") or r.get("latents")))
    shape = CPU_SHAPE if cpu else GPU_SHAPE
    any_r = next((r for r in results.values() if "pipe_bytes" in r), {})
    title = ("Wan2.2-shaped pipeline (tiny.wan, num_layers=%d, ffn_dim=%d: %s, one DiT %s), "
             "%s, cap %s, 4 steps, 16x16x5\n\n" % (
                 shape["num_layers"], shape["ffn_dim"], mib(any_r.get("pipe_bytes")),
                 mib(any_r.get("dit_bytes")), "CPU rehearsal (mlo on host)" if cpu else "CUDA",
                 mib(shape["cap"])))
    head = ("| way | device cap | wall per generation | peak device memory | peak host RSS | "
            "latents vs all resident | note |\n|---|---|---|---|---|---|---|\n")
    label = {"resident": "all resident", "cpu_offload": "diffusers enable_model_cpu_offload",
             "group_offload": "diffusers enable_group_offload (block, 1/group, stream)",
             "mlo_budget": "mlo.torch budget, budget = cap",
             "mlo_stream": "mlo.torch budget, budget = 0.6 DiT (streams)"}
    for way in WAYS:
        r = results[way]
        if "torch_peak" in r or "mlo_peak" in r:
            peak = " + ".join(s for s in (
                "torch %s" % mib(r["torch_peak"]) if "torch_peak" in r else "",
                "mlo %s" % mib(r["mlo_peak"]) if r.get("mlo_peak") is not None else "") if s)
        else:
            peak = "—"
        note = r.get("note") or ""
        if r.get("error"):
            note = ("NOT RUN: " + r["error"][9:]) if r["error"].startswith("not run") else (
                "FAILED: " + r["error"])
        elif "budget" in r:
            note = "budget %s, %d block(s) stream, h2d %s over both generations" % (
                mib(r["budget"]), r.get("streamed") or 0, mib(r.get("h2d")))
        rows.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            label[way], mib(r["cap"]) if "cap" in r else ("none" if way == "resident" else "—"),
            "%.3f s" % r["wall_s"] if "wall_s" in r else "—", peak, mib(r.get("rss")),
            r.get("latents", "reference" if way == "resident" and r.get("ok") else "—"),
            note.replace("|", "/")))
    return title + head + "\n".join(rows) + "\n", results


def main():
    if ARGS.child == "bandwidth":
        return child_bandwidth(ARGS.result)
    if ARGS.child == "way":
        return child_way(ARGS.way, ARGS.result)
    failed = []
    if not ARGS.rehearse_cpu:
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
        correctness_and_load(failed)
    import tempfile
    os.makedirs(ARGS.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mlo-gpu-torch.") as tmp:
        bw, bw_rows = bandwidth_part(tmp)
        bw = "Pinned bandwidth with torch (copy_, non_blocking, synchronized)\n\n" + bw
        print("\n" + bw)
        with open(os.path.join(ARGS.out, "torch-bandwidth.md"), "w") as f:
            f.write(bw)
        cmp_md, cmp_rows = compare_part(tmp, failed)
        print("\n" + cmp_md)
        with open(os.path.join(ARGS.out, "torch-compare.md"), "w") as f:
            f.write(cmp_md)
        with open(os.path.join(ARGS.out, "torch-results.json"), "w") as f:
            json.dump(dict(bandwidth=bw_rows, compare=cmp_rows,
                           rehearsal=ARGS.rehearse_cpu), f, indent=1)
    if failed:
        print("FAILED: " + ", ".join(failed))
        sys.exit(1)


main()
