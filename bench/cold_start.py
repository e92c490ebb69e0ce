#!/usr/bin/env python3
"""Cold start: the same checkpoint files read three ways in one run.

  bench/cold_start.py --mlo build/tools/mlo/mlo [--disk DIR] [--tmpfs DIR]
                      [--scale S] [--reps N] [--json]

For each place (a folder on the disk, one on tmpfs), a Wan2.2-shaped
pipeline is generated there (`mlo synth`, in a fresh temporary folder that
is removed afterwards) and its safetensors files are read:

  read         a plain sequential read of every file (the disk's own speed):
               readinto a reused 64 MiB buffer, one file after another;
  fresh        the same read into fresh memory the size of the files (what
               a loader must fill: the kernel zeroes every new page first);
  mlo          `mlo run DIR --offload none --steps 1 --json`: its load_s,
               the checkpoint read into pinned host slabs;
  safetensors  the reference loader, safetensors.numpy.load_file on every
               file, in a child process.

cold: the files' pages are dropped from the page cache first
(posix_fadvise DONTNEED, which needs no root; on tmpfs the files are the
cache, so cold and warm are the same thing there); warm: the files are read
once first.  The ways run in a rotated order each repetition and the
figures are medians with the spread (min-max).  After each mlo and
safetensors load: the child's peak RSS and the page cache the files still
occupy (fincore), both against the weights' bytes.

Exit code 0; the targets (issue "Cold start at disk speed") are printed
beside the figures, not asserted: this machine is shared and its disk is a
virtual one.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CHUNK = 64 << 20


def files_of(d):
    out = []
    for root, _, names in os.walk(d):
        out += [os.path.join(root, n) for n in sorted(names) if n.endswith(".safetensors")]
    return sorted(out)


def drop_cache(files):
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_cache(files):
    buf = bytearray(CHUNK)
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def cached_bytes(files):
    """Bytes of the files in the page cache (fincore), or None without it."""
    if not shutil.which("fincore"):
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *files],
                         capture_output=True, text=True)
    if out.returncode:
        return None
    return sum(int(x) for x in out.stdout.split())


def run_child(argv, env=None):
    """(stdout, peak RSS bytes) of a child, its own rusage."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                         text=True)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"{argv[0]} failed ({p.returncode})")
    return out, ru.ru_maxrss * 1024


def way_read(files, total, args):
    buf = bytearray(CHUNK)
    t0 = time.perf_counter()
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    return {"s": time.perf_counter() - t0}


def way_read_fresh(files, total, args):
    """The same read into fresh memory the size of the files, as any loader
    must fill (anonymous pages, zeroed by the kernel as they are first
    written): what a loader can reach when the bytes come from memory."""
    import mmap
    t0 = time.perf_counter()
    m = mmap.mmap(-1, total)
    view, pos = memoryview(m), 0
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while True:
                n = f.readinto(view[pos:pos + CHUNK])
                if not n:
                    break
                pos += n
    s = time.perf_counter() - t0
    view.release()
    m.close()
    return {"s": s}


def way_mlo(files, total, args):
    out, rss = run_child([args.mlo, "run", args.cur_dir, "--offload", "none", "--steps", "1",
                          "--json"], env=dict(os.environ, MLO_LOG="error"))
    res = json.loads(out)
    # the host platform's device memory is host memory too: its copy of
    # the weights (the run loads them) is not the loader's
    return {"s": res["load_s"], "rss": rss - res["platform_peak_bytes"],
            "cache": cached_bytes(files)}


ST_CHILD = r"""
import sys, time
t0 = time.perf_counter()
try:  # the loader users call: mmap, then tensors (bf16 needs torch)
    from safetensors.torch import load_file
    keep = [load_file(p) for p in sys.argv[1:]]
    how = "safetensors.torch.load_file"
except ImportError:  # without torch: the package's framework-free reader
    from safetensors import deserialize
    keep = []
    for p in sys.argv[1:]:
        with open(p, "rb") as f:
            keep.append(deserialize(f.read()))
    how = "safetensors.deserialize"
print(how, time.perf_counter() - t0)
"""


def way_safetensors(files, total, args):
    out, rss = run_child([args.python, "-c", ST_CHILD, *files])
    how, secs = out.strip().splitlines()[-1].split()
    args.st_how = how
    return {"s": float(secs), "rss": rss, "cache": cached_bytes(files)}


WAYS = [("read", way_read), ("fresh", way_read_fresh), ("mlo", way_mlo),
        ("safetensors", way_safetensors)]


