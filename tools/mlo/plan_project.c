/*
 * plan_project.c — one card's projection for `mlo plan`: the pipeline
 * declared on the card's simulated device (sim:capacity=,link=), each
 * forward given its modelled time, and every policy run through the same
 * session code as `mlo run`, so the figures are the library's own
 * decisions on a virtual clock (docs/plan.md).
 */
#include "plan_cmd.h"
#include "platform/platform.h" /* mlo_sim_share_clock: several devices, one clock */

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
  if (class_name && class_name[0]) /* the folder's own (an image-to-video Wan, ...) */
    snprintf(job->pipeline_class, sizeof job->pipeline_class, "%s", class_name);
  if (pa->width) job->width = (int)pa->width;
  if (pa->height) job->height = (int)pa->height;
  if (pa->frames) job->frames = (int)pa->frames;
  if (pa->cfg) job->passes = (int)pa->cfg;
  if (pa->text_tokens) job->text_tokens = (int)pa->text_tokens;
  if (pa->steps) job->steps = (int)pa->steps;
  if (pa->batch) job->batch = (int)pa->batch;
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
    opts.devices = s->devices;
    opts.ndevices = s->ndevices;
    rc = mlo_synth_open(&opts, pa->preset, pa->scale, &pipe, sched, err, errlen);
  } else {
    rc = source_open(&pa->src, s->devices, s->ndevices, NULL, 0, &pipe, err, errlen);
  }
  if (rc) return rc;
  if (pa->have_dtype) {
    mlo_pipeline_options opts = MLO_PIPELINE_OPTIONS_INIT;
    opts.platform = s->platform;
    opts.devices = s->devices;
    opts.ndevices = s->ndevices;
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
    /* several devices: each one's memory is the card's less the reserve already */
    o->settings.reserve_bytes = pa->have_budget || pr->ndevices > 1 ? 0 : pr->reserve;
  }
  if (pol != POL_RESIDENT && pa->have_host) o->settings.host_budget_bytes = pa->host;
  o->prompts = (int)pa->prompts;
  o->steps = pr->steps;
  o->first_steps = pr->split.first_steps;
  o->whole_loads = pa->whole_loads;
}

bool plan_wanted(const plan_args *pa, int pol) {
  if (pa->offload == 0) return pol == POL_RESIDENT;
  if (pa->policy == MLO_POLICY_STRICT) return pol == POL_STRICT;
  if (pa->policy == MLO_POLICY_BUDGET) return pol == (pa->no_prefetch ? POL_BUDGET : POL_PREFETCH);
  return true;
}

/* Whether pol fits before running it; why says what is short.  Every row
 * leaves the reserve free (activations, the CUDA context, workspaces);
 * the budget rows pass it to the budget policy as mlo run --reserve does. */
static bool fits(const plan_args *pa, const plan_result *pr, int pol, char *why, size_t len) {
  uint64_t cap = pr->dev.memory, need = 0;
  const char *what = "";
  const char *from = strcmp(pr->reserve_from, "model") ? "--reserve" : "the reserve";
  if (pr->reserve >= cap) {
    snprintf(why, len, "short by %s: %s %s alone is more than the device's %s",
             tool_size(pr->reserve - cap), from, tool_size(pr->reserve), tool_size(cap));
    return false;
  }
  if (pol == POL_RESIDENT && pr->ndevices > 1) { /* spread where one device cannot hold it */
    uint64_t room = cap - pr->reserve;
    if (pr->largest <= room && pr->all_bytes <= room * pr->ndevices) return true;
    snprintf(why, len,
             "short: every component needs %s over %zu devices of %s (after the "
             "reserve), the largest %s",
             tool_size(pr->all_bytes), pr->ndevices, tool_size(room), tool_size(pr->largest));
    return false;
  } else if (pol == POL_RESIDENT)
    need = pr->all_bytes, what = "every component";
  else if (pol == POL_STRICT && pr->ndevices > 1)
    need = pr->largest, what = "the largest component"; /* the rest is placement's, at enable */
  else if (pol == POL_STRICT)
    need = pr->strict_need, what = "the largest phase";
  else {
    uint64_t budget = pa->have_budget ? pa->budget : cap - pr->reserve;
    if (pa->have_budget && pa->budget > cap - pr->reserve) {
      snprintf(why, len, "--budget %s and %s %s are more than the device's %s",
               tool_size(pa->budget), from, tool_size(pr->reserve), tool_size(cap));
      return false;
    }
    if (pr->budget_least > budget) {
      snprintf(why, len, "short by %s: the budget policy needs %s%s, the budget is %s",
               tool_size(pr->budget_least - budget), tool_size(pr->budget_least),
               pr->budget_least < pr->largest ? " streaming blocks" : "", tool_size(budget));
      return false;
    }
    return true;
  }
  cap -= pr->reserve;
  if (need <= cap) return true;
  snprintf(why, len, "short by %s: %s needs %s of %s%s", tool_size(need - cap), what,
           tool_size(need), tool_size(cap), pr->reserve ? " (after the reserve)" : "");
  return false;
}

