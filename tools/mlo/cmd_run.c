/*
 * cmd_run.c — `mlo run PATH ...`: the reference workload on a checkpoint
 * (encoders once, the DiT(s) for N steps, the VAE once), offloaded or all
 * resident, with --verify comparing the digest against an all-resident run
 * in the same process and auditing the exclusion invariant at every
 * forward.  Refuses a device too small before loading anything onto it,
 * with a message that says what to change (exit 3).
 */
#include "plan.h"
#include "tool.h"

#include "base/hash.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  tool_source src;
  tool_split_args split;
  const char *platform, *trace, *timeline;
  bool have_capacity, have_link, verify, json, literal, no_prefetch, read_check, learn;
  bool whole_loads;
  uint64_t capacity, link;
  int policy; /* an mlo_policy */
  bool have_budget, have_reserve, have_host;
  uint64_t budget, reserve, host;
  long prompts;
  int offload; /* index into offload_words */
  int sync;    /* index into sync_words */
  long steps;
  int tokens[4];
  int ranks;             /* index into ranks_words; -1: one process */
  const plan_node *node; /* --node */
  double rank_timeout;   /* seconds */
  tool_ranks rk;
  /* --platform repeated: one pipeline over several devices (docs/placement.md) */
  const char *platforms[TOOL_MAX_DEVICES];
  size_t nplatforms;
  const char *place_args[TOOL_MAX_DEVICES * 4]; /* --place NAME=DEVICE, as given */
  size_t nplace;
  tool_place place[TOOL_MAX_DEVICES * 4];
  char place_names[TOOL_MAX_DEVICES * 4][128];
} run_args;

static const char *const offload_words[] = {"none", "model", NULL};
static const char *const sync_words[] = {"event", "device", NULL};
static const char *const ranks_words[] = {"shared", "sharded", "auto", NULL};
enum { RANKS_SHARED, RANKS_SHARDED, RANKS_AUTO };

