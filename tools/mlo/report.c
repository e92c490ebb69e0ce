/*
 * report.c — the report of a run, shared by `mlo run` and `mlo demo`: a
 * snapshot taken while the session is open (so the session can be closed
 * before the all-resident reference run needs the device), printed as a
 * short text table or as one JSON object.  Every figure is next to the
 * figure it should be judged against (peak vs all-resident, wall time vs
 * all-resident), never a bare absolute.
 */
#include "ratio_note.h"
#include "tool.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

int report_snapshot(tool_report *rep, tool_session *s, const run_result *r) {
  rep->platform = dup_str(mlo_platform_description(s->platform));
  rep->capacity = s->capacity;
  rep->load_s = s->load_s;
  rep->load_bytes = s->load_bytes;
  rep->read_s = s->read_s;
  rep->read_bytes = s->read_bytes;
  rep->all_resident = mlo_workload_all_resident_bytes(s->pipe);
  rep->model_need = mlo_workload_model_offload_bytes(s->pipe, NULL);
  rep->tensor_bytes = 0;
  const char *first = NULL, *second = NULL;
  if (tool_dits(s->pipe, &first, &second) == 2) {
    rep->dit_first = dup_str(first);
    rep->dit_second = dup_str(second);
    if (!rep->dit_first || !rep->dit_second) return MLO_ENOMEM;
  }
  rep->run = *r;
  rep->ndevices = s->ndevices > 1 ? s->ndevices : 0;
  rep->placement.size = sizeof rep->placement;
  mlo_pipeline_get_placement(s->pipe, &rep->placement);
  for (size_t d = 0; d < rep->ndevices; d++) {
    mlo_device_stats ds = {.size = sizeof ds};
    if (mlo_pipeline_get_device_stats(s->pipe, d, &ds) == MLO_OK)
      rep->device_peak[d] = ds.peak_device_bytes;
    if (!(rep->device_desc[d] = dup_str(mlo_platform_description(s->devices[d]))))
      return MLO_ENOMEM;
  }
  if (rep->ndevices) { /* the capacity is every device's */
    rep->capacity = 0;
    for (size_t d = 0; d < rep->ndevices; d++) {
      mlo_platform_memory mem;
      if (mlo_platform_get_memory(s->devices[d], &mem) == MLO_OK) rep->capacity += mem.total_bytes;
    }
  }
  rep->ncomp = mlo_pipeline_component_count(s->pipe);
  rep->comps = calloc(rep->ncomp ? rep->ncomp : 1, sizeof *rep->comps);
  if (!rep->platform || !rep->comps) return MLO_ENOMEM;
  for (size_t i = 0; i < rep->ncomp; i++) {
    mlo_component *c = mlo_pipeline_component_at(s->pipe, i);
    comp_report *cr = &rep->comps[i];
    cr->name = dup_str(mlo_component_name(c));
    if (!cr->name) return MLO_ENOMEM;
    cr->role = mlo_component_role(c);
    cr->device = mlo_component_device(c);
    cr->source = mlo_component_role_source(c);
    cr->bytes = mlo_component_bytes(c);
    cr->tensor_bytes = mlo_component_tensor_bytes(c);
    rep->tensor_bytes += cr->tensor_bytes;
    if (cr->bytes > rep->max_comp) rep->max_comp = cr->bytes;
    mlo_component_get_stats(c, &cr->stats);
    if (i < r->nstreams) cr->stream = r->streams[i];
  }
  return MLO_OK;
}

void report_free(tool_report *rep) {
  for (size_t i = 0; rep->comps && i < rep->ncomp; i++) free(rep->comps[i].name);
  free(rep->comps);
  free(rep->platform);
  for (size_t d = 0; d < rep->ndevices; d++) free(rep->device_desc[d]);
  free(rep->dit_first);
  free(rep->dit_second);
  rep->comps = NULL;
  rep->platform = NULL;
  rep->dit_first = rep->dit_second = NULL;
  run_result_free(&rep->run);
  run_result_free(&rep->ref);
}

