/*
 * cmd_demo.c — `mlo demo`, what `make demo` runs: the main job on its
 * built-in default.  Generates a Wan2.2-shaped pipeline (two DiTs, a UMT5
 * encoder, a VAE) into a cache folder once, then serves three prompts eight
 * ways on the host platform, with a link throttled so that one DiT load
 * takes one DiT step (set from the compute rate it measures):
 *   - all resident, warm (the baseline a server would run if it could),
 *   - strict model-level offload (the specification) on a smaller device,
 *     with whole loads and block by block,
 *   - the budget policy with prefetch on the same smaller device,
 *   - the budget policy with prefetch in strict's memory (switches joined),
 *   - the budget policy on a device smaller than one DiT (60% of it), the
 *     DiTs streaming their blocks (docs/streaming.md);
 *   - the budget policy with half the weights' host memory, the rest read
 *     from the checkpoint at each load (docs/disk.md);
 *   - the budget policy over two devices of the smaller size, one pipeline,
 *     each component placed on one (docs/placement.md);
 * verifies that all eight give the same digest, audits every forward, and
 * prints the per-prompt cost of each against the baseline, with a
 * residency timeline of the budget run.  About half a minute on two cores.
 */
#include "plan.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* At full depth: 40 blocks a DiT, as the real model, so that what streams and
 * what a switch waits for are the real model's shares (mlo synth --help) */
#define DEMO_PRESET "wan2.2-t2v:full-depth"
#define DEMO_FOLDER "wan2.2-t2v-full-depth"
#define DEMO_MODEL "wan2.2-t2v" /* the real model mlo plan projects (full depth, at scale 1) */
#define DEMO_SCALE 0.005        /* about 330 MB of weights */
#define DEMO_STEPS 8

/* The preset's roles, declared: the demo knows what it generated, so no
 * name heuristic (and no warning about one) is involved. */
const mlo_role_override tool_wan_roles[] = {
    {"text_encoder", MLO_ROLE_ENCODER},
    {"transformer", MLO_ROLE_DIT},
    {"transformer_2", MLO_ROLE_DIT},
    {"vae", MLO_ROLE_VAE},
};
const size_t tool_wan_nroles = sizeof tool_wan_roles / sizeof tool_wan_roles[0];

typedef struct {
  const char *cache, *timeline, *trace;
  double scale;
  long steps;
  bool have_capacity;
  uint64_t capacity;
} demo_args;

static void help(void) {
  printf("usage: mlo demo [flags]\n\n"
         "Generates a Wan2.2-shaped pipeline (UMT5 encoder, two DiTs split at the\n"
         "0.875 boundary, a 3-D VAE; about %.0f MB at the default scale) into a cache\n"
         "folder, once.  Then serves three prompts eight ways on the host platform:\n"
         "all resident and warm (the baseline), strict model-level offload (the\n"
         "specification, with whole loads and block by block) and the budget policy\n"
         "with prefetch, both on a device that\n"
         "holds the strict need and the next component but not the whole pipeline,\n"
         "the budget policy with prefetch within the strict need (each switch joined:\n"
         "the next component's copies go into the blocks the current one has run),\n"
         "the budget policy on a device of 60%% of one DiT, its blocks streaming, and\n"
         "the budget policy with half the weights' host memory, the rest read from the\n"
         "checkpoint at each load, and the budget policy over two devices of the smaller\n"
         "size (one pipeline, each component placed on one), over a link throttled so\n"
         "that one DiT load takes one\n"
         "DiT step.  Checks that all of them give identical output, audits every\n"
         "forward, and reports each one's time per prompt against the baseline, stall,\n"
         "bytes moved and peak device memory, with a timeline picture (SVG) of the\n"
         "budget run.\n\n"
         "flags:\n"
         "  --cache DIR           cache folder (default $MLO_CACHE, else ./mlo-cache)\n"
         "  --scale S             pipeline scale, 0 < S <= 0.1 (default %g)\n"
         "  --steps N             DiT steps (default %d)\n"
         "  --device-memory SIZE  device capacity (default: the strict need + the\n"
         "                        largest component)\n"
         "  --timeline FILE.svg   where to write the picture (default CACHE/demo-timeline.svg)\n"
         "  --trace FILE          also write a Chrome trace (open in ui.perfetto.dev)\n\n"
         "examples:\n"
         "  mlo demo\n"
         "  MLO_CACHE=/tmp/mlo mlo demo --scale 0.01 --trace /tmp/demo.json\n",
         66e9 * DEMO_SCALE / 1e6, DEMO_SCALE, DEMO_STEPS);
}

