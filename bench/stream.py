#!/usr/bin/env python3
"""stream.py — a DiT larger than the budget, streamed block by block,
against the same pipeline all resident and warm (issue 23's targets).

On a generated Wan2.2-shaped pipeline (at full depth: 40 blocks a DiT, as
the real one, each a real block's share of it; --depth scaled is the
preset's plain scaling, 5 blocks at 0.002, whose large prologue and few
blocks stream unlike the real model), `mlo run` on the host platform:
  all resident  --offload none, warm (the --verify reference: weights kept
                across prompts, as a server runs);
  streamed      --policy budget --budget F x the largest DiT, so each DiT
                streams most of its blocks through two slots every step.
The link is throttled so that one block's copy takes about one block's
compute (--link-ratio 1; 0.5 makes a block's copy twice its compute): the
block's compute is measured first, from the all-resident run's DiT step
time divided by its blocks.  The host link is a copy thread sleeping to a
rate (docs/platforms.md), a stand-in for a PCIe link of a GPU whose
compute-to-transfer ratio per block is the same (an H100 on PCIe Gen5
running a bf16 Wan2.2 block: ~25 ms of compute for ~700 MB at ~25 GB/s).

It prints, per repetition and as medians: the steady prompt's wall time
streamed over all resident (the exposed cost), the time waited for block
copies, the bytes copied per prompt against the streamed blocks' bytes
times the DiT steps (the copies must be exactly those), the peak device
bytes against the budget, whether the digests are equal, and the physical
bound max(compute, bytes / link) per prompt the streamed run is judged
against at slow links.

usage: bench/stream.py [--mlo build/tools/mlo/mlo] [--scale 0.002] [--depth full]
                       [--fraction 0.6] [--link-ratio 1] [--steps 8]
                       [--prompts 4] [--reps 3] [--whole-loads-too]
                       [--unjoined-too] [--json]
(--fraction 1 is the strict-memory case: a budget of exactly the largest
DiT, which then moves whole and its switches join; --whole-loads-too pairs
each repetition with a run whose loads are whole, as before progressive
loads; --unjoined-too with a run whose switches are not joined,
MLO_NO_JOIN=1, as before the joined switch.)
Writes only under a temporary folder of its own.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ENV = dict(os.environ, MLO_LOG="error")


def run(mlo, *args, env=None):
    p = subprocess.run([mlo, *args], capture_output=True, text=True, env=env or ENV)
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def steady(res, key="wall_s"):
    return statistics.median(g[key] for g in res["generations"][1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mlo", default="build/tools/mlo/mlo")
    ap.add_argument("--scale", default="0.002")
    ap.add_argument("--depth", choices=("full", "scaled"), default="full",
                    help="the real layer count (synth --full-depth), or scaled with the widths")
    ap.add_argument("--fraction", type=float, default=0.6)
    ap.add_argument("--link-ratio", type=float, default=1.0,
                    help="one block's compute time over its copy time")
    ap.add_argument("--steps", default="8")
    ap.add_argument("--prompts", default="4")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--whole-loads-too", dest="whole_too", action="store_true",
                    help="each repetition also runs with --whole-loads, paired")
    ap.add_argument("--unjoined-too", dest="unjoined_too", action="store_true",
                    help="each repetition also runs with MLO_NO_JOIN=1, paired")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlo-stream-") as tmp:
        ckpt = os.path.join(tmp, "wan")
        run(a.mlo, "synth", "wan2.2-t2v", ckpt, "--scale", a.scale,
            *(("--full-depth",) if a.depth == "full" else ()))
        info = json.loads(run(a.mlo, "inspect", ckpt, "--json"))
        dit = max((c for c in info["components"] if c["role"] == "dit"),
                  key=lambda c: c["device_bytes"])
        blocks = dit["blocks"]
        budget = int(dit["device_bytes"] * a.fraction)
        # a host device that behaves like a GPU: memory backed up front (as
        # large as the all-resident reference needs), no poison fill
        # competing with compute for the CPU (as mlo bench and mlo demo)
        plat = "host:prefault=1,poison=0,capacity=%d" % (info["all_resident_bytes"] * 5 // 4)
        common = ("--platform", plat, "--json", "--steps", a.steps, "--prompts", a.prompts,
                  "--verify")
        # the compute of one block, from an all-resident run without a link
        probe = json.loads(run(a.mlo, "run", ckpt, "--offload", "none", *common[:-1]))
        pd = next(c for c in probe["components"] if c["name"] == dit["name"])
        block_s = pd["forward_s"] / pd["forwards"] / blocks["count"]
        link = blocks["largest_bytes"] / (block_s / a.link_ratio)
        reps = []
        variants = (["progressive"] + (["unjoined"] if a.unjoined_too else [])
                    + (["whole"] if a.whole_too else []))
        for i in range(a.reps * len(variants)):
            kind = variants[i % len(variants)]  # paired: each variant once per rep, in turn
            whole = kind == "whole"
            res = json.loads(run(a.mlo, "run", ckpt, "--policy", "budget", "--budget",
                                 str(budget), "--link", f"{link:.6g}", *common,
                                 *(("--whole-loads",) if whole else ()),
                                 env=dict(ENV, MLO_NO_JOIN="1") if kind == "unjoined" else None))
            comps = [c for c in res["components"] if c["stream"]]
            streamed = {c["name"]: c["stream"]["streamed_bytes_per_forward"] for c in comps}
            per_prompt_blocks = sum(streamed[c["name"]] * c["forwards"] for c in comps) / int(a.prompts)
            gens = res["generations"][1:]
            block_stall = sum(c["block_stall_s"] for c in comps) / int(a.prompts)
            compute = res["reference_steady_wall_s"]
            moved = statistics.median(g["h2d_bytes"] for g in gens)
            reps.append({
                "loads": kind,
                "joined_loads": sum(c.get("joined_loads", 0) for c in res["components"]),
                "ratio": res["steady_ratio"],
                "exposed": 1 + steady(res, "stall_s") / compute,
                "stall_s": steady(res, "stall_s"),
                "block_stall_s": block_stall,
                "streamed_block_bytes_per_prompt": per_prompt_blocks,
                "h2d_bytes_per_prompt": moved,
                "peak_device_bytes": res["peak_device_bytes"],
                "budget_bytes": budget,
                "verified": res["verified"],
                "digests_agree": res["digests_agree"],
                "bound_s": max(compute, moved / link),
                "wall_s": steady(res),
            })
        prog = [r for r in reps if r["loads"] == "progressive"]
        out = {"scale": a.scale, "depth": a.depth, "dit": dit["name"], "dit_bytes": dit["device_bytes"],
               "blocks": blocks["count"], "budget_bytes": budget, "link_bytes_per_s": link,
               "block_compute_s": block_s, "reps": reps,
               "median_wall_ratio": statistics.median(r["ratio"] for r in prog),
               "median_exposed": statistics.median(r["exposed"] for r in prog),
               "median_bound_ratio": statistics.median(r["wall_s"] / r["bound_s"] for r in prog),
               "median_stall_s": statistics.median(r["stall_s"] for r in prog)}
        others = {}
        for kind in variants[1:]:
            rs = [r for r in reps if r["loads"] == kind]
            others[kind] = {
                "median_exposed": statistics.median(r["exposed"] for r in rs),
                "median_stall_s": statistics.median(r["stall_s"] for r in rs),
                "median_stall_ratio": statistics.median(
                    p["stall_s"] / w["stall_s"] for p, w in zip(prog, rs) if w["stall_s"] > 0)}
            out[kind] = others[kind]
        if a.json:
            print(json.dumps(out, indent=1))
            return
        print(f"{dit['name']}: {dit['device_bytes'] / 2**20:.1f} MiB, {blocks['count']} blocks; "
              f"budget {budget / 2**20:.1f} MiB ({a.fraction:.0%}); link {link / 1e6:.0f} MB/s "
              f"(a block's copy = {1 / a.link_ratio:.2g} x its compute, {block_s * 1e3:.1f} ms)")
        for i, r in enumerate(reps):
            print(f"  rep {i + 1} ({r['loads']} loads): exposed {r['exposed']:.3f}; steady prompt "
                  f"{r['wall_s']:.3f} s = {r['ratio']:.3f}x all "
                  f"resident, {r['wall_s'] / r['bound_s']:.3f}x max(compute, bytes/link); "
                  f"waited {r['stall_s']:.3f} s ({r['block_stall_s']:.3f} s for "
                  f"blocks); copied {r['h2d_bytes_per_prompt'] / 2**20:.1f} MiB/prompt; peak "
                  f"{r['peak_device_bytes'] / 2**20:.1f} MiB <= budget: "
                  f"{r['peak_device_bytes'] <= budget}; identical: {r['verified']}; "
                  f"{r['joined_loads']} loads joined")
        for kind, o in others.items():
            print(f"{kind} loads: exposed {o['median_exposed']:.3f}, waited "
                  f"{o['median_stall_s']:.3f} s per prompt; progressive waits "
                  f"{o['median_stall_ratio']:.2f}x that (median of paired reps)")
        print(f"medians (progressive): exposed {out['median_exposed']:.3f}; "
              f"wall {out['median_wall_ratio']:.3f}x all resident, warm (noisy on a "
              f"shared machine); {out['median_bound_ratio']:.3f}x max(compute, bytes/link); "
              f"waited {out['median_stall_s']:.3f} s per prompt")


if __name__ == "__main__":
    main()