static void help(void) {
  printf("usage: mlo run PATH [flags]\n"
         "       mlo run --diffusion-model F --t5xxl F --vae F ... [flags]\n\n"
         "Runs the reference workload on the checkpoint at PATH (a diffusers directory,\n"
         "a component folder, a .safetensors or .gguf file) or on separate component\n"
         "files: every encoder once, the DiT(s) for --steps steps, every VAE once.  Two\n"
         "DiTs split as Wan2.2's experts do in diffusers: the first while the scheduler's\n"
         "timestep is at least boundary_ratio x 1000 (model_index.json and\n"
         "scheduler/scheduler_config.json say both).  Each forward computes Y = X*W^T for\n"
         "every 2-D weight on the device and folds Y into a digest; it is a benchmark\n"
         "workload, not a model.  The digest depends on the weights (names, contents)\n"
         "and the schedule, not on how files split them.\n\n"
         "flags:\n"
         "  --platform P          host[:opts] | cuda[:N] | opencl[:N] (default host).\n"
         "                        Repeated: one pipeline over several devices of one\n"
         "                        kind, each component placed on one of them at enable\n"
         "                        to move the fewest bytes per prompt (docs/placement.md);\n"
         "                        --device-memory and --link apply to each\n"
         "  --place NAME=DEVICE   pin a component to a device: its index among the\n"
         "                        --platform flags (0, 1, ...) or a --platform value\n"
         "                        given once (cuda:1); repeatable\n"
         "  --device-memory SIZE  the device memory mlo may use, e.g. 512M, 24G: the\n"
         "                        host device's capacity, or a cap on a real GPU\n"
         "                        (to run as on a smaller card); wins over a\n"
         "                        capacity= inside --platform (a note says so)\n"
         "  --link BYTES_PER_S    host platform: throttle copies to this link bandwidth,\n"
         "                        e.g. 25e9 (as bw= does; mlo plan takes the same flag)\n"
         "  --offload MODE        model (default): only the executing component resident;\n"
         "                        none: every component resident\n"
         "  --policy P            strict (default): the specification's exclusion rule,\n"
         "                        nothing kept that it excludes; budget: keep what fits\n"
         "                        in a device budget, evict by next use in the run's\n"
         "                        schedule, prefetch what comes next (docs/planner.md)\n"
         "  --budget SIZE         budget policy: device memory mlo may keep (default:\n"
         "                        what is free at enable, less --reserve)\n"
         "  --reserve SIZE        budget policy: leave SIZE free for your own\n"
         "                        allocations (activations, workspaces)\n"
         "  --no-prefetch         budget policy: load on demand only\n"
         "  --whole-loads         load each component in one piece, the forward waiting\n"
         "                        for all of it (default: block by block, each block's\n"
         "                        compute waiting only for its own copy: docs/streaming.md)\n"
         "  --learn-schedule      budget policy: declare no schedule; libmlo learns it\n"
         "                        from the first prompt's calls (as mlo.torch does) and\n"
         "                        prefetches from the second (--prompts 2 or more)\n"
         "  --host-memory SIZE    host memory the weights may keep, e.g. 16G: what does\n"
         "                        not fit stays in its checkpoint file and each load\n"
         "                        reads it through a 64 MiB pinned staging ring; the\n"
         "                        components used least per prompt go to disk first\n"
         "                        (docs/disk.md); a DiT that streams keeps only the\n"
         "                        blocks it streams, or reads each from disk at each\n"
         "                        use where even those do not fit.  With --ranks:\n"
         "                        each rank reads its slice of a component on disk\n"
         "                        and the node gathers the rest (a streamed DiT: each\n"
         "                        rank its own).  The report shows the disk's\n"
         "                        reads and stall and the peak RSS\n"
         "  --prompts N           N generations in one process (default 1); the report\n"
         "                        shows each, so the warm steady state is visible\n"
         "  --sync MODE           event (default) | device (synchronize before each\n"
         "                        forward, as the specification states it)\n"
         "  --literal             the specification-literal baseline: --sync device,\n"
         "                        one copy per tensor, every tensor copied back\n"
         "  --steps N             DiT steps (default 8)\n" TOOL_SPLIT_HELP
         "  --tokens ROLE=T       tokens per forward for a role (dit 32, encoder 16, vae 8)\n"
         "  --verify              audit every forward and compare the digest with an\n"
         "                        all-resident run (exit 1 if they differ)\n"
         "  --json                one JSON object on stdout\n"
         "  --trace FILE          Chrome trace-event JSON (open in ui.perfetto.dev)\n"
         "  --timeline FILE.svg   residency timeline picture\n"
         "  --ranks MODE          under mpirun: every rank runs the pipeline, the ranks of\n"
         "                        a node share one host slab per component and each reads\n"
         "                        1/n of the checkpoint; shared: each rank loads whole\n"
         "                        components from the shared slab; sharded: each copies\n"
         "                        1/n and the node's ranks all-gather the rest; auto:\n"
         "                        whichever the node's topology makes faster (--node, or\n"
         "                        the host platform's group=, uplink=, fabric=),\n"
         "                        replicated where it is not known\n"
         "                        (docs/distributed.md).  With --platform cuda, node\n"
         "                        rank r runs on cuda:r and sharded loads gather with\n"
         "                        NCCL over a communicator mlo makes for the node; a\n"
         "                        gather that fails or stalls past --rank-timeout fails\n"
         "                        every rank.  Reports every rank (--json: one line per\n"
         "                        rank) and the node's host memory and disk reads\n"
         "  --node NODE           with --ranks: the node the ranks run on, a profile of\n"
         "                        mlo plan (h100-sxm-8, l40s-4, rtx4090-2): --ranks auto\n"
         "                        decides from it; on the host platform it also models\n"
         "                        the node's uplinks and fabric at the profile's ratios\n"
         "                        to --link\n"
         "  --rank-timeout S      how long a collective step waits for a missing rank\n"
         "                        before failing on every rank (default 60); MPI_Init\n"
         "                        too: a rank that exited before starting MPI ends the\n"
         "                        others then, not never\n"
         "  --read-check          before loading, time a plain read of the same files\n"
         "                        (both cold: their pages dropped from the cache first)\n"
         "                        and report the load's speed against it\n" TOOL_SOURCE_HELP "\n"
         "examples:\n"
         "  mlo run ./mlo-cache/wan2.2-t2v-full-depth-0.005 --device-memory 256M --verify\n"
         "  mlo run Wan2.2-T2V-A14B-Diffusers --variant fp16 --steps 40 --verify\n"
         "  mlo run --high-noise-diffusion-model wan2.2_t2v_high_noise_14B_Q4_K_M.gguf \\\n"
         "          --diffusion-model wan2.2_t2v_low_noise_14B_Q4_K_M.gguf \\\n"
         "          --t5xxl umt5_xxl_fp8_e4m3fn_scaled.safetensors --vae wan_2.1_vae.safetensors\n"
         "  mlo run ckpt --policy budget --budget 1G --prompts 4 --verify\n"
         "  mlo run ckpt --policy budget --host-memory 8G --prompts 3\n"
         "  mlo run /models/Wan2.2-T2V-A14B --platform cuda:0 --steps 40 --json\n"
         "  mlo run ckpt --offload none --trace run.json --timeline run.svg\n"
         "  mpirun -np 4 mlo run ckpt --ranks sharded --link 2e8 --verify\n"
         "  mpirun -np 4 mlo run ckpt --ranks auto --node l40s-4 --link 2e8\n\n"
         "exit codes: 0 ok, 1 verification failed, 2 bad usage or input,\n"
         "3 out of device memory (or --host-memory below what must stay in host\n"
         "memory), 4 other failure.\n");
}

static bool parse_tokens(targs *a, const char *val, int tokens[4]) {
  if (!val) return false;
  const char *eq = strchr(val, '=');
  char role_name[16];
  mlo_role role;
  long t;
  if (!eq || (size_t)(eq - val) >= sizeof role_name) goto bad;
  memcpy(role_name, val, (size_t)(eq - val));
  role_name[eq - val] = '\0';
  if (mlo_role_from_name(role_name, &role) || role == MLO_ROLE_AUTO) goto bad;
  if (!targs_int(a, "--tokens", eq + 1, 1, MLO_WORKLOAD_TOKENS_MAX, &t)) return false;
  tokens[role] = (int)t;
  return true;
bad:
  targs_error(a, "--tokens: expected ROLE=T with ROLE one of dit, encoder, vae, other, got '%s'",
              val);
  return false;
}

