/*
 * cmd_plan.c — `mlo plan PIPELINE --device CARD`: what model-level offload
 * will cost on a card before anything is downloaded or run.  The pipeline
 * (a directory or files, headers only, or a preset at full size declared
 * without files) is opened on the simulated platform, each forward is given
 * the time the compute model (plan_model.c) or --step-time says, and the
 * same session code as `mlo run` runs every policy on the virtual clock:
 * the projection is the library's real decisions, not a formula beside
 * them (docs/plan.md).
 */
#include "plan.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The rows of the table, cheapest to describe first. */
enum { POL_RESIDENT, POL_STRICT, POL_BUDGET, POL_PREFETCH, POL_COUNT };
static const char *const pol_names[POL_COUNT] = {"all-resident", "strict", "budget",
                                                 "budget+prefetch"};

typedef struct {
  tool_source src;
  tool_split_args split;
  const char *preset;
  double scale;
  const char *device;
  bool have_capacity, have_link, have_tflops;
  uint64_t capacity, link;
  double tflops, mfu;
  long steps, prompts;
  int policy, offload; /* -1: not given */
  bool no_prefetch;
  bool have_budget, have_reserve;
  uint64_t budget, reserve;
  bool have_dtype;
  mlo_dtype dtype;
  const char *job, *timeline;
  struct step_time {
    char key[128]; /* a role or a component name */
    double s;
  } times[32]; /* --step-time, parsed */
  size_t ntimes;
  long width, height, frames, cfg, text_tokens;
  bool json;
} plan_args;

typedef struct {
  bool run, fits;
  char why[256]; /* what is short, or why the run failed */
  double wall_s, stall_s, first_wall_s;
  double total_wall_s, total_stall_s; /* every prompt, the cold one included */
  uint64_t total_h2d;
  uint64_t h2d_bytes, loads, peak_device, pinned_host, budget;
} pol_result;

typedef struct {
  plan_device dev; /* the profile with --device-memory / --link applied */
  bool custom;     /* no profile: --device-memory, --link, --tflops */
  size_t ncomp;
  struct comp_plan {
    char name[128];
    mlo_role role;
    uint64_t bytes;
    double forward_s, flops;
    mlo_dtype dtype;
    const char *source; /* "model", "--step-time" */
  } * comps;
  uint64_t all_bytes, strict_need, largest;
  double compute_s; /* one prompt's forwards: a warm all-resident prompt */
  tool_split split;
  int steps; /* the job's */
  size_t calls;
  pol_result pol[POL_COUNT];
  int advice; /* -1: nothing fits */
} plan_result;

static void help(void) {
  printf("usage: mlo plan PIPELINE [--device CARD] [flags]\n\n"
         "Projects what model-level offload costs on a card, without a GPU and without\n"
         "the weights: PIPELINE is a diffusers directory, a component folder, a\n"
         ".safetensors or .gguf file (only headers are read), or a preset at its real\n"
         "size, declared without writing files (wan2.2-t2v, flux, qwen-image, sd3).  Each\n"
         "policy runs mlo's own residency code on a simulated device whose copies take\n"
         "bytes / link and whose forwards take the compute model's time, for --prompts\n"
         "generations; per-prompt figures are the steady state (prompts 2..N).\n\n"
         "flags (the same meaning as in mlo run):\n"
         "  --device CARD         a built-in profile (list below); without it and\n"
         "                        without --device-memory: one line per built-in card\n"
         "  --device-memory SIZE  device memory (overrides the card's)\n"
         "  --link BYTES_PER_S    pinned host-to-device bandwidth, e.g. 25e9 (overrides)\n"
         "  --steps N             denoising steps (default: the pipeline's diffusers default)\n"
         "  --prompts N           generations per projected run (default 3)\n"
         "  --policy P            only strict, or only budget (default: every policy)\n"
         "  --no-prefetch         with --policy budget: on-demand loads only\n"
         "  --offload none        only the all-resident row\n"
         "  --budget SIZE, --reserve SIZE   the budget policy's budget, or what it leaves\n"
         "                        free (activations, workspaces)\n" TOOL_SPLIT_HELP
         "what to assume:\n"
         "  --dtype D             DiT and encoder weights in D: fp8, bf16, fp16, fp32, or a\n"
         "                        GGUF type (Q8_0, Q4_K, ...); norms and the VAE keep theirs\n"
         "  --step-time K=S,...   seconds per forward for a role (dit, encoder, vae) or a\n"
         "                        component name, e.g. dit=3.5,encoder=0.2,vae=4 (a\n"
         "                        measured mlo run's forward times make a validation)\n"
         "  --tflops T            dense TFLOPS instead of the card's\n"
         "  --mfu F               the fraction of it a forward achieves (default 0.4)\n"
         "  --width W --height H --frames F   the generation (default: diffusers')\n"
         "  --cfg N               forwards per step: 2 with classifier-free guidance\n"
         "  --text-tokens N       prompt tokens\n"
         "  --job FAMILY          the default job of wan2.2-t2v, flux, qwen-image or sd3\n"
         "output:\n"
         "  --json                one JSON object: {\"policies\": [...], ...}\n"
         "  --timeline FILE.svg   the projected run of the advised policy, drawn as\n"
         "                        mlo run --timeline draws a real one\n" TOOL_SOURCE_HELP "\n"
         "cards:");
  for (size_t i = 0; i < plan_ndevices; i++) printf("%s %s", i ? "," : "", plan_devices[i].name);
  printf("\n\nexamples:\n"
         "  mlo plan wan2.2-t2v --device rtx4090 --dtype fp8\n"
         "  mlo plan wan2.2-t2v --device h100-sxm --steps 40 --frames 33\n"
         "  mlo plan /models/FLUX.1-dev --device l40s --json\n"
         "  mlo plan ckpt --device-memory 1G --link 2e8 --step-time dit=0.5,encoder=0.1,vae=0.2\n\n"
         "exit codes: 0 ok (also when nothing fits: the table says why), 2 bad usage or\n"
         "input, 4 other failure.\n");
}