/* Each component's activations at the job, the largest, and the reserve
 * the rows keep free: --reserve where given, else the model's. */
static void plan_reserve(const plan_args *pa, tool_session *s, plan_result *pr,
                         const plan_job *job) {
  pr->act_peak = 0;
  pr->act_comp = -1;
  double but_vae = 0; /* the largest of the other components' */
  for (size_t i = 0; i < pr->ncomp; i++) {
    plan_activation_of(mlo_pipeline_component_at(s->pipe, i), job, pa->cpu_kernels,
                       &pr->comps[i].act);
    if (pr->comps[i].act.bytes > pr->act_peak)
      pr->act_peak = pr->comps[i].act.bytes, pr->act_comp = (int)i;
    if (pr->comps[i].role != MLO_ROLE_VAE && pr->comps[i].act.bytes > but_vae)
      but_vae = pr->comps[i].act.bytes;
  }
  uint64_t fixed = PLAN_CUDA_CONTEXT_BYTES + PLAN_WORKSPACE_BYTES;
  pr->model_reserve = fixed + (uint64_t)ceil(pr->act_peak * (1 + PLAN_FRAGMENTATION));
  pr->reserve_but_vae = pr->act_comp >= 0 && pr->comps[pr->act_comp].role == MLO_ROLE_VAE
                            ? fixed + (uint64_t)ceil(but_vae * (1 + PLAN_FRAGMENTATION))
                            : 0;
  pr->reserve = pa->have_reserve ? pa->reserve : pr->model_reserve;
  pr->reserve_from = pa->have_reserve ? "--reserve" : "model";
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
    snprintf(q->why, sizeof q->why, "%s%.470s",
             pa->have_host && rc == MLO_ENOMEM ? "" : "the projected run failed: ", err);
    run_result_free(&r);
    /* a device, or a host budget, too small: the row says so */
    return rc == MLO_ENOMEM_DEVICE || (rc == MLO_ENOMEM && pa->have_host) ? MLO_OK : rc;
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
  q->disk_bytes = (uint64_t)run_steady(&r, GEN_DISK);
  q->host_slab = r.stats.host_slab_bytes;
  q->total_disk = r.stats.total.disk_read_bytes;
  if (pr->ndevices > 1) { /* where the enable placed each component, and why */
    q->placement = (mlo_placement){.size = sizeof q->placement};
    mlo_pipeline_get_placement(s->pipe, &q->placement);
    for (size_t i = 0; i < pr->ncomp; i++)
      pr->comps[i].device[pol] =
          (unsigned char)mlo_component_device(mlo_pipeline_component_at(s->pipe, i));
    for (size_t d = 0; d < pr->ndevices; d++) {
      mlo_device_stats ds = {.size = sizeof ds};
      if (mlo_pipeline_get_device_stats(s->pipe, d, &ds) == MLO_OK)
        q->dev_peak[d] = ds.peak_device_bytes;
    }
  }
  if (o.settings.host_budget_bytes && !keep) { /* what the disk costs: the same, all in host */
    run_result all;
    o.settings.host_budget_bytes = 0;
    o.trace = NULL;
    if (session_run(s, &o, &all, err, sizeof err) == MLO_OK)
      q->disk_cost_s = q->wall_s - run_steady(&all, GEN_WALL);
    run_result_free(&all);
  }
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
      if (!(tf > 0) && pr->custom && pa->have_capacity) {
        /* --device-memory alone (issue 43): the compute of the built-in card
         * nearest that memory, said so in the output */
        pr->assumed = plan_device_assumed(pr->dev.memory);
        pr->dev.bf16_tflops = pr->assumed->bf16_tflops;
        pr->dev.fp8_tflops = pr->assumed->fp8_tflops;
        tf = plan_tflops_for(&pr->dev, cost.compute_dtype);
      }
      if (!(tf > 0)) {
        tool_failf("plan", "no compute time for %s: give --device, --tflops or --step-time %s=S",
                   cp->name, mlo_role_name(cp->role));
        return TOOL_EXIT_USAGE;
      }
      secs = cost.flops / (tf * 1e12 * pa->mfu);
      cp->source = "model";
    }
    if (!(secs <= PLAN_MAX_RUN_S)) {
      tool_failf("plan",
                 "%s: %.3g s per forward (%s) is beyond the %.0e s the simulated clock holds: "
                 "a smaller job (--width, --height, --frames) or --step-time",
                 cp->name, secs, cp->source, PLAN_MAX_RUN_S);
      return TOOL_EXIT_USAGE;
    }
    uint64_t ns = (uint64_t)llround(secs * 1e9); /* the clock's unit: compute_s sums these */
    cp->forward_s = (double)ns / 1e9;
    mlo_workload_set_model_time(s->workload, c, ns);
  }
  return 0;
}