double tool_ratio(double a, double b) {
  return b > 0 ? a / b : 0;
}

/* The note for a ratio against the all-resident run (ratio_note.h): its
 * spread is that of the reference's own steady prompts. */
static ratio_note ref_note(const tool_report *rep, double ratio) {
  double walls[64];
  int n = rep->ref.ngens < 64 ? rep->ref.ngens : 64;
  for (int g = 0; g < n; g++) walls[g] = rep->ref.gens[g].wall_s;
  return ratio_note_make(ratio, walls, n);
}

static void print_ref_ratio(const tool_report *rep, double ratio, FILE *out) {
  ratio_note n = ref_note(rep, ratio);
  char note[256];
  ratio_note_text(&n, note, sizeof note);
  fprintf(out, " (%.2fx%s)", ratio, note);
}

/* The load's throughput over the plain read's (both cold; the files'
 * bytes include headers the load does not need, so it is slightly kind
 * to the read). */
static double load_vs_read(const tool_report *rep) {
  if (rep->read_s <= 0 || rep->load_s <= 0) return 0;
  return ((double)rep->load_bytes / rep->load_s) / ((double)rep->read_bytes / rep->read_s);
}

/* The slabs were read by enable (a host budget defers the load until it
 * has chosen what stays in host memory), not by a load before the run. */
static bool slabs_read_at_enable(const tool_report *rep) {
  return rep->run.stats.host_budget_bytes && !rep->load_bytes && !rep->load_s;
}

static void print_split(const tool_report *rep, FILE *out) {
  const char *a = rep->dit_first, *b = rep->dit_second;
  if (!a || !b) return;
  const tool_split *sp = &rep->split;
  fprintf(out, "experts    %s %d step%s, %s %d", a, sp->first_steps,
          sp->first_steps == 1 ? "" : "s", b, rep->steps - sp->first_steps);
  if (!strcmp(sp->source, "--boundary-steps"))
    fprintf(out, " (--boundary-steps)\n");
  else
    fprintf(out, " (timestep >= %.3g x %d; %s, shift %.3g; %s)\n", sp->sched.boundary_ratio,
            sp->sched.num_train_timesteps, mlo_denoise_kind_name(sp->sched.kind), sp->sched.shift,
            sp->source);
}

/* One pipeline over several devices: each device, what it held and its
 * peak, then placement's figure per prompt against one device's. */
static void print_devices(const tool_report *rep, FILE *out) {
  for (size_t d = 0; d < rep->ndevices; d++) {
    fprintf(out, "device %zu   %s:", d, rep->device_desc[d]);
    for (size_t i = 0; i < rep->ncomp; i++)
      if (rep->comps[i].device == d) fprintf(out, " %s", rep->comps[i].name);
    fprintf(out, " (peak %s)\n", tool_size(rep->device_peak[d]));
  }
  if (rep->placement.one_device_bytes || rep->placement.moved_bytes)
    fprintf(out, "placement  %s moved per prompt as modelled; %s on one device\n",
            tool_size(rep->placement.moved_bytes), tool_size(rep->placement.one_device_bytes));
}

