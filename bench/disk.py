#!/usr/bin/env python3
"""disk.py — weights larger than host memory: a host budget of half the
weights, in a memory control group the kernel enforces (issue 24's targets).

On a generated Wan2.2-shaped pipeline, `mlo run` on the host platform with
the budget policy, a device budget that holds both DiTs but not the
encoder besides (so every prompt evicts and loads again), and:
  all slabs    every slab in host memory (no --host-memory), run once
               outside any control group for its digest and peak RSS, then
               inside the control group, where the kernel's OOM killer must
               end it;
  host budget  --host-memory = half the weights: the DiT called most and the
               VAE keep their slabs, the rest is read from the checkpoint at
               each load, through the 64 MiB staging ring; inside the control
               group it must finish, without the OOM killer, with the digest
               of the all-slabs run.

The control group's limit is the host budget, plus the staging ring, plus
the device budget (the host platform's device is host memory: its arena is
in the process), plus the process's own memory (the peak RSS of the same
pipeline opened by `mlo inspect`), plus 10% of the three budgets.  Its peak
usage (memory.max_usage_in_bytes or memory.peak: RSS and page cache
charged to the group) is printed against that limit, and the page cache the
run leaves charged to the group after it ends.

It prints, per repetition and as medians: the wall time per warm prompt of
the host-budget run over the all-slabs run (both outside the group), the
bytes read from disk per prompt, the time waited for the disk per warm
prompt over its wall, and whether the digests are equal.  The disk's reads
are real reads: the loader and the disk tier drop the pages they read, so
each load reads the device (what the kernel read for the process, wait4's
ru_inblock, is printed beside mlo's own count).

Needs root and a memory controller (v2 `memory.max`, or v1
`memory.limit_in_bytes`); without them it says so and measures the runs
alone.

usage: bench/disk.py [--mlo build/tools/mlo/mlo] [--scale 0.01] [--steps 8]
                     [--prompts 3] [--reps 3] [--json]
Writes only under a temporary folder and a control group of its own.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ENV = dict(os.environ, MLO_LOG="error")
RING = 64 << 20


def run(mlo, *args, cgroup=None):
    """Runs mlo; returns (exit code or -signal, stdout, stderr, bytes the
    kernel read from storage for it: wait4's ru_inblock, 512-byte units)."""
    def enter():
        if cgroup:
            with open(os.path.join(cgroup.path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
    with tempfile.TemporaryFile("w+") as errf:
        p = subprocess.Popen([mlo, *args], stdout=subprocess.PIPE, stderr=errf, text=True,
                             env=ENV, preexec_fn=enter if cgroup else None)
        out = p.stdout.read()
        p.stdout.close()
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        errf.seek(0)
        err = errf.read()
    return p.returncode, out, err, ru.ru_inblock * 512


def must(mlo, *args, reads=None):
    rc, out, err, read = run(mlo, *args)
    if rc != 0:
        sys.exit(f"mlo {' '.join(args)}: exit {rc}: {err.strip()}")
    if reads is not None:
        reads.append(read)
    return out


def steady(res, key):
    gens = res["generations"][1:] or res["generations"]
    return statistics.median(g[key] for g in gens)


class Cgroup:
    """A memory control group of our own below the one we are in: v2 where
    the unified hierarchy has the memory controller, else v1."""

    def __init__(self, limit):
        self.path = None
        self.v2 = False
        here = ""
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
        unified = "/sys/fs/cgroup/cgroup.controllers"
        if os.path.exists(unified) and "memory" in open(unified).read().split():
            self.v2 = True
            here = next((l.split(":", 2)[2] for l in lines if l.startswith("0::")), "/")
            parent = "/sys/fs/cgroup" + here
        else:
            here = next((l.split(":", 2)[2] for l in lines
                         if "memory" in l.split(":", 2)[1].split(",")), None)
            if here is None or not os.path.isdir("/sys/fs/cgroup/memory"):
                raise OSError("no memory controller is mounted")
            parent = "/sys/fs/cgroup/memory" + here
        self.path = os.path.join(parent, f"mlo-bench-disk-{os.getpid()}")
        os.mkdir(self.path)
        try:
            if self.v2:
                self.write("memory.max", limit)
                if os.path.exists(os.path.join(self.path, "memory.swap.max")):
                    self.write("memory.swap.max", 0)
            else:
                self.write("memory.limit_in_bytes", limit)
                if os.path.exists(os.path.join(self.path, "memory.memsw.limit_in_bytes")):
                    self.write("memory.memsw.limit_in_bytes", limit)
                self.write("memory.swappiness", 0)
        except OSError:
            self.remove()
            raise

    def write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(str(value))

    def read(self, name):
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def reset_peak(self):
        if not self.v2:
            self.write("memory.max_usage_in_bytes", 0)

    def peak(self):
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        try:
            return int(self.read(name))
        except OSError:
            return None

    def cache(self):
        """Page cache charged to the group now."""
        stat = self.read("memory.stat")
        key = "file" if self.v2 else "cache"
        m = re.search(rf"^{key} (\d+)$", stat, re.M)
        return int(m.group(1)) if m else None

    def oom_kills(self):
        name = "memory.events" if self.v2 else "memory.oom_control"
        m = re.search(r"^oom_kill (\d+)$", self.read(name), re.M)
        return int(m.group(1)) if m else None

    def remove(self):
        if self.path and os.path.isdir(self.path):
            if not self.v2:
                try:
                    self.write("memory.force_empty", 0)
                except OSError:
                    pass
            os.rmdir(self.path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mlo", default="build/tools/mlo/mlo")
    ap.add_argument("--scale", default="0.01")
    ap.add_argument("--steps", default="8")
    ap.add_argument("--prompts", default="3")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    mlo = os.path.abspath(a.mlo)
    tmp = tempfile.mkdtemp(prefix="mlo-bench-disk-")
    cg = None
    try:
        ckpt = os.path.join(tmp, "wan")
        must(mlo, "synth", "wan2.2-t2v", ckpt, "--scale", a.scale)
        info = json.loads(must(mlo, "inspect", ckpt, "--json"))
        comps = info["components"]
        weights = sum(c["device_bytes"] for c in comps)
        dits = sorted((c for c in comps if c["role"] == "dit"), key=lambda c: -c["device_bytes"])
        enc = max((c for c in comps if c["role"] == "encoder"), key=lambda c: c["device_bytes"])
        # both DiTs and the VAE fit, the encoder besides does not: every
        # prompt evicts a DiT for the encoder and loads it again
        device = sum(c["device_bytes"] for c in dits) + enc["device_bytes"] // 2
        host = weights // 2
        common = ["--policy", "budget", "--budget", str(device), "--steps", a.steps,
                  "--prompts", a.prompts, "--json"]
        # the process's own memory: the pipeline opened, nothing read
        base = inspect_rss(mlo, ckpt)
        limit = int((host + RING + device) * 1.10) + base
        print(f"weights {weights / 2**20:.0f} MiB; host budget {host / 2**20:.0f} MiB; device "
              f"budget {device / 2**20:.0f} MiB; staging ring {RING >> 20} MiB; process "
              f"{base / 2**20:.0f} MiB -> control group limit {limit / 2**20:.0f} MiB",
              file=sys.stderr)
        try:
            cg = Cgroup(limit)
        except OSError as e:
            print(f"no memory control group ({e}): the runs are measured alone", file=sys.stderr)
        rows = []
        for rep in range(a.reps):
            row = {}
            full = json.loads(must(mlo, "run", ckpt, *common))
            kernel = []
            disk = json.loads(must(mlo, "run", ckpt, *common, "--host-memory", str(host),
                                   reads=kernel))
            row["digest_equal"] = full["digest"] == disk["digest"]
            row["wall_ratio"] = steady(disk, "wall_s") / steady(full, "wall_s")
            row["disk_bytes_per_prompt"] = steady(disk, "disk_read_bytes")
            row["disk_stall_share"] = steady(disk, "disk_stall_s") / steady(disk, "wall_s")
            row["full_peak_rss"] = full["peak_rss_bytes"]
            row["disk_peak_rss"] = disk["peak_rss_bytes"]
            row["host_slab_bytes"] = disk["host_slab_bytes"]
            # what the kernel read for the run against mlo's count: the slabs
            # kept (read once, at enable) and every load from disk
            row["kernel_read_bytes"] = kernel[0]
            row["mlo_read_bytes"] = disk["host_slab_bytes"] + disk["disk_read_bytes"]
            if cg:
                cg.reset_peak()
                oom0 = cg.oom_kills() or 0
                rc, out, err, _ = run(mlo, "run", ckpt, *common, "--host-memory", str(host),
                                      cgroup=cg)
                row["in_group_exit"] = rc
                row["in_group_digest_equal"] = rc == 0 and json.loads(out)["digest"] == full["digest"]
                row["in_group_peak"] = cg.peak()
                row["in_group_cache_left"] = cg.cache()
                row["in_group_oom_kills"] = (cg.oom_kills() or 0) - oom0
                rc, _, _, _ = run(mlo, "run", ckpt, *common, cgroup=cg)
                row["all_slabs_exit"] = rc
                row["all_slabs_oom_kills"] = (cg.oom_kills() or 0) - oom0 - row["in_group_oom_kills"]
            rows.append(row)
            print(f"rep {rep + 1}: " + ", ".join(f"{k} {fmt(v)}" for k, v in row.items()),
                  file=sys.stderr)
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]
               if all(isinstance(r[k], (int, float)) and not isinstance(r[k], bool) for r in rows)}
        summary = {"weights": weights, "host_budget": host, "device_budget": device,
                   "staging": RING, "process": base, "limit": limit,
                   "cgroup": ("v2" if cg.v2 else "v1") if cg else None,
                   "median": med, "reps": rows}
        if a.json:
            print(json.dumps(summary))
            return
        print(f"weights {weights / 2**20:.0f} MiB, host budget {host / 2**20:.0f} MiB "
              f"(kept {med['host_slab_bytes'] / 2**20:.0f} MiB), device budget "
              f"{device / 2**20:.0f} MiB; medians of {a.reps}:")
        print(f"  warm prompt, host budget / all slabs   {med['wall_ratio']:.3f}x")
        print(f"  read from disk per prompt              {med['disk_bytes_per_prompt'] / 2**20:.0f} MiB")
        print(f"  disk stall per warm prompt / its wall  {100 * med['disk_stall_share']:.1f}%")
        print(f"  peak RSS: all slabs {med['full_peak_rss'] / 2**20:.0f} MiB, host budget "
              f"{med['disk_peak_rss'] / 2**20:.0f} MiB")
        print(f"  digests equal                          {all(r['digest_equal'] for r in rows)}")
        print(f"  read by the kernel for the run         {med['kernel_read_bytes'] / 2**20:.0f} MiB "
              f"(mlo counts {med['mlo_read_bytes'] / 2**20:.0f} MiB: the slabs kept, read once, "
              f"and every load from disk)")
        if cg:
            exits = [r["all_slabs_exit"] for r in rows]
            print(f"  in the control group ({'v2' if cg.v2 else 'v1'}, limit {limit / 2**20:.0f} MiB):")
            print(f"    host budget: exits {[r['in_group_exit'] for r in rows]}, digests equal "
                  f"{all(r['in_group_digest_equal'] for r in rows)}, OOM kills "
                  f"{sum(r['in_group_oom_kills'] for r in rows)}, peak usage "
                  f"{med['in_group_peak'] / 2**20:.0f} MiB "
                  f"({100 * med['in_group_peak'] / limit:.0f}% of the limit), page cache left "
                  f"{med['in_group_cache_left'] / 2**20:.1f} MiB")
            print(f"    all slabs:   exits {exits} (-9: killed), OOM kills "
                  f"{sum(r['all_slabs_oom_kills'] for r in rows)}")
    finally:
        if cg:
            cg.remove()
        shutil.rmtree(tmp, ignore_errors=True)


def inspect_rss(mlo, ckpt):
    """Peak RSS of `mlo inspect` on the pipeline: the process, libraries and
    headers, no weights (from wait4's rusage, in KiB on Linux)."""
    p = subprocess.Popen([mlo, "inspect", ckpt], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=ENV)
    _, _, ru = os.wait4(p.pid, 0)
    return ru.ru_maxrss * 1024


def fmt(v):
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 1 << 20:
        return f"{v / 2**20:.0f} MiB"
    return str(v)


if __name__ == "__main__":
    main()