static bool parse_flag(targs *a, run_args *r) {
  const char *v;
  if (targs_value(a, "--platform", &v)) {
    targs_platform(a, "--platform", v);
    if (r->nplatforms == TOOL_MAX_DEVICES)
      targs_error(a, "--platform: at most %d devices", TOOL_MAX_DEVICES);
    else
      r->platforms[r->nplatforms++] = v;
    r->platform = r->platforms[0];
  } else if (targs_value(a, "--place", &v)) {
    if (r->nplace == sizeof r->place_args / sizeof *r->place_args)
      targs_error(a, "--place: too many");
    else
      r->place_args[r->nplace++] = v;
  } else if (targs_value(a, "--device-memory", &v)) {
    r->have_capacity = targs_size(a, "--device-memory", v, &r->capacity);
  } else if (targs_value(a, "--link", &v)) {
    r->have_link = targs_size(a, "--link", v, &r->link);
    if (r->have_link && r->link < 1000000)
      targs_error(a, "--link: %s bytes per second is below 1e6", v);
  } else if (targs_value(a, "--offload", &v)) {
    targs_choice(a, "--offload", v, offload_words, &r->offload);
  } else if (targs_value(a, "--policy", &v)) {
    targs_policy(a, "--policy", v, &r->policy);
  } else if (targs_value(a, "--budget", &v)) {
    r->have_budget = targs_size(a, "--budget", v, &r->budget);
  } else if (targs_value(a, "--reserve", &v)) {
    r->have_reserve = targs_size(a, "--reserve", v, &r->reserve);
  } else if (targs_value(a, "--host-memory", &v)) {
    r->have_host = targs_size(a, "--host-memory", v, &r->host); /* refuses 0 */
  } else if (targs_value(a, "--prompts", &v)) {
    targs_int(a, "--prompts", v, 1, 1000, &r->prompts);
  } else if (targs_flag(a, "--no-prefetch")) {
    r->no_prefetch = true;
  } else if (targs_flag(a, "--whole-loads")) {
    r->whole_loads = true;
  } else if (targs_flag(a, "--learn-schedule")) {
    r->learn = true;
  } else if (targs_value(a, "--sync", &v)) {
    targs_choice(a, "--sync", v, sync_words, &r->sync);
  } else if (targs_value(a, "--steps", &v)) {
    targs_int(a, "--steps", v, 1, 100000, &r->steps);
  } else if (split_flag(a, &r->split) || source_flag(a, &r->src)) {
  } else if (targs_value(a, "--tokens", &v)) {
    parse_tokens(a, v, r->tokens);
  } else if (targs_value(a, "--trace", &v)) {
    r->trace = v;
  } else if (targs_value(a, "--timeline", &v)) {
    r->timeline = v;
  } else if (targs_flag(a, "--verify")) {
    r->verify = true;
  } else if (targs_flag(a, "--json")) {
    r->json = true;
  } else if (targs_flag(a, "--literal")) {
    r->literal = true;
  } else if (targs_flag(a, "--read-check")) {
    r->read_check = true;
  } else if (targs_value(a, "--ranks", &v)) {
    targs_choice(a, "--ranks", v, ranks_words, &r->ranks);
  } else if (targs_value(a, "--node", &v)) {
    r->node = plan_node_find(v);
    if (v && !r->node) targs_error(a, "--node: unknown node '%s' (mlo plan --help lists them)", v);
  } else if (targs_value(a, "--rank-timeout", &v)) {
    targs_double(a, "--rank-timeout", v, 0.1, 86400, &r->rank_timeout);
  } else {
    return false;
  }
  return true;
}

/* What every rank must be given alike for the ranks to call their
 * components in the same order and load them the same way; never 0. */
static uint64_t run_settings_check(const run_args *ra) {
  const struct {
    uint64_t capacity, link, budget, reserve, host;
    long prompts, steps;
    int policy, offload, sync, flags;
  } s = {ra->have_capacity ? ra->capacity : 0,
         ra->have_link ? ra->link : 0,
         ra->have_budget ? ra->budget : 0,
         ra->have_reserve ? ra->reserve : 0,
         ra->have_host ? ra->host : 0,
         ra->prompts,
         ra->steps,
         ra->policy,
         ra->offload,
         ra->sync,
         ra->no_prefetch | ra->whole_loads << 1 | ra->learn << 2 | ra->literal << 3};
  return mlo_fnv1a(MLO_FNV_BASIS, &s, sizeof s) | 1;
}

/* spec with option key set to the number v, in place, by the library's
 * grammar (mlo_platform_spec_compose: a value given is replaced; a fault
 * wrapper's inner platform gets it).  A spec it cannot read stays as it
 * is: opening it says what is wrong. */
static void spec_set(char *spec, size_t size, const char *key, double v) {
  char value[64], out[512];
  snprintf(value, sizeof value, "%.0f", v);
  if (mlo_platform_spec_compose(spec, -1, key, value, out, sizeof out) == MLO_OK)
    snprintf(spec, size, "%s", out);
}

/* --node on the host platform: its links at the profile's ratios to --link
 * (each rank's), its groups no larger than the node's ranks. */
