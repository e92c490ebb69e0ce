#!/usr/bin/env python3
"""plan_check.py — does `mlo plan` predict `mlo run`?

For each pipeline size and policy: one real run on the host platform with
a throttled link (`mlo run --link B --json`), then the projection of the
same flags (`mlo plan --link B --step-time ...`) given that run's own mean
forward time per component.  Prints, per case, the measured and projected
wall and stall of the whole run — every prompt, the cold one included,
since its forwards are in the means the projection is given — and their
ratios (one run each, so the machine's noise is in the compute times the
projection is given, not in the comparison).  The validation target (issue 13): wall within 10%,
stall within 5% (of the measured wall: a stall near zero has no useful
relative error).  A fourth case per size runs the budget policy on a device
of 60% of the largest component, so the DiTs stream their blocks
(docs/streaming.md); a fifth runs it again with 1 MiB of host memory for
the weights, so every component lives on disk and the DiTs read each
streamed block from their files at each use (docs/disk.md), the reader
paced to --disk-bw (MLO_DISK_BW) and the projection given the same disk.
Two-device rows (issue 45) run one pipeline over two throttled host
stand-ins (`mlo run --platform host:prefault=1 --platform host:prefault=1`,
each --device-memory C and --link B) against `mlo plan --devices 2` of the
same card: placement's bytes must equal, the wall within 10%.

usage: bench/plan_check.py [--mlo build/tools/mlo/mlo] [--scales 0.002,0.005] [--full-depth]
       [--link 4e8] [--disk-bw 2e8] [--steps 8] [--prompts 3] [--json]
Writes only under a temporary folder it creates (the generated pipelines).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

POLICIES = [
    ("strict", ["--policy", "strict"]),
    ("budget", ["--policy", "budget", "--no-prefetch"]),
    ("budget+prefetch", ["--policy", "budget"]),
]


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=dict(os.environ, **(env or {}))).stdout
    return json.loads(out)


def case(mlo, path, capacity, link, steps, prompts, name, flags, disk_bw=None):
    common = ["--device-memory", str(capacity), "--link", str(link), "--steps", str(steps),
              "--prompts", str(prompts)] + flags
    run = run_json([mlo, "run", path, "--platform", "host:prefault=1", "--json"] + common,
                   env={"MLO_DISK_BW": str(disk_bw)} if disk_bw else None)
    times = []
    for c in run["components"]:
        if c["forwards"]:
            # a streamed forward waits for its blocks inside the forward:
            # that is stall, which the projection models, not compute
            compute = c["forward_s"] - c.get("block_stall_s", 0)
            times.append("%s=%.9f" % (c["name"], compute / c["forwards"]))
    # the host-platform run has no CUDA context and no activations of its
    # own: the projection keeps no reserve either
    plan = run_json([mlo, "plan", path, "--json", "--reserve", "0", "--step-time", ",".join(times)]
                    + common + (["--disk-bw", str(disk_bw)] if disk_bw else []))
    (pol,) = [p for p in plan["policies"] if p["policy"] == name]
    # the whole run, cold prompt included: the forward times given are its means
    wall, stall = run["wall_s"], run["stall_s"]
    return {
        "policy": name, "run_wall_s": wall, "plan_wall_s": pol["total_wall_s"],
        "run_stall_s": stall, "plan_stall_s": pol["total_stall_s"],
        "wall_ratio": pol["total_wall_s"] / wall,
        "stall_error_of_wall": (pol["total_stall_s"] - stall) / wall,
        "run_h2d": run["h2d_bytes"], "plan_h2d": pol["total_h2d_bytes"],
        "run_disk": run.get("disk_read_bytes", 0), "plan_disk": pol.get("total_disk_read_bytes", 0),
    }


def case_two(mlo, path, capacity, link, steps, prompts, name, flags):
    """One pipeline over two host stand-ins of `capacity` and `link` each,
    and `mlo plan --devices 2` of the same device given its forward times."""
    common = ["--device-memory", str(capacity), "--link", str(link), "--steps", str(steps),
              "--prompts", str(prompts)] + flags
    run = run_json([mlo, "run", path, "--platform", "host:prefault=1", "--platform",
                    "host:prefault=1", "--json"] + common)
    times = ["%s=%.9f" % (c["name"], (c["forward_s"] - c.get("block_stall_s", 0)) / c["forwards"])
             for c in run["components"] if c["forwards"]]
    plan = run_json([mlo, "plan", path, "--json", "--devices", "2", "--reserve", "0",
                     "--step-time", ",".join(times)] + common)
    (pol,) = [p for p in plan["devices"]["policies"] if p["policy"] == name]
    if not pol["fits"]:
        raise SystemExit("plan --devices 2: %s does not fit: %s" % (name, pol["why"]))
    where = lambda devs: " | ".join(",".join(sorted(d["components"])) for d in devs)
    run_where = where([{"components": [c["name"] for c in run["components"]
                                       if c["device"] == d["index"]]} for d in run["devices"]])
    wall = run["wall_s"]
    return {
        "policy": name + " x2", "run_wall_s": wall, "plan_wall_s": pol["total_wall_s"],
        "run_stall_s": run["stall_s"], "plan_stall_s": pol["total_stall_s"],
        "wall_ratio": pol["total_wall_s"] / wall,
        "stall_error_of_wall": (pol["total_stall_s"] - run["stall_s"]) / wall,
        "run_h2d": run["h2d_bytes"], "plan_h2d": pol["total_h2d_bytes"],
        "run_disk": 0, "plan_disk": 0,
        "run_placement": run_where, "plan_placement": where(pol["devices"]),
        "run_modelled": run["placement"]["moved_bytes"],
        "plan_modelled": pol["placement"]["moved_bytes"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mlo", default="build/tools/mlo/mlo")
    ap.add_argument("--scales", default="0.002,0.005")
    ap.add_argument("--link", default="4e8")
    ap.add_argument("--disk-bw", default="2e8",
                    help="the disk's rate for the case on disk (bytes per second)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--full-depth", action="store_true",
                    help="the pipelines at the real layer count (mlo synth --full-depth)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlo-plan-check-") as tmp:
        for scale in [float(s) for s in a.scales.split(",")]:
            path = os.path.join(tmp, "wan-%g" % scale)
            subprocess.run([a.mlo, "synth", "wan2.2-t2v", path, "--scale", str(scale),
                            *(["--full-depth"] if a.full_depth else [])],
                           check=True, capture_output=True)
            info = run_json([a.mlo, "inspect", path, "--json"])
            need = info["model_offload_bytes"]
            largest = max(c["device_bytes"] for c in info["components"])
            # the strict need plus half of the largest component: room to keep something
            capacity = need + largest // 2
            for name, flags in POLICIES:
                r = case(a.mlo, path, capacity, a.link, a.steps, a.prompts, name, flags)
                r["scale"] = scale
                rows.append(r)
            # a device of 60% of the largest component (or the least it
            # streams in): the budget policy streams the DiTs' blocks
            least = max(c["blocks"]["stream_least_bytes"] for c in info["components"])
            small = max(largest * 3 // 5, least)
            if small < largest:
                r = case(a.mlo, path, small, a.link, a.steps, a.prompts, "budget+prefetch",
                         ["--policy", "budget"])
                r["policy"] = "streamed"
                r["scale"] = scale
                rows.append(r)
                r = case(a.mlo, path, small, a.link, a.steps, a.prompts, "budget+prefetch",
                         ["--policy", "budget", "--host-memory", "1M"], disk_bw=a.disk_bw)
                r["policy"] = "streamed, disk"
                r["scale"] = scale
                rows.append(r)
            # two devices of 130% of the largest component: one expert each
            # fits, the encoder beside one of them or not (issue 45)
            two = largest + largest * 3 // 10
            for name, flags in (("strict", ["--policy", "strict"]),
                                ("budget+prefetch", ["--policy", "budget"])):
                r = case_two(a.mlo, path, two, a.link, a.steps, a.prompts, name, flags)
                r["scale"] = scale
                rows.append(r)
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("%-6s %-18s %9s %9s %6s  %8s %8s %9s  %s" % (
        "scale", "policy", "run wall", "plan", "ratio", "run stal", "plan", "err/wall",
        "moved run/plan (read from disk run/plan)"))
    for r in rows:
        disk = " (%d/%d)" % (r["run_disk"], r["plan_disk"]) if r["run_disk"] or r["plan_disk"] else ""
        print("%-6g %-18s %8.3fs %8.3fs %6.3f  %7.3fs %7.3fs %+8.2f%%  %d/%d%s" % (
            r["scale"], r["policy"], r["run_wall_s"], r["plan_wall_s"], r["wall_ratio"],
            r["run_stall_s"], r["plan_stall_s"], 100 * r["stall_error_of_wall"],
            r["run_h2d"], r["plan_h2d"], disk))
    for r in rows:
        if "run_placement" in r:
            print("%-6g %-18s placed run [%s] plan [%s]; bytes %s; modelled %d/%d" % (
                r["scale"], r["policy"], r["run_placement"], r["plan_placement"],
                "equal" if r["run_h2d"] == r["plan_h2d"] else "DIFFER",
                r["run_modelled"], r["plan_modelled"]))
    ratios = sorted(r["wall_ratio"] for r in rows)
    errs = sorted(abs(r["stall_error_of_wall"]) for r in rows)
    print("median wall ratio %.3f (range %.3f..%.3f); largest |stall error| %.2f%% of wall" % (
        ratios[len(ratios) // 2], ratios[0], ratios[-1], 100 * errs[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