static bool is_preset(const char *name) {
  for (const mlo_synth_preset_info *p = mlo_synth_presets(); p->name; p++)
    if (!strcmp(p->name, name)) return true;
  return false;
}

/* --step-time K=S[,K=S...] ("s" or "ms" after the number): parsed here,
 * matched to components once the pipeline is open. */
static void parse_step_times(targs *a, const char *text, plan_args *pa) {
  for (const char *p = text; p && *p;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    const char *eq = memchr(p, '=', len);
    char *end = NULL;
    double s = eq ? strtod(eq + 1, &end) : -1;
    bool ms = end && end + 2 == p + len && !strncmp(end, "ms", 2);
    bool unit_ok = end && (end == p + len || (end + 1 == p + len && *end == 's') || ms);
    size_t klen = eq ? (size_t)(eq - p) : 0;
    if (!eq || !klen || klen >= sizeof pa->times[0].key || !unit_ok || !(s >= 0) || !isfinite(s) ||
        s > 1e6) {
      targs_error(a, "--step-time: expected NAME=SECONDS[,NAME=SECONDS...], got '%.*s'", (int)len,
                  p);
      return;
    }
    if (pa->ntimes == sizeof pa->times / sizeof pa->times[0]) {
      targs_error(a, "--step-time: more than %zu entries", pa->ntimes);
      return;
    }
    struct step_time *t = &pa->times[pa->ntimes++];
    snprintf(t->key, sizeof t->key, "%.*s", (int)klen, p);
    t->s = ms ? s / 1000 : s;
    p += len + (comma ? 1 : 0);
  }
}

static bool parse_flag(targs *a, plan_args *pa) {
  const char *v;
  static const char *const policy_words[] = {"strict", "budget", NULL};
  static const char *const offload_words[] = {"none", "model", NULL};
  if (targs_value(a, "--device", &v)) {
    if (v && !plan_device_find(v))
      targs_error(a, "--device: unknown card '%s' (mlo plan --help lists them)", v);
    pa->device = v;
  } else if (targs_value(a, "--device-memory", &v)) {
    pa->have_capacity = targs_size(a, "--device-memory", v, &pa->capacity);
  } else if (targs_value(a, "--link", &v)) {
    pa->have_link = targs_size(a, "--link", v, &pa->link);
    if (pa->have_link && pa->link < 1000000)
      targs_error(a, "--link: %s bytes per second is below 1e6", v);
  } else if (targs_value(a, "--tflops", &v)) {
    pa->have_tflops = targs_double(a, "--tflops", v, 0.001, 1e6, &pa->tflops);
  } else if (targs_value(a, "--mfu", &v)) {
    targs_double(a, "--mfu", v, 0.01, 1.0, &pa->mfu);
  } else if (targs_value(a, "--steps", &v)) {
    targs_int(a, "--steps", v, 1, 100000, &pa->steps);
  } else if (targs_value(a, "--prompts", &v)) {
    targs_int(a, "--prompts", v, 1, 1000, &pa->prompts);
  } else if (targs_value(a, "--policy", &v)) {
    targs_choice(a, "--policy", v, policy_words, &pa->policy);
  } else if (targs_value(a, "--offload", &v)) {
    targs_choice(a, "--offload", v, offload_words, &pa->offload);
  } else if (targs_flag(a, "--no-prefetch")) {
    pa->no_prefetch = true;
  } else if (targs_value(a, "--budget", &v)) {
    pa->have_budget = targs_size(a, "--budget", v, &pa->budget);
  } else if (targs_value(a, "--reserve", &v)) {
    pa->have_reserve = targs_size(a, "--reserve", v, &pa->reserve);
  } else if (targs_value(a, "--dtype", &v)) {
    pa->have_dtype = v && plan_parse_dtype(v, &pa->dtype) == MLO_OK;
    if (v && !pa->have_dtype)
      targs_error(a, "--dtype: expected fp8, bf16, fp16, fp32 or a dtype name, got '%s'", v);
  } else if (targs_value(a, "--step-time", &v)) {
    if (v) parse_step_times(a, v, pa);
  } else if (targs_value(a, "--job", &v)) {
    plan_job j;
    if (v && !plan_job_for(v, &j))
      targs_error(a, "--job: expected wan2.2-t2v, flux, qwen-image or sd3, got '%s'", v);
    pa->job = v;
  } else if (targs_value(a, "--width", &v)) {
    targs_int(a, "--width", v, 16, 16384, &pa->width);
  } else if (targs_value(a, "--height", &v)) {
    targs_int(a, "--height", v, 16, 16384, &pa->height);
  } else if (targs_value(a, "--frames", &v)) {
    targs_int(a, "--frames", v, 1, 10000, &pa->frames);
  } else if (targs_value(a, "--cfg", &v)) {
    targs_int(a, "--cfg", v, 1, 8, &pa->cfg);
  } else if (targs_value(a, "--text-tokens", &v)) {
    targs_int(a, "--text-tokens", v, 1, 65536, &pa->text_tokens);
  } else if (targs_value(a, "--timeline", &v)) {
    pa->timeline = v;
  } else if (targs_flag(a, "--json")) {
    pa->json = true;
  } else if (split_flag(a, &pa->split) || source_flag(a, &pa->src)) {
  } else {
    return false;
  }
  return true;
}