static void node_options(const run_args *ra, char *spec, size_t size) {
  mlo_node_topology t = plan_node_topology(ra->node, (double)ra->link);
  unsigned group = t.group > 1 ? t.group : 1;
  if (group > (unsigned)ra->rk.node_ranks) group = (unsigned)ra->rk.node_ranks;
  spec_set(spec, size, "group", group);
  spec_set(spec, size, "fabric", t.fabric_bps);
  if (t.uplink_bps > 0 && group > 1) {
    spec_set(spec, size, "uplink", t.uplink_bps);
    spec_set(spec, size, "pcie_p2p", t.fabric_via_uplinks);
  }
}

/* --ranks on CUDA without a device index ("cuda", "cuda:pinned=0"): the
 * node rank's GPU, one per rank; or the only one a launcher that gives
 * each rank its own GPU (CUDA_VISIBLE_DEVICES of one entry) leaves it.
 * -1: an index was given (the user's choice), or another platform. */
static int cuda_rank_index(const char *spec, int node_rank) {
  char name[32];
  int given = -1;
  if (strncmp(spec, "cuda", 4) || mlo_platform_spec_parts(spec, name, sizeof name, &given) ||
      given >= 0) /* another platform (a wrapper's inside is its own), or an index given */
    return -1;
  const char *visible = getenv("CUDA_VISIBLE_DEVICES");
  bool one = visible && *visible && !strchr(visible, ',');
  return one ? 0 : node_rank;
}

/* --place NAME=DEVICE into r->place: DEVICE an index among the --platform
 * flags, or a --platform value given exactly once. */
static void resolve_place(targs *a, run_args *r) {
  size_t ndev = r->nplatforms ? r->nplatforms : 1;
  for (size_t i = 0; i < r->nplace && !a->failed; i++) {
    const char *arg = r->place_args[i], *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1] || (size_t)(eq - arg) >= sizeof r->place_names[i]) {
      targs_error(a, "--place: expected NAME=DEVICE (text_encoder=1, vae=cuda:1), got '%s'", arg);
      return;
    }
    memcpy(r->place_names[i], arg, (size_t)(eq - arg));
    r->place_names[i][eq - arg] = '\0';
    const char *dev = eq + 1;
    long index = -1;
    if (strspn(dev, "0123456789") == strlen(dev)) {
      index = strlen(dev) < 4 ? strtol(dev, NULL, 10) : (long)ndev;
    } else {
      for (size_t k = 0; k < r->nplatforms; k++)
        if (!strcmp(r->platforms[k], dev)) index = index < 0 ? (long)k : -2;
      if (index == -2) {
        targs_error(a, "--place %s: '%s' is given as --platform more than once; name its index",
                    arg, dev);
        return;
      }
    }
    if (index < 0 || (size_t)index >= ndev) {
      targs_error(a, "--place %s: no such device; the run has %zu (--platform), indexed from 0",
                  arg, ndev);
      return;
    }
    r->place[i] = (tool_place){r->place_names[i], (int)index};
  }
}