void report_print_text(const tool_report *rep, FILE *out) {
  fprintf(out, "platform   %s\n", rep->platform);
  print_devices(rep, out);
  fprintf(out, "offload    %s (sync %s", rep->offload, rep->sync);
  if (!strcmp(rep->offload, "model")) {
    fprintf(out, ", policy %s", rep->policy);
    if (rep->run.stats.budget_bytes)
      fprintf(out, " %s%s%s", tool_size(rep->run.stats.budget_bytes),
              rep->prefetch ? " with prefetch" : ", no prefetch",
              rep->learned ? ", schedule learned" : "");
  }
  fprintf(out, "), %d steps, %zu forwards", rep->steps, rep->run.calls);
  if (rep->run.ngens > 1) fprintf(out, ", %d prompts", rep->run.ngens);
  fprintf(out, "\n");
  print_split(rep, out);
  fprintf(out, "\n");
  fprintf(out, "  %-18s %-8s %10s %10s %6s %9s %10s %10s\n", "component", "role", "tensors",
          "on device", "loads", "evictions", "copied in", "copied out");
  for (size_t i = 0; i < rep->ncomp; i++) {
    const comp_report *c = &rep->comps[i];
    fprintf(out, "  %-18s %-8s %10s %10s %6" PRIu64 " %9" PRIu64 " %10s %10s\n", tool_esc(c->name),
            mlo_role_name(c->role), tool_size(c->tensor_bytes), tool_size(c->bytes), c->stats.loads,
            c->stats.evictions, tool_size(c->stats.h2d_bytes), tool_size(c->stats.d2h_bytes));
  }
  fprintf(out, "  (tensors: the weights' bytes; on device: with each tensor aligned to 256 B)\n");
  for (size_t i = 0; i < rep->ncomp; i++) {
    const comp_report *c = &rep->comps[i];
    if (!c->stream.slots) continue;
    fprintf(out,
            "  %s streams: %zu of %zu blocks resident, %zu through %zu slots of %s (%s on the "
            "device); %s per forward, %" PRIu64 " block copies, waited %.3f s for blocks\n",
            tool_esc(c->name), c->stream.resident_blocks, c->stream.blocks,
            c->stream.streamed_blocks, c->stream.slots, tool_size(c->stream.slot_bytes),
            tool_size(c->stream.device_bytes), tool_size(c->stream.streamed_bytes),
            c->stats.block_loads, (double)c->stats.block_wait_ns / 1e9);
  }
  for (size_t i = 0; i < rep->ncomp; i++) {
    const comp_report *c = &rep->comps[i];
    if (!c->stats.joined_loads) continue;
    fprintf(out,
            "  %s: %" PRIu64 " of %" PRIu64 " loads joined to the switch (copied during the "
            "previous component's last forward, into the memory its ended blocks freed)\n",
            tool_esc(c->name), c->stats.joined_loads, c->stats.loads);
  }
  const mlo_pipeline_stats *st = &rep->run.stats;
  if (slabs_read_at_enable(rep)) {
    /* With --host-memory the slabs are read when enable has chosen which
     * stay in host memory: inside the first prompt, not before the run. */
    fprintf(out,
            "\nloaded from disk   %s into host slabs at enable (inside prompt 1's time); the "
            "other %s stays in the checkpoint, read by the disk tier at its loads\n",
            tool_size(st->host_slab_bytes), tool_size(st->disk_bytes));
    bool all = st->pinned_bytes == st->host_slab_bytes + st->staging_bytes;
    fprintf(out,
            "pinned             %s%s the %s of slabs (within the %s budget) and the %s staging "
            "ring (besides the budget, docs/disk.md)\n",
            tool_size(st->pinned_bytes), all ? ": all of" : ", of", tool_size(st->host_slab_bytes),
            tool_size(st->host_budget_bytes), tool_size(st->staging_bytes));
  } else {
    fprintf(out, "\nloaded from disk   %s in %.3f s (%.2f GB/s) into host slabs, %s pinned\n",
            tool_size(rep->load_bytes), rep->load_s,
            rep->load_s > 0 ? (double)rep->load_bytes / rep->load_s / 1e9 : 0.0,
            tool_size(st->pinned_bytes));
  }
  if (rep->read_bytes)
    fprintf(out,
            "                   a plain read of the same files, cold: %.3f s (%.2f GB/s); "
            "the load ran at %.2fx its speed\n",
            rep->read_s, rep->read_s > 0 ? (double)rep->read_bytes / rep->read_s / 1e9 : 0.0,
            load_vs_read(rep));
  if (st->host_budget_bytes) {
    fprintf(out,
            "host memory        budget %s: %s of slabs in host memory, %s left on disk; a %s "
            "staging ring; peak RSS %s%s\n",
            tool_size(st->host_budget_bytes), tool_size(st->host_slab_bytes),
            tool_size(st->disk_bytes), tool_size(st->staging_bytes), tool_size(rep->run.peak_rss),
            rep->capacity && strstr(rep->platform, "host") ? " (the host device's memory in it)"
                                                           : "");
    fprintf(out, "disk tier          %" PRIu64 " loads read %s from the checkpoint (",
            st->total.disk_loads, tool_size(st->total.disk_read_bytes));
    if (rep->run.ngens > 1)
      fprintf(out, "%s in prompt 1, then %s per prompt, median",
              tool_size(rep->run.gens[0].disk_read_bytes),
              tool_size((uint64_t)run_steady(&rep->run, GEN_DISK)));
    else
      fprintf(out, "in the one prompt");
    fprintf(out, "); waited %.3f s for the disk\n", (double)st->total.disk_wait_ns / 1e9);
  }
  char devs[48] = "";
  if (rep->ndevices) snprintf(devs, sizeof devs, " over %zu devices", rep->ndevices);
  fprintf(out, "peak device memory %s of %s capacity%s; all resident needs %s (%.0f%%)\n",
          tool_size(st->peak_device_bytes), tool_size(rep->capacity), devs,
          tool_size(rep->all_resident),
          100.0 * tool_ratio((double)st->peak_device_bytes, (double)rep->all_resident));
  if (rep->run.reserved_peak > rep->run.platform_peak)
    fprintf(out, "                   the allocator held up to %s (its pool's reserve included)\n",
            tool_size(rep->run.reserved_peak));
  fprintf(out,
          "moved              %s in, %s out, %" PRIu64 " loads, %" PRIu64
          " evictions, waited %.3f s\n",
          tool_size(st->total.h2d_bytes), tool_size(st->total.d2h_bytes), st->total.loads,
          st->total.evictions, (double)st->total.wait_ns / 1e9);
  if (rep->run.ngens > 1) {
    fprintf(out, "\n  %-7s %9s %9s %10s %6s %9s %10s\n", "prompt", "wall", "stall", "copied in",
            "loads", "evictions", "prefetches");
    for (int g = 0; g < rep->run.ngens; g++) {
      const gen_result *r = &rep->run.gens[g];
      fprintf(out, "  %-7d %7.3f s %7.3f s %10s %6" PRIu64 " %9" PRIu64 " %10" PRIu64 "%s\n", g + 1,
              r->wall_s, r->stall_s, tool_size(r->h2d_bytes), r->loads, r->evictions, r->prefetches,
              g ? "" : "  (cold: includes enable)");
    }
    double steady = run_steady(&rep->run, GEN_WALL);
    fprintf(out, "steady state       %.3f s per prompt (median of prompts 2-%d)", steady,
            rep->run.ngens);
    if (rep->verify) {
      fprintf(out, "; all resident, warm, %.3f s", run_steady(&rep->ref, GEN_WALL));
      print_ref_ratio(rep, tool_ratio(steady, run_steady(&rep->ref, GEN_WALL)), out);
    }
    fprintf(out, "\n");
  }
  if (!rep->run.digests_agree && rep->run.ngens > 1)
    fprintf(out, "digests            DIFFER between prompts\n");
  if (rep->verify) {
    fprintf(out, "wall time          %.3f s; all resident %.3f s", rep->run.wall_s,
            rep->ref.wall_s);
    print_ref_ratio(rep, tool_ratio(rep->run.wall_s, rep->ref.wall_s), out);
    fprintf(out, "\n");
    fprintf(out, "output identical:  %s (digest %016" PRIx64 ")\n", rep->identical ? "yes" : "NO",
            rep->run.digest);
  } else {
    fprintf(out, "wall time          %.3f s\n", rep->run.wall_s);
    fprintf(out, "digest             %016" PRIx64 "\n", rep->run.digest);
  }
  if (rep->trace_path)
    fprintf(out, "trace              %s (open in ui.perfetto.dev)\n", rep->trace_path);
  if (rep->timeline_path) fprintf(out, "timeline           %s\n", rep->timeline_path);
}