static int parse(int argc, char **argv, plan_args *pa) {
  targs a;
  targs_init(&a, "plan", argc, argv);
  while (targs_next(&a)) {
    if (targs_is_help(&a)) return -1;
    if (parse_flag(&a, pa)) continue;
    if (targs_cur(&a)[0] == '-' && targs_cur(&a)[1])
      targs_unknown(&a);
    else if (!pa->src.path && !pa->preset)
      pa->src.path = targs_cur(&a);
    else
      targs_error(&a, "unexpected argument '%s'", targs_cur(&a));
  }
  /* A preset's name that is not also a path here is the preset. */
  struct stat st;
  if (pa->src.path && is_preset(pa->src.path) && stat(pa->src.path, &st) != 0) {
    pa->preset = pa->src.path;
    pa->src.path = NULL;
    pa->src.label = pa->preset;
  }
  if (!a.failed && !pa->src.path && !pa->preset && !pa->src.nfiles)
    targs_error(&a, "no pipeline: give a directory, a file, component files or a preset "
                    "(wan2.2-t2v, flux, qwen-image, sd3)");
  if (!a.failed && !pa->preset) source_finish(&a, &pa->src);
  if (!a.failed && pa->preset && pa->src.nfiles)
    targs_error(&a, "give a preset or component files, not both");
  if (!a.failed && pa->split.have_steps && (pa->split.have_ratio || pa->split.have_shift))
    targs_error(&a, "--boundary-steps sets the split itself; drop --boundary and --flow-shift");
  if (!a.failed && pa->no_prefetch && pa->policy != 1)
    targs_error(&a, "--no-prefetch needs --policy budget");
  if (!a.failed && pa->offload == 0 && pa->policy >= 0)
    targs_error(&a, "--offload none runs no policy; drop --policy");
  if (!a.failed && pa->have_budget && pa->have_reserve)
    targs_error(&a, "give --budget or --reserve, not both");
  if (!a.failed && pa->policy == 0 && (pa->have_budget || pa->have_reserve))
    targs_error(&a, "%s is the budget policy's; --policy strict has none",
                pa->have_budget ? "--budget" : "--reserve");
  return a.failed ? TOOL_EXIT_USAGE : 0;
}

/* ---- one device ------------------------------------------------------------ */

static void job_of(const plan_args *pa, mlo_pipeline *pipe, const char *class_name, plan_job *job) {
  char names[512] = "";
  size_t n = mlo_pipeline_component_count(pipe), len = 0;
  for (size_t i = 0; i < n && len + 1 < sizeof names; i++)
    len += (size_t)snprintf(names + len, sizeof names - len, "%s ",
                            mlo_component_name(mlo_pipeline_component_at(pipe, i)));
  if (pa->src.nfiles)
    for (size_t i = 0; i < pa->src.nfiles && len + 1 < sizeof names; i++)
      len += (size_t)snprintf(names + len, sizeof names - len, "%s ", pa->src.files[i].path);
  const char *family = pa->job      ? pa->job
                       : pa->preset ? pa->preset
                                    : plan_family_guess(class_name, names);
  plan_job_for(family, job);
  if (pa->width) job->width = (int)pa->width;
  if (pa->height) job->height = (int)pa->height;
  if (pa->frames) job->frames = (int)pa->frames;
  if (pa->cfg) job->passes = (int)pa->cfg;
  if (pa->text_tokens) job->text_tokens = (int)pa->text_tokens;
  if (pa->steps) job->steps = (int)pa->steps;
}

/* model_index.json's _class_name, for the job's family ("" without one). */
static void pipeline_class(const char *path, char *out, size_t outlen) {
  out[0] = '\0';
  if (!path) return;
  char file[4096];
  snprintf(file, sizeof file, "%s/model_index.json", path);
  FILE *f = fopen(file, "rb");
  if (!f) return;
  char buf[8192];
  size_t got = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[got] = '\0';
  cJSON *root = cJSON_Parse(buf); /* a hint only: the strict reader opened it already */
  const cJSON *cls = cJSON_GetObjectItemCaseSensitive(root, "_class_name");
  if (cJSON_IsString(cls)) snprintf(out, outlen, "%s", cls->valuestring);
  cJSON_Delete(root);
}

/* The --step-time entry for a component: its name first, then its role. */
static bool step_time_for(const plan_args *pa, const mlo_component *c, double *s) {
  for (int pass = 0; pass < 2; pass++) {
    const char *want = pass ? mlo_role_name(mlo_component_role(c)) : mlo_component_name(c);
    for (size_t i = 0; i < pa->ntimes; i++)
      if (!strcmp(pa->times[i].key, want)) {
        *s = pa->times[i].s;
        return true;
      }
  }
  return false;
}

/* A --step-time key that matches nothing is a typo: refused, not ignored. */
static int check_step_keys(const plan_args *pa, mlo_pipeline *pipe) {
  for (size_t i = 0; i < pa->ntimes; i++) {
    mlo_role r;
    bool known = mlo_role_from_name(pa->times[i].key, &r) == MLO_OK;
    for (size_t k = 0; !known && k < mlo_pipeline_component_count(pipe); k++)
      known = !strcmp(pa->times[i].key, mlo_component_name(mlo_pipeline_component_at(pipe, k)));
    if (!known) {
      tool_failf("plan", "--step-time: '%s' is neither a role nor a component of the pipeline",
                 pa->times[i].key);
      return TOOL_EXIT_USAGE;
    }
  }
  return 0;
}