/* 0 to go on, -1 for --help, else an exit code. */
static int parse(int argc, char **argv, run_args *r) {
  targs a;
  targs_init(&a, "run", argc, argv);
  while (targs_next(&a)) {
    if (targs_is_help(&a)) return -1;
    if (parse_flag(&a, r)) continue;
    if (targs_cur(&a)[0] == '-' && targs_cur(&a)[1])
      targs_unknown(&a);
    else if (!r->src.path)
      r->src.path = targs_cur(&a);
    else
      targs_error(&a, "unexpected argument '%s'", targs_cur(&a));
  }
  source_finish(&a, &r->src);
  if (!a.failed && r->split.have_steps && (r->split.have_ratio || r->split.have_shift))
    targs_error(&a, "--boundary-steps sets the split itself; drop --boundary and --flow-shift");
  bool budget = r->policy == MLO_POLICY_BUDGET;
  if (!a.failed && (r->have_budget || r->have_reserve || r->no_prefetch || r->learn) && !budget)
    targs_error(&a, "%s needs --policy budget",
                r->have_budget    ? "--budget"
                : r->have_reserve ? "--reserve"
                : r->no_prefetch  ? "--no-prefetch"
                                  : "--learn-schedule");
  if (!a.failed) resolve_place(&a, r);
  if (!a.failed && r->nplatforms > 1 && (r->ranks >= 0 || r->node))
    targs_error(&a,
                "%s with several --platform: ranks and devices do not combine yet; give "
                "each rank one device (docs/placement.md)",
                r->ranks >= 0 ? "--ranks" : "--node");
  if (!a.failed && r->have_link && !tool_is_host(r->platform))
    targs_error(&a, "--link throttles the host platform; a real device's link is what it is");
  if (!a.failed && r->have_link && strstr(r->platform, "bw="))
    targs_error(&a, "give --link or bw= in --platform, not both");
  if (!a.failed && r->have_budget && r->have_reserve)
    targs_error(&a, "give --budget or --reserve, not both");
  if (!a.failed && r->ranks >= 0 && (r->trace || r->timeline || r->read_check))
    targs_error(&a, "--ranks reports per rank: drop %s",
                r->trace      ? "--trace"
                : r->timeline ? "--timeline"
                              : "--read-check");
  if (!a.failed && budget && r->offload == 0)
    targs_error(&a, "--policy budget needs --offload model");
  if (!a.failed && r->have_host && r->offload == 0)
    targs_error(&a, "--host-memory needs --offload model");
  bool host = tool_is_host(r->platform);
  if (!a.failed && r->node && r->ranks < 0)
    targs_error(&a, "--node describes the ranks' node: give --ranks auto (or shared, sharded)");
  if (!a.failed && r->node && host && !r->have_link)
    targs_error(&a, "--node on the host platform models the node's links at the profile's "
                    "ratios: give --link, each rank's link (e.g. 2e8)");
  if (!a.failed && r->node && host && r->have_link) {
    /* the profile's paths at its ratios to --link: each a link the host
     * platform can model (at least 1e6 bytes per second) */
    mlo_node_topology t = plan_node_topology(r->node, (double)r->link);
    double least = t.fabric_bps > 0 && t.fabric_bps < t.link_bps ? t.fabric_bps : t.link_bps;
    if (t.uplink_bps > 0 && t.uplink_bps / (t.group > 1 ? t.group : 1) < least)
      least = t.uplink_bps / (t.group > 1 ? t.group : 1);
    double most = t.fabric_bps > t.link_bps ? t.fabric_bps : t.link_bps;
    if (t.uplink_bps > most) most = t.uplink_bps;
    if (least < 1e6)
      targs_error(&a,
                  "--link %.0f with --node %s models a path of %.0f bytes per second, below "
                  "1e6: give a faster --link",
                  (double)r->link, r->node->name, least);
    else if (most > 1e15) /* the host platform's ceiling; named here, not as fabric= */
      targs_error(&a,
                  "--link %g with --node %s models a path of %g bytes per second, above the "
                  "host platform's 1e15: give --link at most %.3g",
                  (double)r->link, r->node->name, most, (double)r->link * 1e15 / most);
  }
  if (!a.failed && r->node && host &&
      (strstr(r->platform, "group=") || strstr(r->platform, "uplink=") ||
       strstr(r->platform, "fabric=") || strstr(r->platform, "pcie_p2p=")))
    targs_error(&a, "give --node or the node's options in --platform, not both");
  if (!a.failed && r->have_host && r->literal)
    targs_error(&a, "--host-memory with --literal: the literal baseline copies every tensor "
                    "back to host memory");
  return a.failed ? TOOL_EXIT_USAGE : 0;
}

static int refuse_too_small(const run_args *ra, tool_session *s) {
  uint64_t need;
  const char *what;
  if (ra->policy == MLO_POLICY_BUDGET) {
    /* budget: the largest component, alone, must fit the budget and the device */
    uint64_t room = ra->have_budget ? ra->budget : s->capacity;
    if (ra->have_budget && ra->budget > s->capacity) {
      tool_failf("run", "--budget %s is more than the device's %s", tool_size(ra->budget),
                 tool_size(s->capacity));
      return TOOL_EXIT_USAGE;
    }
    /* a component larger than the room streams its blocks, in a footprint
     * of its prologue, epilogue and two slots at least; one with too few
     * blocks must fit whole */
    mlo_component *big = NULL;
    need = mlo_workload_stream_least_bytes(s->pipe, &big);
    if (!big || need <= room) return 0;
    if (need < mlo_component_bytes(big))
      tool_failf("run", "needs at least %s of device memory for %s, streaming its blocks; %s is %s",
                 tool_size(need), mlo_component_name(big),
                 ra->have_budget ? "--budget" : "the device", tool_size(room));
    else
      tool_failf("run",
                 "needs at least %s of device memory for %s, which has too few blocks to "
                 "stream (%zu); %s is %s",
                 tool_size(need), mlo_component_name(big), mlo_component_block_count(big),
                 ra->have_budget ? "--budget" : "the device", tool_size(room));
    return TOOL_EXIT_NOMEM;
  }
  /* several devices: what each needs is placement's to say, at enable */
  if (s->ndevices > 1 || session_fits(s, ra->offload == 1, &need, &what)) return 0;
  char have[96];
  if (ra->have_capacity)
    snprintf(have, sizeof have, "--device-memory is %s", tool_size(s->capacity));
  else
    snprintf(have, sizeof have, "the device has %s", tool_size(s->capacity));
  tool_failf("run", "needs at least %s of device memory for %s; %s", tool_size(need), what, have);
  if (ra->offload == 0)
    fprintf(stderr, "  try --offload model (needs %s)\n",
            tool_size(mlo_workload_model_offload_bytes(s->pipe, NULL)));
  else if (ra->have_capacity)
    fprintf(stderr, "  raise --device-memory to at least %s\n", tool_size(need));
  if (ra->offload == 1) { /* strict moves whole components: the budget policy streams */
    mlo_component *big = NULL;
    uint64_t least = mlo_workload_stream_least_bytes(s->pipe, &big);
    if (big && least < need)
      fprintf(stderr,
              "  or --policy budget, which streams %s's blocks through the device and runs in "
              "%s%s\n",
              mlo_component_name(big), tool_size(least),
              least <= s->capacity ? " (it fits now)" : "");
  }
  return TOOL_EXIT_NOMEM;
}