static int parse(int argc, char **argv, demo_args *d) {
  targs a;
  targs_init(&a, "demo", argc, argv);
  const char *v;
  while (targs_next(&a)) {
    if (targs_is_help(&a)) return -1;
    if (targs_value(&a, "--cache", &v))
      d->cache = v;
    else if (targs_value(&a, "--timeline", &v))
      d->timeline = v;
    else if (targs_value(&a, "--trace", &v))
      d->trace = v;
    else if (targs_value(&a, "--scale", &v))
      targs_double(&a, "--scale", v, 1e-6, 0.1, &d->scale);
    else if (targs_value(&a, "--steps", &v))
      targs_int(&a, "--steps", v, 1, 1000, &d->steps);
    else if (targs_value(&a, "--device-memory", &v))
      d->have_capacity = targs_size(&a, "--device-memory", v, &d->capacity);
    else if (targs_cur(&a)[0] == '-')
      targs_unknown(&a);
    else
      targs_error(&a, "takes no arguments, got '%s'", targs_cur(&a));
  }
  return a.failed ? TOOL_EXIT_USAGE : 0;
}

/* Generates the pipeline unless the cache already holds it complete. */
static int ensure_pipeline(const char *dir, double scale) {
  if (mlo_synth_is_complete(DEMO_PRESET, dir, scale)) {
    printf("using the cached pipeline in %s\n", dir);
    return TOOL_EXIT_OK;
  }
  uint64_t bytes = 0;
  mlo_synth_bytes(DEMO_PRESET, scale, &bytes);
  printf("generating a Wan2.2-shaped pipeline (%s) into %s ...\n", tool_size(bytes), dir);
  fflush(stdout);
  tool_progress bar;
  progress_init(&bar, "writing", bytes);
  char err[512] = "";
  uint64_t t0 = mlo_now_ns();
  int rc = mlo_synth_write(DEMO_PRESET, dir, scale, progress_synth_cb, &bar, err, sizeof err);
  progress_finish(&bar);
  if (rc) {
    tool_err("demo: cannot generate the pipeline in %s: %s", dir, err[0] ? err : mlo_strerror(rc));
    if (rc == MLO_EEXIST) fprintf(stderr, "  use --cache DIR to pick another folder\n");
    return tool_exit_for(rc);
  }
  printf("generated in %.1f s\n", (double)(mlo_now_ns() - t0) / 1e9);
  return TOOL_EXIT_OK;
}

typedef struct {
  uint64_t need, all, dit; /* strict need, every component, the largest DiT */
  uint64_t stream_least;   /* the least device the budget policy runs in, streaming */
  uint64_t capacity;       /* the demo's device */
  tool_split split;        /* the experts' steps, from the preset's scheduler */
} demo_sizes;

/* The demo's device: room for the strict need and the next component (the
 * budget at which prefetch hides the switches), below the all-resident sum
 * so that offload has work to do. */
static int pick_capacity(const char *dir, int steps, demo_sizes *z) {
  mlo_platform *plat = NULL;
  mlo_pipeline *pipe = NULL;
  char err[512] = "";
  int rc = mlo_platform_open("host", &plat, err, sizeof err);
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = plat;
  mlo_open_options oo = MLO_OPEN_OPTIONS_INIT;
  oo.overrides = tool_wan_roles;
  oo.override_count = tool_wan_nroles;
  if (!rc) rc = mlo_pipeline_open_path(&po, dir, &oo, &pipe, err, sizeof err);
  if (rc) {
    char msg[1024];
    tool_err("demo: %s", tool_open_message(dir, err, rc, msg, sizeof msg));
    mlo_platform_close(plat);
    return tool_exit_for(rc);
  }
  z->need = mlo_workload_model_offload_bytes(pipe, NULL);
  z->all = mlo_workload_all_resident_bytes(pipe);
  mlo_component *dit = NULL;
  mlo_workload_model_offload_bytes(pipe, &dit);
  z->dit = dit ? mlo_component_bytes(dit) : 0;
  z->stream_least = mlo_workload_stream_least_bytes(pipe, NULL);
  uint64_t ahead = z->need + mlo_workload_largest_bytes(pipe, NULL) + (1u << 20);
  if (!z->capacity) z->capacity = ahead < z->all ? ahead : z->need + (z->all - z->need) / 2;
  tool_source src;
  source_init_path(&src, dir);
  rc = split_resolve(&src, &(tool_split_args){0}, pipe, steps, &z->split, err, sizeof err);
  if (rc) tool_err("demo: %s", err);
  mlo_pipeline_free(pipe);
  mlo_platform_close(plat);
  return tool_exit_for(rc);
}