/* Every counter, as the library lists them (times in seconds). */
static void add_stats(cJSON *o, const mlo_component_stats *s) {
  const mlo_stats_field *f;
  size_t n = mlo_component_stats_fields(&f);
  for (size_t i = 0; i < n; i++) {
    uint64_t v;
    memcpy(&v, (const char *)s + f[i].offset, sizeof v);
    if (f[i].seconds)
      cJSON_AddNumberToObject(o, f[i].seconds, (double)v / 1e9);
    else
      cJSON_AddNumberToObject(o, f[i].name, (double)v);
  }
}

static cJSON *build_json(const tool_report *rep) {
  cJSON *root = cJSON_CreateObject();
  char hex[32];
  cJSON_AddStringToObject(root, "platform", rep->platform);
  if (rep->ndevices) {
    cJSON *devs = cJSON_AddArrayToObject(root, "devices");
    for (size_t d = 0; d < rep->ndevices; d++) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddItemToArray(devs, o);
      cJSON_AddNumberToObject(o, "index", (double)d);
      cJSON_AddStringToObject(o, "platform", rep->device_desc[d]);
      cJSON_AddNumberToObject(o, "peak_device_bytes", (double)rep->device_peak[d]);
      cJSON *names = cJSON_AddArrayToObject(o, "components");
      for (size_t i = 0; i < rep->ncomp; i++)
        if (rep->comps[i].device == d)
          cJSON_AddItemToArray(names, cJSON_CreateString(rep->comps[i].name));
    }
    cJSON *pl = cJSON_AddObjectToObject(root, "placement");
    cJSON_AddNumberToObject(pl, "moved_bytes", (double)rep->placement.moved_bytes);
    cJSON_AddNumberToObject(pl, "one_device_bytes", (double)rep->placement.one_device_bytes);
  }
  cJSON_AddStringToObject(root, "offload", rep->offload);
  cJSON_AddStringToObject(root, "sync", rep->sync);
  cJSON_AddStringToObject(root, "policy", rep->policy);
  cJSON_AddNumberToObject(root, "budget_bytes", (double)rep->run.stats.budget_bytes);
  cJSON_AddBoolToObject(root, "prefetch", rep->prefetch);
  cJSON_AddBoolToObject(root, "schedule_learned", rep->learned);
  cJSON_AddNumberToObject(root, "prompts", rep->run.ngens);
  cJSON_AddNumberToObject(root, "steps", rep->steps);
  const char *first = rep->dit_first, *second = rep->dit_second;
  if (first && second) {
    const tool_split *sp = &rep->split;
    cJSON *ex = cJSON_AddObjectToObject(root, "experts");
    cJSON_AddStringToObject(ex, "first", first);
    cJSON_AddStringToObject(ex, "second", second);
    cJSON_AddNumberToObject(ex, "first_steps", sp->first_steps);
    cJSON_AddNumberToObject(ex, "second_steps", rep->steps - sp->first_steps);
    cJSON_AddStringToObject(ex, "source", sp->source);
    cJSON_AddNumberToObject(ex, "boundary_ratio", sp->sched.boundary_ratio);
    cJSON_AddStringToObject(ex, "scheduler", mlo_denoise_kind_name(sp->sched.kind));
    cJSON_AddNumberToObject(ex, "shift", sp->sched.shift);
  }
  cJSON_AddNumberToObject(root, "forwards_scheduled", (double)rep->run.calls);
  cJSON_AddNumberToObject(root, "wall_s", rep->run.wall_s);
  cJSON_AddNumberToObject(root, "device_capacity_bytes", (double)rep->capacity);
  cJSON_AddNumberToObject(root, "peak_device_bytes", (double)rep->run.stats.peak_device_bytes);
  cJSON_AddNumberToObject(root, "platform_peak_bytes", (double)rep->run.platform_peak);
  cJSON_AddNumberToObject(root, "platform_reserved_peak_bytes", (double)rep->run.reserved_peak);
  cJSON_AddNumberToObject(root, "all_resident_bytes", (double)rep->all_resident);
  cJSON_AddNumberToObject(root, "tensor_bytes", (double)rep->tensor_bytes);
  cJSON_AddNumberToObject(root, "model_offload_bytes", (double)rep->model_need);
  cJSON_AddNumberToObject(root, "max_component_bytes", (double)rep->max_comp);
  cJSON_AddNumberToObject(root, "pinned_bytes", (double)rep->run.stats.pinned_bytes);
  cJSON_AddNumberToObject(root, "host_budget_bytes", (double)rep->run.stats.host_budget_bytes);
  cJSON_AddNumberToObject(root, "host_slab_bytes", (double)rep->run.stats.host_slab_bytes);
  cJSON_AddNumberToObject(root, "disk_bytes", (double)rep->run.stats.disk_bytes);
  cJSON_AddNumberToObject(root, "staging_bytes", (double)rep->run.stats.staging_bytes);
  cJSON_AddNumberToObject(root, "peak_rss_bytes", (double)rep->run.peak_rss);
  /* the process's memory at the end of the run, shared pages counted 1/n */
  cJSON_AddNumberToObject(root, "host_pss_bytes", (double)rep->rank.pss);
  cJSON_AddNumberToObject(root, "slab_pss_bytes", (double)rep->rank.slab_pss);
  /* with --host-memory the slabs are read at enable, inside prompt 1: the
   * load before the run (load_s, load_bytes) read nothing */
  cJSON_AddBoolToObject(root, "slabs_read_at_enable", slabs_read_at_enable(rep));
  cJSON_AddNumberToObject(
      root, "slab_read_bytes",
      (double)(slabs_read_at_enable(rep) ? rep->run.stats.host_slab_bytes : rep->load_bytes));
  cJSON_AddNumberToObject(root, "load_s", rep->load_s);
  cJSON_AddNumberToObject(root, "load_bytes", (double)rep->load_bytes);
  cJSON_AddNumberToObject(root, "load_gb_s",
                          rep->load_s > 0 ? (double)rep->load_bytes / rep->load_s / 1e9 : 0);
  if (rep->read_bytes) {
    cJSON_AddNumberToObject(root, "read_check_s", rep->read_s);
    cJSON_AddNumberToObject(root, "read_check_bytes", (double)rep->read_bytes);
    cJSON_AddNumberToObject(root, "load_vs_read", load_vs_read(rep));
  }
  add_stats(root, &rep->run.stats.total);
  cJSON_AddNumberToObject(root, "prefetches", (double)rep->run.stats.total.prefetches);
  snprintf(hex, sizeof hex, "%016" PRIx64, rep->run.digest);
  cJSON_AddStringToObject(root, "digest", hex);
  cJSON_AddBoolToObject(root, "digests_agree", rep->run.digests_agree);
  cJSON_AddNumberToObject(root, "steady_wall_s", run_steady(&rep->run, GEN_WALL));
  cJSON *gens = cJSON_AddArrayToObject(root, "generations");
  for (int g = 0; g < rep->run.ngens; g++) {
    const gen_result *r = &rep->run.gens[g];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "wall_s", r->wall_s);
    cJSON_AddNumberToObject(o, "stall_s", r->stall_s);
    cJSON_AddNumberToObject(o, "h2d_bytes", (double)r->h2d_bytes);
    cJSON_AddNumberToObject(o, "loads", (double)r->loads);
    cJSON_AddNumberToObject(o, "evictions", (double)r->evictions);
    cJSON_AddNumberToObject(o, "prefetches", (double)r->prefetches);
    cJSON_AddNumberToObject(o, "disk_read_bytes", (double)r->disk_read_bytes);
    cJSON_AddNumberToObject(o, "disk_stall_s", r->disk_stall_s);
    snprintf(hex, sizeof hex, "%016" PRIx64, r->digest);
    cJSON_AddStringToObject(o, "digest", hex);
    cJSON_AddItemToArray(gens, o);
  }
  if (rep->verify) {
    cJSON_AddBoolToObject(root, "verified", rep->identical);
    snprintf(hex, sizeof hex, "%016" PRIx64, rep->ref.digest);
    cJSON_AddStringToObject(root, "reference_digest", hex);
    cJSON_AddNumberToObject(root, "reference_wall_s", rep->ref.wall_s);
    cJSON_AddNumberToObject(root, "wall_ratio", tool_ratio(rep->run.wall_s, rep->ref.wall_s));
    cJSON_AddNumberToObject(root, "reference_steady_wall_s", run_steady(&rep->ref, GEN_WALL));
    double steady_ratio =
        tool_ratio(run_steady(&rep->run, GEN_WALL), run_steady(&rep->ref, GEN_WALL));
    cJSON_AddNumberToObject(root, "steady_ratio", steady_ratio);
    /* a ratio below 1 is noise (offload does the same compute plus copies);
     * the reference's own spread over its steady prompts, when it has 2+ */
    ratio_note wn = ref_note(rep, tool_ratio(rep->run.wall_s, rep->ref.wall_s));
    ratio_note sn = ref_note(rep, steady_ratio);
    cJSON_AddBoolToObject(root, "faster_than_baseline_is_noise", wn.noise || sn.noise);
    cJSON_AddBoolToObject(root, "wall_ratio_is_noise", wn.noise);
    cJSON_AddBoolToObject(root, "steady_ratio_is_noise", sn.noise);
    if (sn.spread_known) {
      cJSON *sp = cJSON_AddObjectToObject(root, "reference_steady_spread");
      cJSON_AddNumberToObject(sp, "min_s", sn.lo_s);
      cJSON_AddNumberToObject(sp, "max_s", sn.hi_s);
      cJSON_AddNumberToObject(sp, "relative", sn.spread);
    } else {
      cJSON_AddNullToObject(root, "reference_steady_spread");
    }
  } else {
    cJSON_AddNullToObject(root, "verified");
  }
  cJSON *comps = cJSON_AddArrayToObject(root, "components");
  for (size_t i = 0; i < rep->ncomp; i++) {
    const comp_report *c = &rep->comps[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddNumberToObject(o, "device", (double)c->device);
    cJSON_AddStringToObject(o, "role", mlo_role_name(c->role));
    cJSON_AddStringToObject(o, "role_source", mlo_role_source_name(c->source));
    cJSON_AddNumberToObject(o, "tensor_bytes", (double)c->tensor_bytes);
    cJSON_AddNumberToObject(o, "device_bytes", (double)c->bytes);
    add_stats(o, &c->stats);
    /* its loads go block by block (mlo_component_set_progressive) */
    cJSON_AddBoolToObject(o, "progressive", c->stream.progressive != 0);
    if (c->stream.slots) {
      cJSON *st = cJSON_AddObjectToObject(o, "stream");
      cJSON_AddNumberToObject(st, "blocks", (double)c->stream.blocks);
      cJSON_AddNumberToObject(st, "resident_blocks", (double)c->stream.resident_blocks);
      cJSON_AddNumberToObject(st, "streamed_blocks", (double)c->stream.streamed_blocks);
      cJSON_AddNumberToObject(st, "slots", (double)c->stream.slots);
      cJSON_AddNumberToObject(st, "slot_bytes", (double)c->stream.slot_bytes);
      cJSON_AddNumberToObject(st, "device_bytes", (double)c->stream.device_bytes);
      cJSON_AddNumberToObject(st, "streamed_bytes_per_forward", (double)c->stream.streamed_bytes);
    } else {
      cJSON_AddNullToObject(o, "stream");
    }
    cJSON_AddItemToArray(comps, o);
  }
  if (rep->trace_path) cJSON_AddStringToObject(root, "trace", rep->trace_path);
  if (rep->timeline_path) cJSON_AddStringToObject(root, "timeline", rep->timeline_path);
  return root;
}

int report_print_json(const tool_report *rep, FILE *out) {
  cJSON *root = build_json(rep);
  char *text = root ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  if (!text) return MLO_ENOMEM;
  fprintf(out, "%s\n", text);
  cJSON_free(text);
  tool_json_printed = true;
  return MLO_OK;
}