/* One pool for CPU and GPU (GB10): the host copy an offload policy keeps
 * is in the same memory as what it loads, so the row fits only if both do. */
static void shared_pool(plan_result *pr, int pol) {
  pol_result *q = &pr->pol[pol];
  if (pr->dev.unified != PLAN_MEM_SHARED || pol == POL_RESIDENT || !q->fits) return;
  uint64_t need = q->peak_device + q->pinned_host + pr->reserve;
  if (need <= pr->dev.memory) return;
  q->fits = false;
  snprintf(q->why, sizeof q->why,
           "short by %s: unified memory: the host copy (%s), the device's peak (%s) and the "
           "reserve (%s) share the one pool of %s",
           tool_size(need - pr->dev.memory), tool_size(q->pinned_host), tool_size(q->peak_device),
           tool_size(pr->reserve), tool_size(pr->dev.memory));
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

/* The card's simulated devices: one, or ndev sharing one clock, each with
 * its memory less `held`. */
static int open_devices(const plan_args *pa, plan_result *pr, tool_session *s, char *err,
                        size_t errlen) {
  uint64_t mem = pr->dev.memory;
  if (pr->ndevices > 1) mem = pr->held < mem ? mem - pr->held : 1u << 20; /* rows say why */
  char spec[256];
  snprintf(spec, sizeof spec, "sim:capacity=%llu,link=%llu", (unsigned long long)mem,
           (unsigned long long)pr->dev.link);
  if (pa->have_disk) {
    size_t len = strlen(spec);
    snprintf(spec + len, sizeof spec - len, ",disk=%llu", (unsigned long long)pa->disk);
  }
  int rc = session_add_device(s, spec, err, errlen);
  while (!rc && s->ndevices < pr->ndevices) {
    if ((rc = session_add_device(s, spec, err, errlen))) return rc;
    mlo_platform *p = s->devices[s->ndevices - 1];
    if ((rc = mlo_sim_share_clock(p, s->platform))) {
      snprintf(err, errlen, "the simulated devices could not share one clock: %s",
               mlo_strerror(rc));
      return rc;
    }
  }
  return rc;
}

static int project(const plan_args *pa, const plan_device *dev, size_t ndev, uint64_t held,
                   plan_result *pr, plan_job *job, bool draw) {
  memset(pr, 0, sizeof *pr);
  pr->ndevices = ndev;
  pr->held = held;
  if (dev)
    pr->dev = *dev;
  else
    pr->dev = (plan_device){"custom", "custom device", 0, 25e9, 0, 0, "", PLAN_MEM_DISCRETE},
    pr->custom = true;
  if (pa->have_capacity) pr->dev.memory = pa->capacity;
  if (pa->have_link) pr->dev.link = (double)pa->link;
  if (pa->have_tflops) pr->dev.bf16_tflops = pr->dev.fp8_tflops = pa->tflops;
  if (!pr->dev.memory) pr->dev.memory = 80ull << 30;
  if ((pr->node = plan_node_find(pa->node))) {
    /* every GPU of the node loads at once, the way the topology makes
     * fastest: the simulated link is that load's rate per GPU */
    pr->gpus = pa->gpus ? (unsigned)pa->gpus : pr->node->gpus;
    pr->topo = plan_node_topology(pr->node, pa->have_link ? (double)pa->link : 0);
    pr->gpu_link = pr->topo.link_bps;
    pr->loads = (mlo_load_plan)MLO_LOAD_PLAN_INIT;
    int bad = mlo_node_plan_loads(&pr->topo, pr->gpus, 1ull << 30, &pr->loads);
    if (!bad && !pa->whole_loads) { /* block by block, as mlo run: the gathers pipelined */
      pr->loads.sharded_s = pr->loads.pipelined_s;
      pr->loads.sharded = pr->loads.pipelined;
    }
    if (bad) {
      tool_failf("plan", "--node %s: the topology does not plan", pr->node->name);
      return TOOL_EXIT_FAIL;
    }
    double s = pr->loads.sharded ? pr->loads.sharded_s : pr->loads.replicated_s;
    pr->dev.link = (double)(1ull << 30) / s;
  }
  char err[1024] = "";
  tool_session s;
  memset(&s, 0, sizeof s);
  int code = 0;
  int rc = open_devices(pa, pr, &s, err, sizeof err);
  mlo_denoise_schedule sched = MLO_DENOISE_SCHEDULE_INIT;
  if (!rc) rc = open_pipeline(pa, &s, &sched, err, sizeof err);
  if (!rc) rc = session_open_workload(&s, err, sizeof err);
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
  pr->budget_least = mlo_workload_stream_least_bytes(s.pipe, NULL);
  if ((code = model_times(pa, &s, pr, job))) goto out;
  plan_reserve(pa, &s, pr, job);
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
  /* The whole projected run on the simulated clock (nanoseconds in 64
   * bits): every forward, and at worst a load of the largest component
   * before each.  Refused where it could wrap, not projected wrong. */
  double worst = (double)pa->prompts *
                 (pr->compute_s + (double)pr->calls * (double)pr->largest / pr->dev.link);
  if (!(worst <= PLAN_MAX_RUN_S)) {
    tool_failf("plan",
               "the projected run could last %.3g s (%ld prompts x %zu forwards, each up to its "
               "load over the link), beyond the %.0e s the simulated clock holds: lower --steps, "
               "--prompts or --step-time, or the job's --width/--height/--frames",
               worst, pa->prompts, pr->calls, PLAN_MAX_RUN_S);
    code = TOOL_EXIT_USAGE;
    goto out;
  }
  for (int p = 0; p < POL_COUNT; p++) {
    if (!plan_wanted(pa, p)) continue;
    pol_result *q = &pr->pol[p];
    q->fits = fits(pa, pr, p, q->why, sizeof q->why);
    if (!q->fits) continue;
    if ((rc = run_policy(pa, &s, pr, p, NULL, NULL))) {
      tool_failf("plan", "%s: %s", pol_names[p], q->why);
      code = tool_exit_for(rc);
      goto out;
    }
    shared_pool(pr, p);
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
    if (rc) code = TOOL_EXIT_FAIL; /* the projection is done: its picture failed to write */
  }
out:
  session_close(&s);
  return code;
}

int plan_device_run(const plan_args *pa, const plan_device *dev, plan_result *pr, plan_job *job,
                    bool draw) {
  return project(pa, dev, 1, 0, pr, job, draw);
}

int plan_devices_run(const plan_args *pa, const plan_device *dev, size_t ndev, uint64_t held,
                     plan_result *pr, plan_job *job) {
  return project(pa, dev, ndev, held, pr, job, false);
}

void plan_free_result(plan_result *pr) {
  free(pr->comps);
  pr->comps = NULL;
}