static int make_dir(const char *path) {
  if (mkdir(path, 0777) == 0 || errno == EEXIST) return 0;
  tool_err("demo: cannot create %s: %s", path, strerror(errno));
  return TOOL_EXIT_USAGE;
}

/* The demo's pipeline on ndev host devices of `capacity` over its link,
 * one pipeline, each behaving like a GPU (prefaulted, no poison fill); an
 * exit code, the message said. */
static int open_on(tool_session *s, session_config cfg, uint64_t capacity, double bw, size_t ndev) {
  char spec[256], err[1024] = "";
  snprintf(spec, sizeof spec, "host:capacity=%llu,bw=%.0f,prefault=1,poison=0",
           (unsigned long long)capacity, bw);
  const char *more[1] = {spec};
  cfg.platform_spec = spec;
  cfg.more_specs = more;
  cfg.nmore = ndev > 1 ? 1 : 0;
  int rc = session_open(s, &cfg, err, sizeof err);
  if (rc) tool_err("demo: %s", err);
  return rc ? tool_exit_for(rc) : 0;
}

/* One offloaded run in an open session; its pictures and report when asked. */
static int run_one(tool_session *s, const run_options *o, const demo_args *d, const char *svg,
                   run_result *r, tool_report *rep) {
  char err[1024] = "";
  int rc = session_run(s, o, r, err, sizeof err);
  bool wrote = false; /* a picture that fails to write after the run: a failure, not bad input */
  if (!rc && o->trace) {
    rc = session_write_pictures(o->trace, s, "mlo demo: Wan2.2-shaped pipeline, budget + prefetch",
                                o, r, d->trace, svg, err, sizeof err);
    wrote = rc != MLO_OK;
  }
  if (!rc && rep) rc = report_snapshot(rep, s, r);
  if (rc) {
    tool_err("demo: %s", err[0] ? err : mlo_strerror(rc));
    if (!rep) run_result_free(r);
  }
  if (rc == MLO_ESTATE) return TOOL_EXIT_VERIFY; /* the audit found a violation */
  return wrote ? TOOL_EXIT_FAIL : tool_exit_for(rc);
}

/* time, its ratio to the baseline (noisy on a shared machine), and the
 * exposed cost: 1 + stall / the baseline's time (what noise barely moves) */
static void print_row(const char *label, const run_result *r, const run_result *base) {
  double b = run_steady(base, GEN_WALL), wall = run_steady(r, GEN_WALL);
  double stall = run_steady(r, GEN_STALL);
  printf("  %-22s %7.3f s %7.2fx %8.3fx %9.3f s %11s %10s\n", label, wall, tool_ratio(wall, b),
         b > 0 ? 1 + stall / b : 0, stall, tool_size((uint64_t)run_steady(r, GEN_H2D)),
         tool_size(r->stats.peak_device_bytes));
}

