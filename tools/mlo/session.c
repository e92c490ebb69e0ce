/*
 * session.c — what `run`, `demo` and `bench` share: open a checkpoint on a
 * platform, materialize it (with a load bar), and run the reference
 * schedule once in either mode, measuring the same span for both (enable or
 * load-all through the last forward), so that offloaded / all-resident is a
 * fair ratio.  Every run starts cold, with each component on the host.
 */
#include "tool.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void spec_with_capacity(const char *spec, uint64_t capacity, char *out, size_t outlen) {
  /* the name, the device index (0 where none is given), every option but
   * capacity, then ours (a fault: wrapper's inner platform gets it: the
   * library's grammar, mlo_platform_spec_compose); a platform with neither
   * an index nor a capacity of its own (sim) as given */
  char name[32], cap[32];
  int index = -1;
  bool indexed = false;
  snprintf(cap, sizeof cap, "%llu", (unsigned long long)capacity);
  if (mlo_platform_spec_parts(spec, name, sizeof name, &index) ||
      (strcmp(name, "host") && (!tool_platform_known(name, &indexed) || !indexed)) ||
      mlo_platform_spec_compose(spec, indexed && index < 0 ? 0 : index, "capacity", cap, out,
                                outlen))
    snprintf(out, outlen, "%s", spec);
}

/* The pipeline over the session's devices, --place's pins applied. */
static int open_pipeline(tool_session *s, const session_config *cfg, char *err, size_t errlen) {
  int rc = source_open(cfg->source, s->devices, s->ndevices, cfg->overrides, cfg->override_count,
                       &s->pipe, err, errlen);
  if (rc == MLO_EUNSUPPORTED && s->ndevices > 1 && cfg->source->comm)
    snprintf(err, errlen,
             "--ranks with several --platform: ranks and devices do not combine yet "
             "(docs/placement.md)");
  for (size_t i = 0; i < cfg->nplace && !rc; i++) {
    mlo_component *c = mlo_pipeline_find(s->pipe, cfg->place[i].name);
    if (!c) {
      snprintf(err, errlen, "--place %s: no component of that name in %s", cfg->place[i].name,
               cfg->source->label);
      return MLO_EINVAL;
    }
    if ((rc = mlo_component_set_device(c, cfg->place[i].device)))
      snprintf(err, errlen, "--place %s=%d: %s", cfg->place[i].name, cfg->place[i].device,
               mlo_pipeline_errmsg(s->pipe));
  }
  return rc;
}

int session_add_device(tool_session *s, const char *spec, char *err, size_t errlen) {
  if (s->ndevices >= TOOL_MAX_DEVICES) {
    snprintf(err, errlen, "at most %d devices (--platform)", TOOL_MAX_DEVICES);
    return MLO_EINVAL;
  }
  char msg[512] = "";
  mlo_platform *p = NULL;
  int rc = mlo_platform_open(spec, &p, msg, sizeof msg);
  if (rc) {
    snprintf(err, errlen, "cannot open platform '%s': %s", spec, msg[0] ? msg : mlo_strerror(rc));
    return rc;
  }
  s->devices[s->ndevices++] = p;
  if (!s->platform) s->platform = p;
  mlo_platform_memory mem;
  if (mlo_platform_get_memory(p, &mem) == MLO_OK && mem.total_bytes > s->capacity)
    s->capacity = mem.total_bytes;
  return MLO_OK;
}

static void drop_from_cache(const char *const *files, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int fd = open(files[i], O_RDONLY | O_NONBLOCK);
    if (fd < 0) continue;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

/* Drops the files from the page cache, reads them plainly front to back
 * (the disk's own speed: what a load is judged against), and drops them
 * again, so that the load that follows is cold too. */
static int plain_read(tool_session *s, char *err, size_t errlen) {
  const char **files = NULL;
  size_t n = tool_files(s->pipe, NULL, &files);
  size_t chunk = (size_t)64 << 20;
  char *buf = malloc(chunk);
  int rc = buf || !n ? MLO_OK : MLO_ENOMEM;
  drop_from_cache(files, n);
  uint64_t t0 = mlo_now_ns();
  for (size_t i = 0; i < n && !rc; i++) {
    int fd = open(files[i], O_RDONLY | O_NONBLOCK);
    if (fd < 0) {
      snprintf(err, errlen, "--read-check: cannot open %s: %s", files[i], strerror(errno));
      rc = MLO_EIO;
      break;
    }
    for (ssize_t got; (got = read(fd, buf, chunk)) != 0;) {
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        snprintf(err, errlen, "--read-check: reading %s: %s", files[i], strerror(errno));
        rc = MLO_EIO;
        break;
      }
      s->read_bytes += (uint64_t)got;
    }
    close(fd);
  }
  s->read_s = (double)(mlo_now_ns() - t0) / 1e9;
  drop_from_cache(files, n);
  free(buf);
  free(files);
  return rc;
}

