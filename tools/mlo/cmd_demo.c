/*
 * cmd_demo.c — `mlo demo`, what `make demo` runs: the main job on its
 * built-in default.  Generates a Wan2.2-shaped pipeline (two DiTs, a UMT5
 * encoder, a VAE) into a cache folder once, runs it on the host platform
 * with a device smaller than the pipeline, verifies the output against an
 * all-resident run, and prints what offload cost and saved, with a
 * residency timeline picture.  Finishes in seconds on two cores.
 */
#include "tool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define DEMO_PRESET "wan2.2-t2v"
#define DEMO_SCALE 0.005 /* about 330 MB of weights */
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
         "folder, once; runs it with model-level offload on the host platform with a\n"
         "device smaller than the pipeline; checks the output is identical to an\n"
         "all-resident run; and reports loads, evictions, bytes moved, peak device\n"
         "memory and wall time against all-resident, and a timeline picture (SVG).\n\n"
         "flags:\n"
         "  --cache DIR           cache folder (default $MLO_CACHE, else ./mlo-cache)\n"
         "  --scale S             pipeline scale, 0 < S <= 0.1 (default %g)\n"
         "  --steps N             DiT steps (default %d)\n"
         "  --device-memory SIZE  device capacity (default: what offload needs + 1/8)\n"
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

/* Device bytes for the demo: what model-level offload needs plus headroom,
 * kept below the all-resident sum so that offload has work to do. */
static int pick_capacity(const char *dir, uint64_t *capacity) {
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
  uint64_t need = mlo_workload_model_offload_bytes(pipe, NULL);
  uint64_t all = mlo_workload_all_resident_bytes(pipe);
  uint64_t headroom = need / 8 > (8u << 20) ? need / 8 : (8u << 20);
  *capacity = need + headroom < all ? need + headroom : need + (all - need) / 2;
  mlo_pipeline_free(pipe);
  mlo_platform_close(plat);
  return TOOL_EXIT_OK;
}

static int make_dir(const char *path) {
  if (mkdir(path, 0777) == 0 || errno == EEXIST) return 0;
  tool_err("demo: cannot create %s: %s", path, strerror(errno));
  return TOOL_EXIT_USAGE;
}

static int run_offloaded(const session_config *cfg, const run_options *o, const demo_args *d,
                         const char *svg, tool_report *rep) {
  char err[1024] = "";
  tool_session s;
  int rc = session_open(&s, cfg, err, sizeof err);
  run_result r;
  if (!rc) rc = session_run(&s, o, &r, err, sizeof err);
  if (!rc)
    rc = session_write_pictures(o->trace, &s,
                                "mlo demo: Wan2.2-shaped pipeline, model-level offload", o, &r,
                                d->trace, svg, err, sizeof err);
  if (!rc) rc = report_snapshot(rep, &s, &r);
  if (rc) tool_err("demo: %s", err[0] ? err : mlo_strerror(rc));
  if (s.pipe) session_close(&s);
  if (rc == MLO_ESTATE) return TOOL_EXIT_VERIFY; /* the audit found a violation */
  return tool_exit_for(rc);
}

static int demo(const demo_args *d, const char *dir, const char *svg) {
  uint64_t capacity = d->capacity;
  int code = d->have_capacity ? 0 : pick_capacity(dir, &capacity);
  if (code) return code;
  char spec[128];
  spec_with_capacity("host", capacity, spec, sizeof spec);
  session_config cfg = {dir, spec, tool_wan_roles, tool_wan_nroles, true, {0}};
  tool_trace trace;
  if (tool_trace_init(&trace)) return TOOL_EXIT_FAIL;
  run_options o = {.offload = true,
                   .steps = (int)d->steps,
                   .boundary = 0.875,
                   .audit = true,
                   .progress = true,
                   .trace = &trace};
  o.settings = (mlo_offload_settings)MLO_OFFLOAD_SETTINGS_INIT;
  tool_report rep = {.offload = "model",
                     .sync = "event",
                     .steps = (int)d->steps,
                     .boundary = 0.875,
                     .trace_path = d->trace,
                     .timeline_path = svg};
  printf("running on a %s device (all resident would need more), verifying ...\n\n",
         tool_size(capacity));
  fflush(stdout);
  code = run_offloaded(&cfg, &o, d, svg, &rep);
  tool_trace_destroy(&trace);
  if (!code) {
    char err[1024] = "";
    int rc = session_reference_run(&cfg, &o, rep.all_resident, &rep.ref, err, sizeof err);
    if (rc) tool_err("demo: all-resident reference run: %s", err);
    code = tool_exit_for(rc);
    rep.verify = !rc;
    rep.identical = !rc && rep.ref.digest == rep.run.digest;
  }
  if (!code) {
    report_print_text(&rep, stdout);
    if (!rep.identical) code = TOOL_EXIT_VERIFY;
  }
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
  snprintf(dir, sizeof dir, "%s/%s-%g", d.cache, DEMO_PRESET, d.scale);
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