static int demo(const demo_args *d, const char *dir, const char *svg) {
  demo_sizes z = {.capacity = d->have_capacity ? d->capacity : 0};
  int code = pick_capacity(dir, (int)d->steps, &z);
  if (code) return code;
  run_options o = {.offload = false,
                   .steps = (int)d->steps,
                   .first_steps = z.split.first_steps,
                   .prompts = 3,
                   .audit = true,
                   .progress = true};
  o.settings = (mlo_offload_settings)MLO_OFFLOAD_SETTINGS_INIT;
  /* A host device that behaves like a GPU: memory backed up front, no
   * poison fill competing with compute for the CPU. */
  tool_source src;
  source_init_path(&src, dir);
  session_config cfg = {.source = &src,
                        .platform_spec = "host:prefault=1,poison=0",
                        .overrides = tool_wan_roles,
                        .override_count = tool_wan_nroles,
                        .progress = true};
  tool_report rep = {.offload = "model",
                     .sync = "event",
                     .policy = "budget",
                     .prefetch = true,
                     .steps = (int)d->steps,
                     .split = z.split,
                     .trace_path = d->trace,
                     .timeline_path = svg};
  printf("1/6 all resident, warm (the baseline; needs a %s device) ...\n", tool_size(z.all));
  fflush(stdout);
  char err[1024] = "";
  int rc = session_reference_run(&cfg, &o, z.all, &rep.ref, err, sizeof err);
  if (rc) {
    tool_err("demo: all-resident run: %s", err);
    return tool_exit_for(rc);
  }
  /* The link: one DiT load takes one DiT step, from the rate just measured. */
  double bw = rep.ref.dit_step_s > 0 ? (double)z.dit / rep.ref.dit_step_s : 0;
  if (bw < 1e6) bw = 1e6;
  tool_session s;
  if ((code = open_on(&s, cfg, z.capacity, bw, 1))) {
    report_free(&rep);
    return code;
  }
  printf("2/6 strict offload (the specification) on a %s device, link %.2f GB/s "
         "(a DiT load = one DiT step), loads block by block, then whole ...\n",
         tool_size(z.capacity), bw / 1e9);
  fflush(stdout);
  o.offload = true;
  run_result strict, whole = {0};
  code = run_one(&s, &o, d, svg, &strict, NULL);
  o.whole_loads = true; /* as before progressive loads: each forward waits for all of it */
  if (!code) code = run_one(&s, &o, d, NULL, &whole, NULL);
  o.whole_loads = false;
  run_result joined = {0};
  if (!code) {
    printf("3/6 budget policy with prefetch, same device and link, then within strict's %s "
           "(its switches joined) ...\n",
           tool_size(z.need));
    fflush(stdout);
    tool_trace trace;
    bool traced = tool_trace_init(&trace) == MLO_OK;
    code = traced ? TOOL_EXIT_OK : TOOL_EXIT_FAIL;
    o.settings.policy = MLO_POLICY_BUDGET;
    o.trace = &trace;
    run_result r;
    if (!code) code = run_one(&s, &o, d, svg, &r, &rep);
    if (traced) tool_trace_destroy(&trace);
    o.trace = NULL;
    /* the strict need as the budget: the next expert does not fit beside
     * the one running, so its copies go into that one's ended blocks */
    o.settings.budget_bytes = z.need;
    if (!code) code = run_one(&s, &o, d, NULL, &joined, NULL);
    o.settings.budget_bytes = 0;
  }
  session_close(&s);
  /* A device smaller than one DiT: the budget policy streams the DiTs'
   * blocks through it, over the same link (a block's copy about its
   * compute). */
  run_result streamed = {0};
  uint64_t small = z.dit * 3 / 5;
  if (small < z.stream_least) small = z.stream_least; /* a small scale has few blocks */
  bool stream = small < z.dit;
  char label[32] = "DiT streamed";
  if (stream) snprintf(label, sizeof label, "DiT streamed (%.2fx)", (double)small / (double)z.dit);
  if (!code && !stream)
    printf("4/6 skipped: at this scale the DiT has too few blocks to stream in less than "
           "itself\n\n");
  if (!code && stream && !(code = open_on(&s, cfg, small, bw, 1))) {
    printf("4/6 budget policy on a %s device, %.0f%% of one DiT: its blocks stream ...\n\n",
           tool_size(small), 100.0 * (double)small / (double)z.dit);
    fflush(stdout);
    o.trace = NULL;
    code = run_one(&s, &o, d, NULL, &streamed, NULL);
    session_close(&s);
  }
  /* Half the weights' host memory: what does not fit stays in the files
   * and is read at each load, the next one's reads under the current
   * compute (docs/disk.md). */
  run_result disk = {0};
  uint64_t host = z.all / 2;
  session_config deferred = cfg;
  deferred.defer_materialize = true; /* the run's enable reads what stays in host memory */
  if (!code && !(code = open_on(&s, deferred, z.capacity, bw, 1))) {
    printf("5/6 budget policy with prefetch and %s of host memory for %s of weights: the "
           "rest is read from disk at each load ...\n\n",
           tool_size(host), tool_size(z.all));
    fflush(stdout);
    o.trace = NULL;
    o.settings.host_budget_bytes = host;
    code = run_one(&s, &o, d, NULL, &disk, NULL);
    o.settings.host_budget_bytes = 0;
    session_close(&s);
  }
  /* Two devices of the same size, one pipeline (docs/placement.md): the
   * experts and the VAE fit one, not with the encoder; placement puts the
   * encoder on the other and nothing moves once warm. */
  run_result two = {0};
  char where[256] = "";
  if (!code && !(code = open_on(&s, cfg, z.capacity, bw, 2))) {
    printf("6/6 budget policy with prefetch on two %s devices, one pipeline: each component "
           "placed on one ...\n\n",
           tool_size(z.capacity));
    fflush(stdout);
    code = run_one(&s, &o, d, NULL, &two, NULL);
    for (size_t dv = 0; dv < 2 && !code; dv++) {
      size_t len = strlen(where);
      snprintf(where + len, sizeof where - len, "%sdevice %zu:", dv ? "; " : "", dv);
      for (size_t i = 0; i < mlo_pipeline_component_count(s.pipe); i++) {
        mlo_component *c = mlo_pipeline_component_at(s.pipe, i);
        len = strlen(where);
        if (mlo_component_device(c) == dv)
          snprintf(where + len, sizeof where - len, " %s", mlo_component_name(c));
      }
    }
    session_close(&s);
  }
  if (!code) {
    rep.verify = true;
    rep.identical = rep.ref.digest == rep.run.digest && strict.digest == rep.run.digest &&
                    (!stream || (streamed.digest == rep.run.digest && streamed.digests_agree)) &&
                    disk.digest == rep.run.digest && disk.digests_agree && rep.run.digests_agree &&
                    strict.digests_agree && whole.digest == rep.run.digest && whole.digests_agree &&
                    joined.digest == rep.run.digest && joined.digests_agree &&
                    two.digest == rep.run.digest && two.digests_agree;
    report_print_text(&rep, stdout);
    printf("\nper prompt, steady state (prompts 2-3 of 3), against all resident warm:\n");
    printf("  %-22s %9s %8s %9s %11s %11s %10s\n", "", "time", "wall", "exposed", "stall", "moved",
           "peak");
    print_row("all resident (warm)", &rep.ref, &rep.ref);
    print_row("strict, whole loads", &whole, &rep.ref);
    print_row("strict offload", &strict, &rep.ref);
    print_row("budget + prefetch", &rep.run, &rep.ref);
    print_row("strict memory, joined", &joined, &rep.ref);
    if (stream) print_row(label, &streamed, &rep.ref);
    print_row("host memory 1/2", &disk, &rep.ref);
    print_row("two devices", &two, &rep.ref);
    printf("  (wall: time / the baseline's, which machine noise moves; exposed: 1 + stall /\n"
           "  the baseline's time, the transfer time offload leaves on the critical path)\n");
    for (size_t i = 0; i < streamed.nstreams; i++)
      if (streamed.streams[i].slots) {
        const mlo_stream_info *si = &streamed.streams[i];
        printf("  streamed: %zu of %zu blocks kept, %zu through %zu slots (%s on the device, "
               "%s copied per forward)\n",
               si->resident_blocks, si->blocks, si->streamed_blocks, si->slots,
               tool_size(si->device_bytes), tool_size(si->streamed_bytes));
        break; /* the experts are alike */
      }
    printf("  host memory 1/2: %s of slabs kept of %s, %s read from disk per prompt, %.3f s "
           "waited for it; peak RSS %s (the host device's %s in it)\n",
           tool_size(disk.stats.host_slab_bytes), tool_size(z.all),
           tool_size((uint64_t)run_steady(&disk, GEN_DISK)), run_steady(&disk, GEN_DISK_STALL),
           tool_size(disk.peak_rss), tool_size(z.capacity));
    printf("  whole loads wait for every byte at each switch; block by block, each block's\n"
           "  compute waits for its own copy alone: %.3f s against %.3f s per prompt\n",
           run_steady(&strict, GEN_STALL), run_steady(&whole, GEN_STALL));
    printf("  in strict's memory the budget policy with prefetch joins the switches\n"
           "  (%" PRIu64 " loads in %d prompts): the next component's copies go into the\n"
           "  blocks the current one has run, and it waits %.3f s against strict's %.3f s\n",
           joined.stats.total.joined_loads, o.prompts, run_steady(&joined, GEN_STALL),
           run_steady(&strict, GEN_STALL));
    printf("  two devices of %s, one pipeline: %s moved per prompt against %s on one;\n"
           "  placed %s: the encoder apart from the experts, every switch gone\n",
           tool_size(z.capacity), tool_size((uint64_t)run_steady(&two, GEN_H2D)),
           tool_size((uint64_t)run_steady(&rep.run, GEN_H2D)), where);
    printf("  the digests of all %s runs are %s\n", stream ? "eight" : "seven",
           rep.identical ? "identical" : "DIFFERENT");
    if (!rep.identical) code = TOOL_EXIT_VERIFY;
  }
  if (!code) {
    /* The same policies on the cards users have, at full size, by the
     * same code on the simulated device (docs/plan.md): milliseconds. */
    printf("\nthe real Wan2.2 A14B (64 GiB, 50 steps of 832x480x81), projected by mlo plan\n"
           "(overhead per prompt over all resident; `mlo plan wan2.2-t2v --device CARD`):\n");
    static const struct {
      const char *card, *dtype;
      uint64_t host; /* host memory for the weights (0: all of them) */
    } cards[] = {{"h100-sxm", NULL, 0},
                 {"l40s", NULL, 0},
                 {"rtx4090", NULL, 0},
                 {"rtx4090", "fp8", 0},
                 {"rtx4090", NULL, 32ull << 30}}; /* a desktop: 32 GiB for 64 GiB of weights */
    for (size_t i = 0; i < sizeof cards / sizeof *cards && !code; i++)
      code = plan_brief(DEMO_MODEL, cards[i].card, cards[i].dtype, cards[i].host, stdout);
    if (!code)
      printf("  (the demo's link makes a DiT load cost a whole DiT step; on these cards a step\n"
             "  computes for many times its expert's load, so the switches nearly vanish; with\n"
             "  32 GiB of RAM the experts' streamed blocks stay in it, the rest is read from\n"
             "  disk at 3 GB/s under the compute: `mlo plan ... --host-memory 32G`)\n");
    if (!code)
      /* like against like: auto's choice against the other mode, both
       * measured block by block (issues 40, 43) */
      ranks_demo(dir, z.capacity, bw, (int)d->steps, rep.tensor_bytes, stdout);
  }
  run_result_free(&strict);
  run_result_free(&whole);
  run_result_free(&joined);
  run_result_free(&streamed);
  run_result_free(&disk);
  run_result_free(&two);
  report_free(&rep);
  return code;
}

int cmd_demo(int argc, char **argv) {
  demo_args d = {.scale = DEMO_SCALE, .steps = DEMO_STEPS};
  int code = parse(argc, argv, &d);
  if (code == -1) {
    help();
    return TOOL_EXIT_OK;
  }
  if (code) return code;
  if (!d.cache)
    d.cache = getenv("MLO_CACHE") && *getenv("MLO_CACHE") ? getenv("MLO_CACHE") : "mlo-cache";
  if ((code = make_dir(d.cache))) return code;
  char dir[4096], svg[4096];
  snprintf(dir, sizeof dir, "%s/%s-%g", d.cache, DEMO_FOLDER, d.scale);
  if (d.timeline)
    snprintf(svg, sizeof svg, "%s", d.timeline);
  else
    snprintf(svg, sizeof svg, "%s/demo-timeline.svg", d.cache);
  if ((code = tool_check_output("demo", "--timeline", svg)) ||
      (code = tool_check_output("demo", "--trace", d.trace)))
    return code;
  if ((code = ensure_pipeline(dir, d.scale))) return code;
  return demo(&d, dir, svg);
}