static int materialize(tool_session *s, const session_config *cfg, char *err, size_t errlen) {
  if (cfg->read_check) {
    int rc = plain_read(s, err, errlen);
    if (rc) return rc;
  }
  tool_progress bar;
  progress_init(&bar, "loading", mlo_workload_all_resident_bytes(s->pipe));
  if (cfg->progress) mlo_pipeline_set_progress(s->pipe, progress_load_cb, &bar);
  uint64_t t0 = mlo_now_ns();
  uint64_t io0 = ranks_io_read_bytes();
  int rc = mlo_pipeline_materialize(s->pipe);
  s->load_s = (double)(mlo_now_ns() - t0) / 1e9;
  s->load_io_read = ranks_io_read_bytes() - io0;
  mlo_pipeline_stats st;
  if (!rc && mlo_pipeline_get_stats(s->pipe, &st) == MLO_OK) s->load_bytes = st.host_slab_bytes;
  mlo_pipeline_set_progress(s->pipe, NULL, NULL);
  progress_finish(&bar);
  if (rc)
    snprintf(err, errlen, "cannot load %s: %s", cfg->source->label,
             mlo_pipeline_errmsg(s->pipe)[0] ? mlo_pipeline_errmsg(s->pipe) : mlo_strerror(rc));
  return rc;
}

bool tool_is_host(const char *spec) {
  return spec && !strncmp(spec, "host", 4) && (spec[4] == '\0' || spec[4] == ':');
}

int session_open_workload(tool_session *s, char *err, size_t errlen) {
  int rc = mlo_workload_open(s->platform, &s->workload, err, errlen);
  for (size_t i = 1; i < s->ndevices && !rc; i++)
    rc = mlo_workload_add_device(s->workload, s->devices[i], err, errlen);
  return rc;
}

int session_open(tool_session *s, const session_config *cfg, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  char msg[512] = "";
  int rc = session_add_device(s, cfg->platform_spec, err, errlen);
  if (rc) return rc;
  for (size_t i = 0; i < cfg->nmore && !rc; i++)
    rc = session_add_device(s, cfg->more_specs[i], err, errlen);
  if (rc) goto out_close;
  if (cfg->source->sharded) { /* a device that gathers needs the node's NCCL communicator */
    bool made = false;
    rc = ranks_device_comm(cfg->source->comm, s->platform, &made, msg, sizeof msg);
    if (made) s->nccl_comm = cfg->source->comm;
    if (rc) {
      snprintf(err, errlen, "%s", msg);
      goto out_close;
    }
  }
  rc = open_pipeline(s, cfg, err, errlen);
  if (rc) goto out_close;
  rc = session_open_workload(s, err, errlen);
  if (rc) goto out_close;
  for (int r = MLO_ROLE_DIT; r <= MLO_ROLE_OTHER; r++)
    if (cfg->tokens[r]) mlo_workload_set_tokens(s->workload, (mlo_role)r, cfg->tokens[r]);
  if (cfg->before_load) {
    int code = cfg->before_load(s, cfg->before_load_user, err, errlen);
    if (code) {
      session_close(s);
      s->refused = code;
      return TOOL_SESSION_REFUSED;
    }
  }
  if (cfg->defer_materialize) return MLO_OK;
  rc = materialize(s, cfg, err, errlen);
  if (rc) goto out_close;
  return MLO_OK;
out_close:
  session_close(s);
  return rc;
}

void session_close(tool_session *s) {
  mlo_workload_close(s->workload);
  mlo_pipeline_free(s->pipe);
  if (s->nccl_comm) ranks_device_comm_free(s->nccl_comm); /* before its platform goes */
  for (size_t i = 1; i < s->ndevices; i++) mlo_platform_close(s->devices[i]);
  mlo_platform_close(s->platform);
  memset(s, 0, sizeof *s);
}

/* "transformer + vae": every component the offload need counts — the VAEs
 * and either every encoder or the largest DiT, whichever phase is larger. */
static const char *need_names(mlo_pipeline *pipe, const mlo_component *largest) {
  static char names[512];
  size_t len = 0;
  names[0] = '\0';
  bool encoders = largest && mlo_component_role(largest) == MLO_ROLE_ENCODER;
  size_t n = mlo_pipeline_component_count(pipe);
  for (size_t i = 0; i < n; i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    mlo_role r = mlo_component_role(c);
    bool counted = r == MLO_ROLE_VAE || (encoders ? r == MLO_ROLE_ENCODER : c == largest);
    if (!counted || len >= sizeof names - 1) continue;
    len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", len ? " + " : "",
                            mlo_component_name(c));
  }
  return names[0] ? names : "the pipeline";
}