def place(label, base, args):
    tmp = tempfile.mkdtemp(prefix="mlo-cold-", dir=base)
    try:
        d = os.path.join(tmp, "wan")
        subprocess.run([args.mlo, "synth", "wan2.2-t2v", d, "--scale", str(args.scale)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        files = files_of(d)
        total = sum(os.path.getsize(p) for p in files)
        args.cur_dir = d
        results = {}
        for state in ("cold", "warm"):
            runs = {name: [] for name, _ in WAYS}
            for rep in range(args.reps):
                order = WAYS[rep % len(WAYS):] + WAYS[:rep % len(WAYS)]
                for name, fn in order:
                    drop_cache(files) if state == "cold" else warm_cache(files)
                    runs[name].append(fn(files, total, args))
            results[state] = runs
        return {"place": label, "path": base, "bytes": total, "files": len(files),
                "results": results}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def summary(p):
    rows = []
    for state, runs in p["results"].items():
        med = {k: statistics.median(r["s"] for r in v) for k, v in runs.items()}
        spread = {k: (min(r["s"] for r in v), max(r["s"] for r in v)) for k, v in runs.items()}
        gbs = {k: p["bytes"] / v / 1e9 for k, v in med.items()}
        row = {"state": state, "median_s": med, "spread_s": spread, "gb_s": gbs,
               "mlo_vs_read": med["read"] / med["mlo"],
               "mlo_vs_fresh": med["fresh"] / med["mlo"],
               "mlo_vs_safetensors": med["safetensors"] / med["mlo"]}
        for k in ("mlo", "safetensors"):
            row[k + "_rss_x"] = statistics.median(r["rss"] for r in runs[k]) / p["bytes"]
            caches = [r["cache"] for r in runs[k] if r["cache"] is not None]
            row[k + "_cache_x"] = statistics.median(caches) / p["bytes"] if caches else None
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mlo", required=True)
    ap.add_argument("--disk", default=None, help="a folder on the disk (default: $TMPDIR, /tmp)")
    ap.add_argument("--tmpfs", default="/dev/shm", help="a folder on tmpfs ('' to skip)")
    ap.add_argument("--scale", type=float, default=0.03, help="synth scale (0.03: ~2 GB)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--python", default=sys.executable,
                    help="the Python whose safetensors (and torch, if any) is the reference")
    args = ap.parse_args()
    places = [("disk", args.disk or os.environ.get("TMPDIR") or "/tmp")]
    if args.tmpfs and os.path.isdir(args.tmpfs):
        places.append(("tmpfs", args.tmpfs))
    out = []
    for label, base in places:
        p = place(label, base, args)
        p["summary"] = summary(p)
        out.append(p)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for p in out:
        print(f"\n{p['place']} ({p['path']}): {p['files']} files, {p['bytes'] / 1e9:.2f} GB, "
              f"{args.reps} repetitions, medians (spread)")
        print(f"  {'':5} {'read GB/s':>16} {'fresh GB/s':>16} {'mlo GB/s':>16} "
              f"{'safetensors':>16} {'mlo/read':>9} {'/fresh':>7} {'mlo/st':>7} {'rss mlo':>8} "
              f"{'rss st':>7} {'cache mlo':>9} {'cache st':>8}")
        for r in p["summary"]:
            def cell(k):
                lo, hi = r["spread_s"][k]
                return f"{r['gb_s'][k]:5.2f} ({p['bytes'] / hi / 1e9:.2f}-{p['bytes'] / lo / 1e9:.2f})"
            def x(v):
                return "   -" if v is None else f"{v:.2f}x"
            print(f"  {r['state']:5} {cell('read'):>16} {cell('fresh'):>16} {cell('mlo'):>16} "
                  f"{cell('safetensors'):>16} {r['mlo_vs_read']:8.2f}x {r['mlo_vs_fresh']:6.2f}x "
                  f"{r['mlo_vs_safetensors']:6.2f}x "
                  f"{x(r['mlo_rss_x']):>8} {x(r['safetensors_rss_x']):>7} "
                  f"{x(r['mlo_cache_x']):>9} {x(r['safetensors_cache_x']):>8}")
    print(f"\nreference loader: {getattr(args, 'st_how', '?')} ({args.python})")
    print("targets: mlo >= 0.90x read and >= 1.0x safetensors everywhere; page cache after "
          "an mlo load from disk <= 0.10x the weights; mlo's RSS ~1.0x (its slabs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