static void fill_options(const run_args *ra, run_options *o, tool_trace *trace, bool progress) {
  memset(o, 0, sizeof *o);
  o->offload = ra->offload == 1;
  o->settings = (mlo_offload_settings)MLO_OFFLOAD_SETTINGS_INIT;
  o->settings.sync = ra->sync == 1 || ra->literal ? MLO_SYNC_DEVICE : MLO_SYNC_EVENT;
  o->settings.per_tensor_copies = ra->literal;
  o->settings.copy_back = ra->literal;
  o->settings.policy = (mlo_policy)ra->policy;
  o->settings.budget_bytes = ra->have_budget ? ra->budget : 0;
  o->settings.reserve_bytes = ra->have_reserve ? ra->reserve : 0;
  o->settings.prefetch = !ra->no_prefetch;
  o->learn_schedule = ra->learn;
  o->whole_loads = ra->whole_loads || ra->literal;
  o->settings.host_budget_bytes = ra->have_host ? ra->host : 0;
  o->prompts = (int)ra->prompts;
  o->steps = (int)ra->steps;
  o->audit = ra->verify;
  o->progress = progress;
  o->trace = trace;
}

/* A run with nothing to run (every component OTHER) would print an empty
 * digest and exit 0: refuse it and say how to name the roles. */
static int refuse_nothing_to_run(const run_args *ra, tool_session *s) {
  size_t n = mlo_pipeline_component_count(s->pipe);
  char names[256] = "";
  for (size_t i = 0; i < n; i++) {
    mlo_component *c = mlo_pipeline_component_at(s->pipe, i);
    if (mlo_component_role(c) != MLO_ROLE_OTHER) return 0;
    size_t len = strlen(names);
    snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "", mlo_component_name(c));
  }
  const char *first = n ? mlo_component_name(mlo_pipeline_component_at(s->pipe, 0)) : "NAME";
  tool_failf("run", "nothing to run: %s has no DiT, encoder or VAE (%s: role other)", ra->src.label,
             names);
  fprintf(stderr, "  name the role: --role %s=dit (or encoder, vae)%s\n", first,
          ra->src.path ? "; or give the files as --diffusion-model F --t5xxl F --vae F" : "");
  return TOOL_EXIT_USAGE;
}

typedef struct {
  const run_args *ra;
  run_options *o;
  tool_report *rep;
} load_check;

/* Before anything is loaded: the expert split, and the refusals that need
 * only the headers. */
static int before_load(tool_session *s, void *user, char *err, size_t errlen) {
  load_check *lc = user;
  int code = refuse_nothing_to_run(lc->ra, s);
  if (!code) code = refuse_too_small(lc->ra, s);
  if (code) {
    snprintf(err, errlen, "refused"); /* the refusal printed its own message */
    return code;
  }
  int rc = split_resolve(&lc->ra->src, &lc->ra->split, s->pipe, lc->o->steps, &lc->rep->split, err,
                         errlen);
  if (rc) return tool_exit_for(rc);
  lc->o->first_steps = lc->rep->split.first_steps;
  return 0;
}

/* The offloaded (or resident) run itself, its pictures and the snapshot. */
static int run_main(const run_args *ra, session_config *cfg, run_options *o, tool_report *rep) {
  char err[1024] = "";
  tool_session s;
  load_check lc = {ra, o, rep};
  cfg->before_load = before_load;
  cfg->before_load_user = &lc;
  int rc = session_open(&s, cfg, err, sizeof err);
  cfg->before_load = NULL; /* the reference run needs no second check */
  if (rc == TOOL_SESSION_REFUSED) {
    if (strcmp(err, "refused")) tool_failf("run", "%s", err);
    return s.refused;
  }
  if (rc) {
    tool_failf("run", "%s", err);
    return tool_exit_for(rc);
  }
  int code = 0;
  run_result r;
  rc = session_run(&s, o, &r, err, sizeof err);
  if (rc) run_result_free(&r);
  if (rc) {
    tool_failf("run", "%s%s%s", r.failed ? mlo_component_name(r.failed) : "", r.failed ? ": " : "",
               err);
    code = (ra->verify && rc == MLO_ESTATE) ? TOOL_EXIT_VERIFY : tool_exit_for(rc);
    if (rc == MLO_ENOMEM && ra->have_host && strstr(err, "host budget"))
      code = TOOL_EXIT_NOMEM; /* what must stay in host memory exceeds it */
    goto agree;               /* the other ranks learn of it there, not at their timeout */
  }
  if (o->trace) {
    rc = session_write_pictures(o->trace, &s, ra->src.label, o, &r, ra->trace, ra->timeline, err,
                                sizeof err);
    if (rc) { /* the run is done: a write that fails now is a failure, not bad input */
      tool_failf("run", "%s", err);
      code = TOOL_EXIT_FAIL;
      goto out_close;
    }
  }
  rc = report_snapshot(rep, &s, &r);
  if (rc) code = TOOL_EXIT_FAIL;
agree:;
  char aerr[512] = "";
  if (ra->src.comm &&
      (code = ranks_agree(&ra->rk, RANKS_STEP_MEASURE, code, 0, aerr, sizeof aerr))) {
    if (aerr[0]) tool_failf("run", "%s", aerr);
  } else if (!code) { /* while the slabs are mapped: what this process holds, and (--ranks) did */
    mlo_dist_stats ds = MLO_DIST_STATS_INIT;
    mlo_pipeline_get_dist_stats(s.pipe, &ds);
    rank_figures *f = &rep->rank;
    f->pss = ranks_pss_bytes();
    size_t n = mlo_pipeline_component_count(s.pipe), k = 0;
    const void **slabs = calloc(n ? n : 1, sizeof *slabs);
    for (size_t i = 0; slabs && i < n; i++) {
      mlo_component *c = mlo_pipeline_component_at(s.pipe, i);
      if (mlo_component_tensor_count(c))
        slabs[k++] = mlo_tensor_host_data(mlo_component_tensor_at(c, 0));
    }
    f->slab_pss = slabs ? ranks_pss_of(slabs, k) : 0;
    free(slabs);
    f->read = ds.read_bytes;
    f->io_read = s.load_io_read;
    f->shared = ds.shared_bytes;
    f->tier_read = r.stats.total.disk_read_bytes;
    f->h2d = r.stats.total.h2d_bytes;
    f->gather = ds.gather_bytes;
    f->lane_gathers = ds.lane_gathers;
    f->gather_s = (double)ds.gather_ns / 1e9;
    f->stall_s = (double)r.stats.total.wait_ns / 1e9;
    f->steady_stall_s = run_steady(&r, GEN_STALL);
    f->wall_s = r.wall_s;
    f->steady_wall_s = run_steady(&r, GEN_WALL);
    f->digest = r.digest;
    f->verified = -1;
  }
out_close:
  session_close(&s);
  return code;
}