bool session_fits(tool_session *s, bool offload, uint64_t *need, const char **what) {
  mlo_component *largest = NULL;
  if (offload) {
    *need = mlo_workload_model_offload_bytes(s->pipe, &largest);
    *what = need_names(s->pipe, largest);
  } else {
    *need = mlo_workload_all_resident_bytes(s->pipe);
    *what = "every component at once (--offload none)";
  }
  return *need <= s->capacity;
}

/* Back to a cold start: hooks off, every component on the host. */
static int make_cold(tool_session *s) {
  int rc = mlo_offload_disable(s->pipe);
  if (rc) return rc;
  size_t n = mlo_pipeline_component_count(s->pipe);
  for (size_t i = 0; i < n; i++) {
    mlo_component *c = mlo_pipeline_component_at(s->pipe, i);
    if (mlo_component_is_resident(c) && (rc = mlo_component_evict(c))) return rc;
  }
  return mlo_pipeline_synchronize(s->pipe); /* every device */
}

/* Declares the run's call list as the pipeline's schedule: one request,
 * repeating prompt after prompt (consecutive calls merge into runs). */
static int declare_schedule(tool_session *s, const mlo_workload_call *calls, size_t count) {
  mlo_schedule_entry *e = calloc(count ? count : 1, sizeof *e);
  if (!e) return MLO_ENOMEM;
  for (size_t i = 0; i < count; i++) e[i] = (mlo_schedule_entry){calls[i].comp, 1};
  int rc = mlo_pipeline_set_schedule(s->pipe, e, count);
  free(e);
  return rc;
}

/* The progress bar spans every generation. */
typedef struct {
  tool_progress *bar;
  size_t base, total;
} gen_progress;

static void gen_step_cb(size_t done, size_t total, const mlo_component *comp, void *user) {
  (void)total;
  gen_progress *g = user;
  progress_step_cb(g->base + done, g->total, comp, g->bar);
}

static int timed_run(tool_session *s, const run_options *o, mlo_workload_call *calls, size_t count,
                     run_result *r) {
  tool_progress bar;
  int prompts = o->prompts > 0 ? o->prompts : 1;
  progress_init(&bar,
                o->progress_label ? o->progress_label
                : o->offload      ? "offloaded"
                                  : "resident",
                count * (size_t)prompts);
  r->gens = calloc((size_t)prompts, sizeof *r->gens);
  if (!r->gens) return MLO_ENOMEM;
  /* The platform's clock: virtual on the simulated device (mlo plan). */
  uint64_t t0 = mlo_platform_now_ns(s->platform);
  r->start_ns = t0;
  bar.t0_ns = mlo_now_ns();
  int rc = o->offload ? mlo_offload_enable(s->pipe, &o->settings) : mlo_pipeline_load_all(s->pipe);
  size_t ncomp = mlo_pipeline_component_count(s->pipe);
  if (!rc && (r->streams = calloc(ncomp ? ncomp : 1, sizeof *r->streams))) {
    r->nstreams = ncomp; /* the plan ends with offload: the report shows it */
    for (size_t i = 0; i < ncomp; i++)
      mlo_component_stream_info(mlo_pipeline_component_at(s->pipe, i), &r->streams[i]);
  }
  uint64_t g0 = t0;
  mlo_pipeline_stats before = {0}, after;
  r->digests_agree = true;
  for (int p = 0; p < prompts && !rc; p++) {
    gen_progress gp = {&bar, count * (size_t)p, count * (size_t)prompts};
    gen_result *g = &r->gens[p];
    rc = mlo_workload_run(s->workload, calls, count, &g->digest, o->progress ? gen_step_cb : NULL,
                          &gp, &r->failed);
    /* The digest is on the host, so this prompt's compute is done.  The
     * device is drained only after the last: a prefetch for the next prompt
     * still in flight belongs to the next prompt, as on a server, and is
     * counted there if anything waits for it. */
    if (p == prompts - 1 || rc) { /* loads from disk included: the counters are final */
      int sync_rc = mlo_pipeline_synchronize(s->pipe);
      if (!rc) rc = sync_rc;
    }
    uint64_t g1 = mlo_platform_now_ns(s->platform);
    mlo_pipeline_get_stats(s->pipe, &after);
    g->wall_s = (double)(g1 - g0) / 1e9;
    g->stall_s = (double)(after.total.wait_ns - before.total.wait_ns) / 1e9;
    g->h2d_bytes = after.total.h2d_bytes - before.total.h2d_bytes;
    g->loads = after.total.loads - before.total.loads;
    g->evictions = after.total.evictions - before.total.evictions;
    g->prefetches = after.total.prefetches - before.total.prefetches;
    g->disk_read_bytes = after.total.disk_read_bytes - before.total.disk_read_bytes;
    g->disk_stall_s = (double)(after.total.disk_wait_ns - before.total.disk_wait_ns) / 1e9;
    if (!rc) r->ngens = p + 1;
    if (g->digest != r->gens[0].digest) r->digests_agree = false;
    before = after;
    g0 = g1;
  }
  r->digest = r->gens[0].digest;
  r->wall_s = (double)(mlo_platform_now_ns(s->platform) - t0) / 1e9;
  progress_finish(&bar);
  if (!rc && o->audit) rc = mlo_pipeline_audit(s->pipe);
  return rc;
}