static int open_pipeline(const plan_args *pa, tool_session *s, mlo_denoise_schedule *sched,
                         char *err, size_t errlen) {
  mlo_pipeline *pipe = NULL;
  int rc;
  if (pa->preset) {
    mlo_pipeline_options opts = MLO_PIPELINE_OPTIONS_INIT;
    opts.platform = s->platform;
    rc = mlo_synth_open(&opts, pa->preset, pa->scale, &pipe, sched, err, errlen);
  } else {
    rc = source_open(&pa->src, s->platform, NULL, 0, &pipe, err, errlen);
  }
  if (rc) return rc;
  if (pa->have_dtype) {
    mlo_pipeline_options opts = MLO_PIPELINE_OPTIONS_INIT;
    opts.platform = s->platform;
    mlo_pipeline *conv = NULL;
    rc = mlo_pipeline_create(&opts, &conv);
    if (!rc) rc = plan_clone(pipe, conv, pa->dtype, err, errlen);
    mlo_pipeline_free(pipe);
    pipe = conv;
    if (rc) {
      mlo_pipeline_free(conv);
      return rc;
    }
  }
  s->pipe = pipe;
  return MLO_OK;
}

static void fill_options(const plan_args *pa, int pol, const plan_result *pr, run_options *o) {
  memset(o, 0, sizeof *o);
  o->offload = pol != POL_RESIDENT;
  o->settings = (mlo_offload_settings)MLO_OFFLOAD_SETTINGS_INIT;
  o->settings.policy = pol >= POL_BUDGET ? MLO_POLICY_BUDGET : MLO_POLICY_STRICT;
  o->settings.prefetch = pol == POL_PREFETCH;
  if (pol >= POL_BUDGET) { /* mlo run refuses them for the other policies */
    o->settings.budget_bytes = pa->have_budget ? pa->budget : 0;
    o->settings.reserve_bytes = pa->have_reserve ? pa->reserve : 0;
  }
  o->prompts = (int)pa->prompts;
  o->steps = pr->steps;
  o->first_steps = pr->split.first_steps;
}

static bool wanted(const plan_args *pa, int pol) {
  if (pa->offload == 0) return pol == POL_RESIDENT;
  if (pa->policy == 0) return pol == POL_STRICT;
  if (pa->policy == 1) return pol == (pa->no_prefetch ? POL_BUDGET : POL_PREFETCH);
  return true;
}

/* Whether pol fits before running it; why says what is short. */
static bool fits(const plan_args *pa, const plan_result *pr, int pol, char *why, size_t len) {
  uint64_t cap = pr->dev.memory, need = 0;
  const char *what = "";
  /* The reserve (activations, workspaces) is room every policy needs; the
   * budget rows pass it to the budget policy as mlo run does. */
  if (pol < POL_BUDGET && pa->have_reserve) {
    if (pa->reserve >= cap) {
      snprintf(why, len, "--reserve %s leaves nothing of %s", tool_size(pa->reserve),
               tool_size(cap));
      return false;
    }
    cap -= pa->reserve;
  }
  if (pol == POL_RESIDENT)
    need = pr->all_bytes, what = "every component";
  else if (pol == POL_STRICT)
    need = pr->strict_need, what = "the largest phase";
  else {
    uint64_t budget = pa->have_budget                         ? pa->budget
                      : pa->have_reserve && pa->reserve < cap ? cap - pa->reserve
                      : pa->have_reserve                      ? 0
                                                              : cap;
    if (pa->have_budget && pa->budget > cap) {
      snprintf(why, len, "--budget %s is more than the device's %s", tool_size(pa->budget),
               tool_size(cap));
      return false;
    }
    if (pr->largest > budget) {
      snprintf(why, len, "short by %s: the largest component needs %s, the budget is %s",
               tool_size(pr->largest - budget), tool_size(pr->largest), tool_size(budget));
      return false;
    }
    return true;
  }
  if (need <= cap) return true;
  snprintf(why, len, "short by %s: %s needs %s of %s%s", tool_size(need - cap), what,
           tool_size(need), tool_size(cap), pa->have_reserve ? " (after --reserve)" : "");
  return false;
}

static int run_policy(const plan_args *pa, tool_session *s, plan_result *pr, int pol,
                      tool_trace *trace, run_result *keep) {
  pol_result *q = &pr->pol[pol];
  run_options o;
  fill_options(pa, pol, pr, &o);
  o.trace = trace;
  run_result r;
  char err[1024] = "";
  int rc = session_run(s, &o, &r, err, sizeof err);
  q->run = true;
  if (rc) {
    q->fits = false;
    snprintf(q->why, sizeof q->why, "the projected run failed: %.200s", err);
    run_result_free(&r);
    return rc == MLO_ENOMEM_DEVICE ? MLO_OK : rc;
  }
  q->wall_s = run_steady(&r, GEN_WALL);
  q->stall_s = run_steady(&r, GEN_STALL);
  q->h2d_bytes = (uint64_t)run_steady(&r, GEN_H2D);
  q->loads = (uint64_t)run_steady(&r, GEN_LOADS);
  q->first_wall_s = r.ngens ? r.gens[0].wall_s : r.wall_s;
  q->total_wall_s = r.wall_s;
  q->total_stall_s = (double)r.stats.total.wait_ns / 1e9;
  q->total_h2d = r.stats.total.h2d_bytes;
  q->peak_device = r.stats.peak_device_bytes;
  q->pinned_host = r.stats.pinned_bytes;
  q->budget = r.stats.budget_bytes;
  if (keep)
    *keep = r;
  else
    run_result_free(&r);
  return MLO_OK;
}