static int verify_against_resident(const session_config *cfg, const run_options *o,
                                   tool_report *rep) {
  /* The reference uses exactly the roles the run resolved (declared, so
   * the name heuristic does not warn a second time). */
  mlo_role_override *roles = calloc(rep->ncomp ? rep->ncomp : 1, sizeof *roles);
  if (!roles) return TOOL_EXIT_FAIL;
  for (size_t i = 0; i < rep->ncomp; i++) {
    roles[i].name = rep->comps[i].name;
    roles[i].role = rep->comps[i].role;
  }
  session_config ref = *cfg;
  tool_source alone = *cfg->source; /* the reference is one process's */
  alone.comm = NULL;
  alone.sharded = false;
  ref.source = &alone;
  ref.read_check = false; /* measured once, for the run */
  ref.overrides = roles;
  ref.override_count = rep->ncomp;
  char err[1024] = "";
  int rc = session_reference_run(&ref, o, rep->all_resident, &rep->ref, err, sizeof err);
  free(roles);
  if (rc) {
    tool_failf("run", "all-resident reference run: %s", err);
    return tool_exit_for(rc);
  }
  rep->verify = true;
  rep->identical = rep->ref.digest == rep->run.digest;
  return 0;
}

/* One device's spec: --platform's, with --device-memory, --link and
 * --node applied. */
static void device_spec(const run_args *ra, const char *platform, char *spec, size_t size) {
  if (ra->have_capacity)
    spec_with_capacity(platform, ra->capacity, spec, size);
  else
    snprintf(spec, size, "%s", platform);
  if (ra->have_link) spec_set(spec, size, "bw", (double)ra->link); /* host only (parse checked) */
  if (ra->node && tool_is_host(spec)) node_options(ra, spec, size);
}