void run_result_free(run_result *r) {
  free(r->gens);
  free(r->streams);
  r->streams = NULL;
  r->nstreams = 0;
  r->gens = NULL;
  r->ngens = 0;
}

static double gen_value(const gen_result *g, gen_figure what) {
  switch (what) {
  case GEN_WALL:
    return g->wall_s;
  case GEN_STALL:
    return g->stall_s;
  case GEN_H2D:
    return (double)g->h2d_bytes;
  case GEN_LOADS:
    return (double)g->loads;
  case GEN_DISK:
    return (double)g->disk_read_bytes;
  case GEN_DISK_STALL:
    return g->disk_stall_s;
  }
  return 0;
}

double run_steady(const run_result *r, gen_figure what) {
  if (!r->ngens) return what == GEN_WALL ? r->wall_s : 0;
  double v[256];
  size_t n = 0;
  for (int g = r->ngens > 1 ? 1 : 0; g < r->ngens && n < sizeof v / sizeof v[0]; g++)
    v[n++] = gen_value(&r->gens[g], what);
  return bench_median(v, n);
}

int session_run(tool_session *s, const run_options *o, run_result *r, char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  mlo_workload_call *calls = NULL;
  int rc = mlo_workload_schedule(s->pipe, o->steps, o->first_steps, &calls, &r->calls);
  if (rc) {
    snprintf(err, errlen, "cannot build the schedule: %s", mlo_strerror(rc));
    return rc;
  }
  rc = make_cold(s);
  /* the reference forward begins and ends every block: its loads may go
   * block by block (each takes effect at the component's next load) */
  for (size_t i = 0; !rc && i < mlo_pipeline_component_count(s->pipe); i++)
    rc = mlo_component_set_progressive(mlo_pipeline_component_at(s->pipe, i), !o->whole_loads);
  if (!rc)
    rc = o->learn_schedule ? mlo_pipeline_learn_schedule(s->pipe, true)
                           : declare_schedule(s, calls, r->calls);
  if (rc) {
    const char *why = mlo_pipeline_errmsg(s->pipe); /* empty when a platform call failed */
    snprintf(err, errlen, "cannot reset residency: %s", why[0] ? why : mlo_strerror(rc));
    free(calls);
    return rc;
  }
  mlo_pipeline_reset_stats(s->pipe);
  mlo_platform_reset_peak(s->platform);
  ranks_reset_peak_rss(); /* the run's own peak, not an earlier run's in this process */
  if (o->trace) mlo_pipeline_set_trace(s->pipe, tool_trace_hook, o->trace);
  mlo_pipeline_set_audit(s->pipe, o->audit);
  rc = timed_run(s, o, calls, r->calls, r);
  if (rc) {
    const char *detail = mlo_pipeline_errmsg(s->pipe);
    snprintf(err, errlen, "%s%s%s", mlo_strerror(rc), detail[0] ? ": " : "", detail);
  }
  mlo_pipeline_set_trace(s->pipe, NULL, NULL);
  mlo_pipeline_set_audit(s->pipe, false);
  mlo_pipeline_get_stats(s->pipe, &r->stats);
  uint64_t dit_ns = 0, dit_forwards = 0;
  for (size_t i = 0; i < mlo_pipeline_component_count(s->pipe); i++) {
    mlo_component *c = mlo_pipeline_component_at(s->pipe, i);
    mlo_component_stats st;
    if (mlo_component_role(c) != MLO_ROLE_DIT || mlo_component_get_stats(c, &st)) continue;
    dit_ns += st.forward_ns;
    dit_forwards += st.forwards;
  }
  r->dit_step_s = dit_forwards ? (double)dit_ns / 1e9 / (double)dit_forwards : 0;
  r->peak_rss = ranks_peak_rss_bytes();
  mlo_platform_memory mem;
  if (mlo_platform_get_memory(s->platform, &mem) == MLO_OK) {
    r->platform_peak = mem.peak_bytes;
    r->reserved_peak = mem.reserved_peak_bytes;
  }
  int off_rc = mlo_offload_disable(s->pipe);
  if (!rc) rc = off_rc;
  mlo_pipeline_learn_schedule(s->pipe, false);
  mlo_pipeline_set_schedule(s->pipe, NULL, 0);
  free(calls);
  return rc;
}