static void name_components(plan_result *pr, mlo_pipeline *pipe) {
  for (size_t i = 0; i < pr->ncomp; i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    snprintf(pr->comps[i].name, sizeof pr->comps[i].name, "%s", mlo_component_name(c));
    pr->comps[i].role = mlo_component_role(c);
    pr->comps[i].bytes = mlo_component_bytes(c);
  }
}

/* Forward times: --step-time where it names the component or its role,
 * else the compute model.  A component with neither fails (no card). */
static int model_times(const plan_args *pa, tool_session *s, plan_result *pr, const plan_job *job) {
  for (size_t i = 0; i < pr->ncomp; i++) {
    mlo_component *c = mlo_pipeline_component_at(s->pipe, i);
    struct comp_plan *cp = &pr->comps[i];
    plan_cost cost;
    plan_cost_of(c, job, &cost);
    cp->flops = cost.flops;
    cp->dtype = cost.compute_dtype;
    double secs = 0;
    if (step_time_for(pa, c, &secs)) {
      cp->source = "--step-time";
    } else if (cp->role == MLO_ROLE_OTHER) {
      cp->source = "not run";
    } else {
      double tf = pa->have_tflops ? pa->tflops : plan_tflops_for(&pr->dev, cost.compute_dtype);
      if (!(tf > 0)) {
        tool_failf("plan", "no compute time for %s: give --device, --tflops or --step-time %s=S",
                   cp->name, mlo_role_name(cp->role));
        return TOOL_EXIT_USAGE;
      }
      secs = cost.flops / (tf * 1e12 * pa->mfu);
      cp->source = "model";
    }
    uint64_t ns = (uint64_t)llround(secs * 1e9); /* the clock's unit: compute_s sums these */
    cp->forward_s = (double)ns / 1e9;
    mlo_workload_set_model_time(s->workload, c, ns);
  }
  return 0;
}

static void choose_advice(plan_result *pr) {
  /* the least wall time; ties (within 0.05%) to the simpler policy */
  pr->advice = -1;
  for (int p = 0; p < POL_COUNT; p++) {
    const pol_result *q = &pr->pol[p];
    if (!q->run || !q->fits) continue;
    if (pr->advice < 0 || q->wall_s < pr->pol[pr->advice].wall_s * (1 - 5e-4)) pr->advice = p;
  }
}

static int plan_device_run(const plan_args *pa, const plan_device *dev, plan_result *pr,
                           plan_job *job, bool draw) {
  memset(pr, 0, sizeof *pr);
  if (dev)
    pr->dev = *dev;
  else
    pr->dev = (plan_device){"custom", "custom device", 0, 25e9, 0, 0, ""}, pr->custom = true;
  if (pa->have_capacity) pr->dev.memory = pa->capacity;
  if (pa->have_link) pr->dev.link = (double)pa->link;
  if (pa->have_tflops) pr->dev.bf16_tflops = pr->dev.fp8_tflops = pa->tflops;
  if (!pr->dev.memory) pr->dev.memory = 80ull << 30;
  char spec[256], err[1024] = "";
  snprintf(spec, sizeof spec, "sim:capacity=%llu,link=%llu", (unsigned long long)pr->dev.memory,
           (unsigned long long)pr->dev.link);
  tool_session s;
  memset(&s, 0, sizeof s);
  int code = 0;
  int rc = mlo_platform_open(spec, &s.platform, err, sizeof err);
  mlo_denoise_schedule sched = MLO_DENOISE_SCHEDULE_INIT;
  if (!rc) rc = open_pipeline(pa, &s, &sched, err, sizeof err);
  if (!rc) rc = mlo_workload_open(s.platform, &s.workload, err, sizeof err);
  if (!rc) rc = mlo_pipeline_materialize(s.pipe);
  if (rc) {
    tool_failf("plan", "%s", err[0] ? err : mlo_strerror(rc));
    code = tool_exit_for(rc);
    goto out;
  }
  s.capacity = pr->dev.memory;
  char cls[128];
  pipeline_class(pa->src.path, cls, sizeof cls);
  job_of(pa, s.pipe, cls, job);
  if ((code = check_step_keys(pa, s.pipe))) goto out;
  pr->ncomp = mlo_pipeline_component_count(s.pipe);
  pr->comps = calloc(pr->ncomp ? pr->ncomp : 1, sizeof *pr->comps);
  if (!pr->comps) {
    code = TOOL_EXIT_FAIL;
    goto out;
  }
  name_components(pr, s.pipe);
  pr->all_bytes = mlo_workload_all_resident_bytes(s.pipe);
  pr->strict_need = mlo_workload_model_offload_bytes(s.pipe, NULL);
  pr->largest = mlo_workload_largest_bytes(s.pipe, NULL);
  if ((code = model_times(pa, &s, pr, job))) goto out;
  tool_source src = pa->src;
  if (pa->preset) src.sched = &sched;
  pr->steps = job->steps;
  rc = split_resolve(&src, &pa->split, s.pipe, job->steps, &pr->split, err, sizeof err);
  if (rc) {
    tool_failf("plan", "%s", err);
    code = tool_exit_for(rc);
    goto out;
  }
  mlo_workload_call *calls = NULL;
  if (mlo_workload_schedule(s.pipe, job->steps, pr->split.first_steps, &calls, &pr->calls) ==
      MLO_OK) {
    for (size_t i = 0; i < pr->calls; i++)
      for (size_t k = 0; k < pr->ncomp; k++)
        if (mlo_pipeline_component_at(s.pipe, k) == calls[i].comp)
          pr->compute_s += pr->comps[k].forward_s;
    free(calls);
  }
  for (int p = 0; p < POL_COUNT; p++) {
    if (!wanted(pa, p)) continue;
    pol_result *q = &pr->pol[p];
    q->fits = fits(pa, pr, p, q->why, sizeof q->why);
    if (!q->fits) continue;
    if ((rc = run_policy(pa, &s, pr, p, NULL, NULL))) {
      tool_failf("plan", "%s: %s", pol_names[p], q->why);
      code = tool_exit_for(rc);
      goto out;
    }
  }
  choose_advice(pr);
  if (draw && pr->advice >= 0) {
    tool_trace trace;
    run_result r;
    if (tool_trace_init(&trace)) {
      code = TOOL_EXIT_FAIL;
      goto out;
    }
    pol_result saved = pr->pol[pr->advice];
    rc = run_policy(pa, &s, pr, pr->advice, &trace, &r);
    pr->pol[pr->advice] = saved;
    if (!rc) {
      run_options o;
      fill_options(pa, pr->advice, pr, &o);
      char title[512];
      snprintf(title, sizeof title, "projection: %s on %s", pa->src.label, pr->dev.title);
      rc = session_write_pictures(&trace, &s, title, &o, &r, NULL, pa->timeline, err, sizeof err);
      run_result_free(&r);
      if (rc) tool_failf("plan", "%s", err);
    }
    tool_trace_destroy(&trace);
    if (rc) code = tool_exit_for(rc);
  }
out:
  session_close(&s);
  return code;
}