int cmd_run(int argc, char **argv) {
  run_args ra = {
      .platform = "host", .offload = 1, .steps = 8, .prompts = 1, .ranks = -1, .rank_timeout = 60};
  int code = parse(argc, argv, &ra);
  if (code == -1) {
    help();
    code = TOOL_EXIT_OK;
    goto out_free;
  }
  if (code) goto out_free;
  char cuda_spec[300];
  if (ra.ranks >= 0) {
    char err[512] = "";
    int rc = ranks_start(&ra.rk, ra.rank_timeout, err, sizeof err);
    if (rc) {
      tool_failf("run", "%s", err);
      code = tool_exit_for(rc);
      goto out_free;
    }
    ra.src.comm = ra.rk.comm;
    int index = cuda_rank_index(ra.platform, ra.rk.node_rank);
    if (index >= 0) {
      const char *opts = ra.platform[4] == ':' ? ra.platform + 5 : "";
      snprintf(cuda_spec, sizeof cuda_spec, "cuda:%d%s%s", index, *opts ? ":" : "", opts);
      ra.platform = cuda_spec;
    }
  }
  /* Before any work: a run of minutes must not end in "cannot write". */
  if ((code = tool_check_output("run", "--trace", ra.trace)) ||
      (code = tool_check_output("run", "--timeline", ra.timeline)))
    goto out_free;
  char spec[512], more[TOOL_MAX_DEVICES][512];
  const char *more_specs[TOOL_MAX_DEVICES];
  if (ra.have_capacity && strstr(ra.platform, "capacity="))
    fprintf(stderr,
            "mlo run: note: --device-memory %s is used instead of the capacity= in "
            "--platform\n",
            tool_size(ra.capacity));
  device_spec(&ra, ra.platform, spec, sizeof spec);
  for (size_t i = 1; i < ra.nplatforms; i++) {
    device_spec(&ra, ra.platforms[i], more[i - 1], sizeof more[i - 1]);
    more_specs[i - 1] = more[i - 1];
  }
  ra.rk.platform = spec;
  if (ra.ranks >= 0) {
    char err[512] = "";
    mlo_node_topology nt;
    if (ra.node) nt = plan_node_topology(ra.node, 0);
    int rc = ranks_plan_loads(&ra.rk, spec, ra.node ? &nt : NULL, ra.node ? ra.node->name : NULL,
                              ra.ranks == RANKS_AUTO ? -1 : ra.ranks,
                              !ra.whole_loads && !ra.literal, err, sizeof err);
    if (rc) { /* every rank hears it at the agreement below, at once */
      tool_failf("run", "%s", err);
      code = tool_exit_for(rc);
    }
    /* ranks that would load differently, or model other nodes (other
     * --ranks, --node or node options), fail together now, before a slab
     * is shared */
    char aerr[512] = "";
    int acode = ranks_agree(&ra.rk, RANKS_STEP_LOADS, code, ra.rk.agreed, aerr, sizeof aerr);
    if (acode && aerr[0])
      tool_failf("run", "%s%s", aerr,
                 strstr(aerr, " differ at ")
                     ? ": the ranks would load differently or model other nodes (give every "
                       "rank the same --ranks, --node and --platform)"
                     : "");
    /* ranks given other offload settings would call the components in
     * another order: said here with the flags named, not later as a
     * "collective sequence mismatch" (issue 44, F15) */
    if (!acode) {
      acode = ranks_agree(&ra.rk, RANKS_STEP_SETTINGS, code, run_settings_check(&ra), aerr,
                          sizeof aerr);
      if (acode && aerr[0])
        tool_failf("run", "%s%s", aerr,
                   strstr(aerr, " differ at ")
                       ? ": the ranks were given other offload settings (give every rank the "
                         "same --offload, --policy, --budget, --reserve, --device-memory, "
                         "--host-memory, --link, --steps, --prompts, --sync and prefetch and "
                         "load flags)"
                       : "");
    }
    if ((code = acode)) goto out_free;
    ra.src.sharded = ra.rk.sharded;
  }
  bool progress = !ra.json && ra.rk.rank == 0;
  session_config cfg = {.source = &ra.src,
                        .platform_spec = spec,
                        .more_specs = more_specs,
                        .nmore = ra.nplatforms ? ra.nplatforms - 1 : 0,
                        .place = ra.place,
                        .nplace = ra.nplace,
                        .progress = progress,
                        .read_check = ra.read_check,
                        .defer_materialize =
                            ra.have_host}; /* enable reads what stays in host memory */
  memcpy(cfg.tokens, ra.tokens, sizeof cfg.tokens);
  tool_trace trace;
  bool tracing = ra.trace || ra.timeline;
  if (tracing && tool_trace_init(&trace)) {
    code = TOOL_EXIT_FAIL;
    goto out_free;
  }
  run_options o;
  fill_options(&ra, &o, tracing ? &trace : NULL, progress);
  tool_report rep = {0};
  rep.offload = offload_words[ra.offload];
  rep.sync = mlo_sync_name(o.settings.sync);
  rep.policy = mlo_policy_name(o.settings.policy);
  rep.prefetch = o.settings.policy == MLO_POLICY_BUDGET && o.settings.prefetch;
  rep.learned = o.learn_schedule;
  rep.steps = (int)ra.steps;
  rep.trace_path = ra.trace;
  rep.timeline_path = ra.timeline;
  code = run_main(&ra, &cfg, &o, &rep);
  if (!code && ra.verify) code = verify_against_resident(&cfg, &o, &rep);
  char aerr[512] = "";
  if (ra.src.comm && (code = ranks_agree(&ra.rk, RANKS_STEP_REPORT, code, 0, aerr, sizeof aerr)) &&
      aerr[0])
    tool_failf("run", "%s", aerr);
  if (!code && ra.src.comm) {
    rep.rank.verified = rep.verify ? rep.identical : -1;
    if (!ra.json && ra.rk.rank == 0) report_print_text(&rep, stdout);
    if (ranks_report(&ra.rk, &rep.rank, rep.tensor_bytes, ra.json, stdout)) code = TOOL_EXIT_FAIL;
    if (rep.verify && !rep.identical) {
      tool_failf("run", "rank %d: verification failed: its digest differs from one process's",
                 ra.rk.rank);
      code = TOOL_EXIT_VERIFY;
    }
  } else if (!code) {
    if (ra.json)
      report_print_json(&rep, stdout);
    else
      report_print_text(&rep, stdout);
    if (!rep.run.digests_agree) {
      tool_failf("run", "verification failed: the prompts' digests differ from each other");
      code = TOOL_EXIT_VERIFY;
    } else if (rep.verify && !rep.identical) {
      tool_failf("run", "verification failed: the offloaded digest differs from the "
                        "all-resident one");
      code = TOOL_EXIT_VERIFY;
    }
  }
  report_free(&rep);
  if (tracing) tool_trace_destroy(&trace);
out_free:
  source_free(&ra.src);
  ranks_stop(&ra.rk, code);
  return code;
}