int session_reference_run(const session_config *cfg, const run_options *o, uint64_t all_resident,
                          run_result *r, char *err, size_t errlen) {
  /* On host the device's capacity is only accounting, so the reference gets
   * one that holds every component; other platforms run at their real
   * size and may not fit. */
  session_config ref = *cfg;
  char spec[512];
  spec_with_capacity(cfg->platform_spec, all_resident + all_resident / 8 + (64u << 20), spec,
                     sizeof spec);
  ref.platform_spec = spec;
  ref.nmore = ref.nplace = 0; /* one device holds everything: the plainest run there is */
  tool_session s;
  int rc = session_open(&s, &ref, err, errlen);
  if (rc) return rc;
  run_options ro = *o;
  ro.offload = false;
  ro.audit = false;
  ro.trace = NULL;
  ro.progress_label = "reference"; /* the all-resident run --verify compares with */
  uint64_t need;
  const char *what;
  if (!session_fits(&s, false, &need, &what)) {
    snprintf(err, errlen, "the all-resident reference needs %s of device memory; the device has %s",
             tool_size(need), tool_size(s.capacity));
    session_close(&s);
    return MLO_ENOMEM_DEVICE;
  }
  rc = session_run(&s, &ro, r, err, errlen);
  session_close(&s);
  return rc;
}

int session_write_pictures(const tool_trace *t, tool_session *s, const char *title,
                           const run_options *o, const run_result *r, const char *trace_path,
                           const char *svg_path, char *err, size_t errlen) {
  int rc = MLO_OK;
  if (t->overflow) {
    snprintf(err, errlen, "the trace is incomplete (out of memory while recording)");
    return MLO_ENOMEM;
  }
  if (trace_path) rc = tool_trace_write_json(t, trace_path, err, errlen);
  char subtitle[512], mode[128] = "all resident", sync[32] = "";
  if (o->offload && o->settings.policy == MLO_POLICY_BUDGET)
    snprintf(mode, sizeof mode, "budget %s%s", tool_size(r->stats.budget_bytes),
             o->settings.prefetch ? " + prefetch" : "");
  else if (o->offload)
    snprintf(mode, sizeof mode, "model-level offload (strict)");
  if (o->settings.sync != MLO_SYNC_EVENT) /* the default goes unsaid: the line must fit */
    snprintf(sync, sizeof sync, ", sync %s", mlo_sync_name(o->settings.sync));
  char prompts[32] = "";
  if (r->ngens > 1) snprintf(prompts, sizeof prompts, " x %d prompts", r->ngens);
  snprintf(subtitle, sizeof subtitle, "%s  |  %s%s  |  %d steps%s  |  wall %.2f s",
           mlo_platform_description(s->platform), mode, sync, o->steps, prompts, r->wall_s);
  if (!rc && svg_path) {
    /* each prompt's start, from the prompts' walls: the axis and its marks */
    uint64_t *starts = calloc(r->ngens > 0 ? (size_t)r->ngens : 1, sizeof *starts);
    if (!starts) {
      snprintf(err, errlen, "out of memory drawing the timeline");
      return MLO_ENOMEM;
    }
    double at = 0;
    for (int p = 0; p < r->ngens; p++) {
      starts[p] = r->start_ns + (uint64_t)(at * 1e9);
      at += r->gens[p].wall_s;
    }
    tool_timeline_run run = {
        .capacity = s->capacity,
        .budget = o->offload && o->settings.policy == MLO_POLICY_BUDGET ? r->stats.budget_bytes : 0,
        .start_ns = r->start_ns,
        .end_ns = r->start_ns + (uint64_t)(r->wall_s * 1e9),
        .prompt_ns = starts,
        .nprompts = r->ngens};
    rc = tool_timeline_write_svg(t, s->pipe, &run, title, subtitle, svg_path, err, errlen);
    free(starts);
  }
  return rc;
}