/* ---- output ------------------------------------------------------------------ */

static double overhead(const plan_result *pr, const pol_result *q) {
  return pr->compute_s > 0 ? q->wall_s / pr->compute_s - 1 : 0;
}

/* An overhead as "+1.32%": rounded first, so float noise never prints
 * as "-0.00%". */
static const char *pct(double x) {
  static char bufs[4][24];
  static unsigned next;
  char *b = bufs[next++ % 4];
  double v = round(x * 1e4) / 1e2;
  snprintf(b, 24, "%+.2f%%", v == 0 ? 0.0 : v);
  return b;
}

/* A size as a flag takes it: "20G", "512M", else bytes. */
static const char *size_arg(uint64_t b) {
  static char buf[32];
  static const char *const units[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (b && u < 4 && b % 1024 == 0) b /= 1024, u++;
  snprintf(buf, sizeof buf, "%llu%s", (unsigned long long)b, units[u]);
  return buf;
}

static void print_advice(const plan_args *pa, const plan_result *pr, FILE *out) {
  if (pr->advice < 0) {
    fprintf(out, "advice: nothing fits on %s; try --dtype fp8 (or a GGUF type) or a larger card\n",
            pr->dev.title);
    return;
  }
  const pol_result *q = &pr->pol[pr->advice];
  char flags[256] = "";
  if (pr->advice == POL_RESIDENT)
    snprintf(flags, sizeof flags, " --offload none");
  else if (pr->advice >= POL_BUDGET)
    snprintf(flags, sizeof flags, " --policy budget%s",
             pr->advice == POL_BUDGET ? " --no-prefetch" : "");
  size_t fl = strlen(flags);
  if (pr->advice >= POL_BUDGET && pa->have_budget)
    snprintf(flags + fl, sizeof flags - fl, " --budget %s", size_arg(pa->budget));
  else if (pr->advice >= POL_BUDGET && pa->have_reserve)
    snprintf(flags + fl, sizeof flags - fl, " --reserve %s", size_arg(pa->reserve));
  fprintf(out, "advice: %s, %s over all-resident: mlo run %s --platform cuda --steps %d%s\n",
          pol_names[pr->advice], pct(overhead(pr, q)),
          pa->preset ? "<its diffusers directory>" : pa->src.label, pr->steps, flags);
}

static const char *secs(double s) {
  static char bufs[8][32];
  static unsigned next;
  char *b = bufs[next++ % 8];
  if (s >= 100)
    snprintf(b, 32, "%.0f s", s);
  else if (s >= 1)
    snprintf(b, 32, "%.2f s", s);
  else
    snprintf(b, 32, "%.1f ms", s * 1e3);
  return b;
}

static void print_text(const plan_args *pa, const plan_result *pr, const plan_job *job, FILE *out) {
  fprintf(out, "pipeline: %s%s, %zu components, %s\n", pa->src.label,
          pa->preset ? " (preset, full size, declared without files)" : "", pr->ncomp,
          tool_size(pr->all_bytes));
  fprintf(out, "device:   %s: %s, link %.1f GB/s", pr->dev.title, tool_size(pr->dev.memory),
          pr->dev.link / 1e9);
  if (pr->dev.bf16_tflops > 0)
    fprintf(out, ", %.0f TFLOPS bf16%s (mfu %.2f)", pr->dev.bf16_tflops,
            pr->dev.fp8_tflops > 0 && pr->dev.fp8_tflops != pr->dev.bf16_tflops ? " / fp8 x2" : "",
            pa->mfu);
  fprintf(out, "\njob:      %dx%d", job->width, job->height);
  if (job->frames > 1) fprintf(out, ", %d frames", job->frames);
  fprintf(out, ", %d steps", job->steps);
  if (pr->split.first_steps < job->steps)
    fprintf(out, " (%d on the first DiT, %d on the second: %s)", pr->split.first_steps,
            job->steps - pr->split.first_steps, pr->split.source);
  fprintf(out, ", %d pass%s per step, %d text tokens\n", job->passes, job->passes > 1 ? "es" : "",
          job->text_tokens);
  fprintf(out, "forward:  ");
  for (size_t i = 0; i < pr->ncomp; i++) {
    const struct comp_plan *c = &pr->comps[i];
    if (c->role == MLO_ROLE_OTHER) continue;
    fprintf(out, "%s%s %s (%s%s)", i ? ", " : "", c->name, secs(c->forward_s),
            strcmp(c->source, "model") ? c->source : "", strcmp(c->source, "model") ? "" : "model");
  }
  fprintf(out, "\n          one prompt computes for %s (a warm all-resident prompt)\n\n",
          secs(pr->compute_s));
  fprintf(out, "%-16s %-4s %11s %11s %11s %9s %11s %11s\n", "policy", "fits", "peak device",
          "pinned host", "per prompt", "overhead", "stall", "moved");
  for (int p = 0; p < POL_COUNT; p++) {
    const pol_result *q = &pr->pol[p];
    if (!wanted(pa, p)) continue;
    if (!q->fits) {
      fprintf(out, "%-16s %-4s %s\n", pol_names[p], "no", q->why);
      continue;
    }
    fprintf(out, "%-16s %-4s %11s %11s %11s %9s %11s %11s\n", pol_names[p], "yes",
            tool_size(q->peak_device), tool_size(q->pinned_host), secs(q->wall_s),
            pct(overhead(pr, q)), secs(q->stall_s), tool_size(q->h2d_bytes));
  }
  fprintf(out, "(per prompt: the steady state of %ld prompts; the first, cold, ", pa->prompts);
  if (pr->advice >= 0)
    fprintf(out, "takes %s with %s)\n", secs(pr->pol[pr->advice].first_wall_s),
            pol_names[pr->advice]);
  else
    fprintf(out, "is not run)\n");
  print_advice(pa, pr, out);
  if (!pa->have_reserve && !pa->have_budget)
    fprintf(out, "note: weights only; leave room for activations with --reserve SIZE\n");
}

static cJSON *result_json(const plan_args *pa, const plan_result *pr, const plan_job *job) {
  cJSON *o = cJSON_CreateObject();
  cJSON *d = cJSON_AddObjectToObject(o, "device");
  cJSON_AddStringToObject(d, "name", pr->dev.name);
  cJSON_AddStringToObject(d, "title", pr->dev.title);
  cJSON_AddNumberToObject(d, "memory_bytes", (double)pr->dev.memory);
  cJSON_AddNumberToObject(d, "link_bytes_per_s", pr->dev.link);
  cJSON_AddNumberToObject(d, "bf16_tflops", pr->dev.bf16_tflops);
  cJSON_AddNumberToObject(d, "fp8_tflops", pr->dev.fp8_tflops);
  cJSON_AddNumberToObject(d, "mfu", pa->mfu);
  cJSON *j = cJSON_AddObjectToObject(o, "job");
  cJSON_AddStringToObject(j, "family", job->family);
  cJSON_AddNumberToObject(j, "width", job->width);
  cJSON_AddNumberToObject(j, "height", job->height);
  cJSON_AddNumberToObject(j, "frames", job->frames);
  cJSON_AddNumberToObject(j, "steps", job->steps);
  cJSON_AddNumberToObject(j, "first_dit_steps", pr->split.first_steps);
  cJSON_AddNumberToObject(j, "passes", job->passes);
  cJSON_AddNumberToObject(j, "text_tokens", job->text_tokens);
  cJSON_AddNumberToObject(j, "prompts", (double)pa->prompts);
  cJSON *comps = cJSON_AddArrayToObject(o, "components");
  for (size_t i = 0; i < pr->ncomp; i++) {
    const struct comp_plan *c = &pr->comps[i];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", c->name);
    cJSON_AddStringToObject(e, "role", mlo_role_name(c->role));
    cJSON_AddNumberToObject(e, "device_bytes", (double)c->bytes);
    cJSON_AddStringToObject(e, "compute_dtype", mlo_dtype_name(c->dtype));
    cJSON_AddNumberToObject(e, "flops", c->flops);
    cJSON_AddNumberToObject(e, "forward_s", c->forward_s);
    cJSON_AddStringToObject(e, "forward_source", c->source);
    cJSON_AddItemToArray(comps, e);
  }
  cJSON_AddNumberToObject(o, "all_resident_bytes", (double)pr->all_bytes);
  cJSON_AddNumberToObject(o, "compute_s", pr->compute_s);
  cJSON *pols = cJSON_AddArrayToObject(o, "policies");
  for (int p = 0; p < POL_COUNT; p++) {
    const pol_result *q = &pr->pol[p];
    if (!wanted(pa, p)) continue;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "policy", pol_names[p]);
    cJSON_AddBoolToObject(e, "fits", q->fits);
    if (!q->fits) {
      cJSON_AddStringToObject(e, "why", q->why);
    } else {
      cJSON_AddNumberToObject(e, "wall_s", q->wall_s);
      cJSON_AddNumberToObject(e, "stall_s", q->stall_s);
      cJSON_AddNumberToObject(e, "overhead", overhead(pr, q));
      cJSON_AddNumberToObject(e, "first_wall_s", q->first_wall_s);
      cJSON_AddNumberToObject(e, "total_wall_s", q->total_wall_s);
      cJSON_AddNumberToObject(e, "total_stall_s", q->total_stall_s);
      cJSON_AddNumberToObject(e, "total_h2d_bytes", (double)q->total_h2d);
      cJSON_AddNumberToObject(e, "peak_device_bytes", (double)q->peak_device);
      cJSON_AddNumberToObject(e, "pinned_host_bytes", (double)q->pinned_host);
      cJSON_AddNumberToObject(e, "h2d_bytes", (double)q->h2d_bytes);
      cJSON_AddNumberToObject(e, "loads", (double)q->loads);
      if (p >= POL_BUDGET) cJSON_AddNumberToObject(e, "budget_bytes", (double)q->budget);
    }
    cJSON_AddItemToArray(pols, e);
  }
  if (pr->advice >= 0)
    cJSON_AddStringToObject(o, "advice", pol_names[pr->advice]);
  else
    cJSON_AddNullToObject(o, "advice");
  return o;
}

