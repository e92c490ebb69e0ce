#!/usr/bin/env python3
"""ranks.py — what several ranks on one node cost, with and without mlo's
node-shared slabs and sharded loads (issue 14's targets).

On a generated Wan2.2-shaped pipeline, under mpirun on this machine:
  independent  N plain `mlo run` processes (what each rank does today: its
               own slabs, its own read of the whole checkpoint);
  shared       `mlo run --ranks shared`: one slab per component per node,
               each rank reading 1/N, every rank loading whole components;
  sharded      `mlo run --ranks sharded`: the same slabs, each rank copying
               1/N of a component over its (throttled) link and the node
               all-gathering the rest;
  one rank     the same run alone: the switch time sharding is measured
               against.
It prints per mode the node's host slab memory (the sum of the ranks'
proportional set sizes of their slab mappings, so a shared page counts
once) and bytes read from disk, each against the weights, and the strict
policy's stall per prompt (every switch exposed) against one rank's, median
of the steady prompts, ratios within one run.  The link is throttled per
rank (--link); the all-gather runs over MPI's shared memory, which stands
in for the GPUs' fabric, so the link must be slow against it as PCIe is
against NVLink (1:18-36): the default 2e7 B/s is about 1/25 of what the
all-gather reaches on a 2-core machine with 4 ranks.

Then, for each named topology (--nodes, mlo plan's node profiles, their
uplinks and fabric at the profile's ratios to --link): what --ranks auto
chose, and the sharded/replicated stall ratio modelled against measured.

usage: bench/ranks.py [--mlo build/tools/mlo/mlo] [--ranks 4] [--scale 0.001]
                      [--full-depth] [--link 2e7] [--steps 4] [--prompts 3] [--nodes A,B]
                      [--json]
Writes only under a temporary folder of its own.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

# MPIEXEC_TIMEOUT: a hung job is ended by mpirun, which removes its ranks'
# shared-memory segments (an interrupted mpirun would leave them in /dev/shm)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", MLO_LOG="error", MPIEXEC_TIMEOUT="900")


def mpirun(n, args, outdir):
    os.makedirs(outdir, exist_ok=True)
    subprocess.run(["mpirun", "-np", str(n), "--output-filename", outdir] + args,
                   check=True, env=ENV, stdout=subprocess.DEVNULL)
    # one JSON object per rank, each in its own file (a plain run's is
    # several lines, a --ranks run's one)
    return [json.loads(open(f).read())
            for f in sorted(glob.glob(os.path.join(outdir, "1", "rank.*", "stdout")))]


def steady(gens, key):
    vals = [g[key] for g in gens[1:]] or [g[key] for g in gens]
    return statistics.median(vals)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mlo", default="build/tools/mlo/mlo")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--scale", default="0.001")
    ap.add_argument("--link", default="2e7")
    ap.add_argument("--steps", default="4")
    ap.add_argument("--prompts", default="3")
    ap.add_argument("--nodes", default="h100-sxm-8,l40s-4,rtx4090-2",
                    help="named topologies to run --ranks auto on (comma-separated; '' for none)")
    ap.add_argument("--full-depth", action="store_true",
                    help="the pipeline at the real layer count (mlo synth --full-depth): 40 "
                         "blocks a DiT, as block-by-block loads (both modes) see the real one")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    mlo = os.path.abspath(a.mlo)
    n = a.ranks
    with tempfile.TemporaryDirectory(prefix="mlo-ranks-") as tmp:
        path = os.path.join(tmp, "wan")
        subprocess.run([mlo, "synth", "wan2.2-t2v", path, "--scale", a.scale,
                        *(["--full-depth"] if a.full_depth else [])], check=True,
                       capture_output=True)
        info = json.loads(subprocess.run([mlo, "inspect", path, "--json"], check=True,
                                         capture_output=True, text=True).stdout)
        weights = info["tensor_bytes"]
        cap = str(info["model_offload_bytes"] + (1 << 20))
        common = [mlo, "run", path, "--device-memory", cap, "--link", a.link, "--steps", a.steps,
                  "--prompts", a.prompts, "--json"]
        rows = {}
        one = mpirun(1, common, os.path.join(tmp, "one"))[0]
        rows["one rank"] = {"slab": one["slab_pss_bytes"], "read": one["load_bytes"],
                            "stall": steady(one["generations"], "stall_s")}
        ind = mpirun(n, common, os.path.join(tmp, "ind"))
        rows["independent"] = {"slab": sum(o["slab_pss_bytes"] for o in ind),
                               "read": sum(o["load_bytes"] for o in ind),
                               "stall": statistics.median(steady(o["generations"], "stall_s")
                                                          for o in ind)}
        for mode in ("shared", "sharded"):
            objs = mpirun(n, common + ["--ranks", mode, "--verify"], os.path.join(tmp, mode))
            assert all(o["verified"] for o in objs), "a rank's digest differs"
            assert len({o["digest"] for o in objs}) == 1
            rows[mode] = {"slab": sum(o["slab_pss_bytes"] for o in objs),
                          "read": sum(o["disk_read_bytes"] for o in objs),
                          "stall": statistics.median(o["steady_stall_s"] for o in objs),
                          "gather_s": statistics.median(o["gather_s"] for o in objs),
                          "gather_bytes": objs[0]["gather_bytes"]}
        nodes = {}
        for node in [x for x in a.nodes.split(",") if x]:
            # --ranks auto decides; the other mode, forced, is what it decided against
            auto = mpirun(n, common + ["--ranks", "auto", "--node", node],
                          os.path.join(tmp, node + "-auto"))
            chose = auto[0]["mode"]
            other = "shared" if chose == "sharded" else "sharded"
            forced = mpirun(n, common + ["--ranks", other, "--node", node],
                            os.path.join(tmp, node + "-" + other))
            assert len({o["digest"] for o in auto + forced}) == 1, "a rank's digest differs"
            stall = {chose: statistics.median(o["steady_stall_s"] for o in auto),
                     other: statistics.median(o["steady_stall_s"] for o in forced)}
            nodes[node] = {"chose": chose, "stall": stall,
                           "modelled": {"shared": auto[0]["modelled_replicated_s_per_gib"],
                                        "sharded": auto[0]["modelled_sharded_s_per_gib"]}}
    base = rows["one rank"]["stall"]
    if a.json:
        print(json.dumps({"ranks": n, "weights_bytes": weights, "link": float(a.link),
                          "rows": rows, "nodes": nodes}, indent=1))
        return 0
    print("%d ranks, weights %.1f MiB, link %.0f MB/s per rank, strict policy, %s steps, "
          "%s prompts" % (n, weights / 2**20, float(a.link) / 1e6, a.steps, a.prompts))
    print("%-12s %14s %14s %14s %10s" % ("mode", "node slabs", "node reads", "stall/prompt",
                                          "vs 1 rank"))
    # "sharded" here gathers as fast as MPI's shared memory goes (no fabric
    # modelled: about 25x the default link); the named topologies below
    # hold the gather to a fabric's rate
    for name in ("one rank", "independent", "shared", "sharded"):
        r = rows[name]
        print("%-12s %8.1f MiB %4.2fx %8.1f MiB %4.2fx %12.3f s %9.2fx" % (
            name, r["slab"] / 2**20, r["slab"] / weights, r["read"] / 2**20, r["read"] / weights,
            r["stall"], r["stall"] / base))
    if nodes:
        print("\nnamed topologies (mlo run --node; the links at the profile's ratios to %.0f MB/s "
              "per rank):" % (float(a.link) / 1e6))
        print("%-11s %-10s %19s %21s %7s %14s" % ("node", "auto", "modelled sharded/repl",
                                                "measured sharded/repl", "right?",
                                                "auto vs 1 rank"))
        for node, r in nodes.items():
            m = r["modelled"]["sharded"] / r["modelled"]["shared"]
            x = r["stall"]["sharded"] / r["stall"]["shared"]
            print("%-11s %-10s %18.2fx %20.2fx %7s %13.2fx" % (
                node, "sharded" if r["chose"] == "sharded" else "replicated", m, x,
                "yes" if (r["chose"] == "sharded") == (x < 1) or abs(x - 1) < 0.05 else "NO",
                r["stall"][r["chose"]] / base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