static void print_summary_line(const plan_result *pr, FILE *out) {
  const pol_result *q = pr->advice >= 0 ? &pr->pol[pr->advice] : NULL;
  fprintf(out, "%-10s %10s %7.0f GB/s  %-4s  %-16s", pr->dev.name, tool_size(pr->dev.memory),
          pr->dev.link / 1e9, pr->pol[POL_RESIDENT].fits ? "yes" : "no",
          q ? pol_names[pr->advice] : "nothing fits");
  if (q)
    fprintf(out, " %10s  %9s\n", secs(q->wall_s), pct(overhead(pr, q)));
  else
    fprintf(out, " %s\n", pr->pol[POL_BUDGET].why);
}

static void free_result(plan_result *pr) {
  free(pr->comps);
  pr->comps = NULL;
}

int cmd_plan(int argc, char **argv) {
  plan_args pa = {.scale = 1.0, .mfu = 0.4, .prompts = 3, .policy = -1, .offload = -1};
  int code = parse(argc, argv, &pa);
  if (code == -1) {
    help();
    code = TOOL_EXIT_OK;
    goto out_free;
  }
  if (code) goto out_free;
  if ((code = tool_check_output("plan", "--timeline", pa.timeline))) goto out_free;
  bool one = pa.device || pa.have_capacity || pa.have_link || pa.have_tflops;
  plan_job job;
  plan_result pr;
  if (one) {
    code = plan_device_run(&pa, plan_device_find(pa.device), &pr, &job, pa.timeline != NULL);
    if (!code) {
      if (pa.json) {
        cJSON *o = result_json(&pa, &pr, &job);
        cJSON_AddStringToObject(o, "pipeline", pa.src.label);
        code = tool_print_json_text(cJSON_Print(o));
        cJSON_Delete(o);
      } else {
        print_text(&pa, &pr, &job, stdout);
      }
    }
    free_result(&pr);
    goto out_free;
  }
  if (pa.timeline) {
    tool_failf("plan", "--timeline draws one card's projection: give --device");
    code = TOOL_EXIT_USAGE;
    goto out_free;
  }
  cJSON *all = pa.json ? cJSON_CreateObject() : NULL;
  cJSON *devs = all ? cJSON_AddArrayToObject(all, "devices") : NULL;
  for (size_t i = 0; i < plan_ndevices && !code; i++) {
    code = plan_device_run(&pa, &plan_devices[i], &pr, &job, false);
    if (code) break;
    if (!pa.json && i == 0) {
      printf("pipeline: %s, %zu components, %s; %dx%d", pa.src.label, pr.ncomp,
             tool_size(pr.all_bytes), job.width, job.height);
      if (job.frames > 1) printf(", %d frames", job.frames);
      printf(", %d steps\n\n%-10s %10s %12s  %-4s  %-16s %10s  %9s\n", job.steps, "card", "memory",
             "link", "all?", "best policy", "per prompt", "overhead");
    }
    if (pa.json)
      cJSON_AddItemToArray(devs, result_json(&pa, &pr, &job));
    else
      print_summary_line(&pr, stdout);
    free_result(&pr);
  }
  if (!code && pa.json) {
    cJSON_AddStringToObject(all, "pipeline", pa.src.label);
    code = tool_print_json_text(cJSON_Print(all));
  } else if (!code) {
    printf("\n(all?: every component fits at once.  mlo plan %s --device CARD for a card's "
           "full table)\n",
           pa.src.label);
  }
  cJSON_Delete(all);
out_free:
  source_free(&pa.src);
  return code;
}

int plan_brief(const char *preset, const char *device, const char *dtype, FILE *out) {
  plan_args pa = {.scale = 1.0, .mfu = 0.4, .prompts = 3, .policy = -1, .offload = -1};
  pa.preset = preset;
  pa.src.label = preset;
  pa.device = device;
  pa.have_dtype = dtype && plan_parse_dtype(dtype, &pa.dtype) == MLO_OK;
  const plan_device *dev = plan_device_find(device);
  if (!dev) return TOOL_EXIT_USAGE;
  plan_result pr;
  plan_job job;
  int code = plan_device_run(&pa, dev, &pr, &job, false);
  if (code) return code;
  char what[96];
  snprintf(what, sizeof what, "%s, %s", dev->name, dtype ? dtype : "bf16");
  fprintf(out, "  %-16s", what);
  if (pr.advice < 0) {
    fprintf(out, " nothing fits (%s)\n", pr.pol[POL_STRICT].why);
  } else {
    for (int p = POL_RESIDENT; p < POL_COUNT; p++) {
      if (p == POL_BUDGET) continue; /* the demo's table has strict and budget+prefetch */
      const pol_result *q = &pr.pol[p];
      if (q->fits)
        fprintf(out, " %s %s", pol_names[p], pct(overhead(&pr, q)));
      else
        fprintf(out, " %s no", pol_names[p]);
      fprintf(out, p + 1 < POL_COUNT ? "," : "\n");
    }
  }
  free_result(&pr);
  return 0;
}
