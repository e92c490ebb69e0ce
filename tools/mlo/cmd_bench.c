/*
 * cmd_bench.c — `mlo bench`: what offload costs, as ratios measured in one
 * run (bench/README.md): load throughput against a raw copy from 1 MiB to
 * 1 GiB (capped by the memory available), the hot path of a resident
 * hooked forward, a switch against bytes / peak bandwidth, and end to end
 * the overhead curve of each residency policy against a warm all-resident
 * baseline (weights kept across prompts, as a server runs), over the budget
 * from the strict need to everything, on a link throttled so that one DiT
 * load takes one (and three) DiT steps — the ratio of transfer to compute
 * that decides whether offload costs anything (docs/planner.md).
 * Every figure is a median of several runs; end-to-end ratios are paired
 * per repetition (each mode against the resident run of the same
 * repetition) so that drift on a busy machine cancels.
 */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700 /* nftw, before any system header */
#endif
#include "tool.h"

#include <cjson/cJSON.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB (1ull << 20)
#define MAX_SIZES 11
#define MAX_POINTS 8
#define MAX_REPS 9

/* How much a run measures: --quick (seconds, for tests), the default
 * (under a minute on two cores, issue 43) and --full (the long version:
 * loads to 1 GiB, two links, every budget with and without prefetch). */
typedef struct {
  const char *name;
  uint64_t top_load; /* largest load size, before --max-size and free memory */
  int load_reps, hot_reps, switch_reps, link_reps;
  uint64_t switch_bytes;
  double scale; /* of the generated end-to-end pipeline */
  int reps, steps;
  size_t links;          /* host links: one DiT step per DiT load, then three */
  bool no_prefetch_rows; /* the budget points without prefetch too */
} bench_depth;

static const bench_depth depth_quick = {"quick", 16 * MIB, 3, 5, 5, 1,
                                        8 * MIB, 0.0005,   1, 2, 1, false};
static const bench_depth depth_default = {"default", 256 * MIB, 5, 21, 11, 3,
                                          64 * MIB,  0.001,     3, 4,  1,  false};
static const bench_depth depth_full = {"full",   1024 * MIB, 7, 21, 11, 5,
                                       64 * MIB, 0.002,      5, 8,  2,  true};

typedef struct {
  const char *platform, *path;
  bool json, quick, full, have_max_size;
  uint64_t max_size;
  const bench_depth *depth;
} bench_args;

/* One mode on one link: the steady state (prompts 2..) against the warm
 * all-resident run of the same repetition. */
typedef struct {
  char label[64];
  mlo_policy policy;
  uint64_t budget; /* BUDGET only */
  bool prefetch;
  double ratio;              /* median over repetitions of steady wall / resident steady wall */
  double ratio_lo, ratio_hi; /* the spread of that ratio over the repetitions (noise) */
  double exposed;            /* 1 + stall / resident compute per prompt: what noise cannot move */
  double stall_s;            /* per steady prompt (median) */
  uint64_t h2d_bytes;        /* per steady prompt */
  uint64_t loads;            /* per steady prompt */
  uint64_t peak;             /* device bytes */
  uint64_t reserved;         /* the allocator's reserve high-water mark (CUDA pool) */
  double stall_vs_bytes;     /* stall / (h2d bytes / link bandwidth); 0 when nothing moved */
} curve_point;

typedef struct {
  double steps_per_load; /* a DiT load takes this many DiT steps on this link */
  uint64_t bw;           /* bytes per second; 0 = the platform's own link */
  double resident_s;     /* warm all-resident seconds per prompt (median) */
  size_t npoints;
  curve_point points[MAX_POINTS];
} curve;

typedef struct {
  size_t nloads;
  bench_load loads[MAX_SIZES];
  double hot_ns, hot_calls;
  bench_switch sw;
  bench_link link; /* the host link model; copies 0 when not measured */
  int reps, steps, prompts;
  int first_steps;           /* of the two DiTs, from the pipeline's scheduler */
  double dit_step_s;         /* one DiT forward, measured resident */
  uint64_t dit_bytes;        /* the largest DiT */
  uint64_t need, ahead, all; /* strict need, + the largest component, everything */
  uint64_t stream;           /* a budget below the largest component: it streams (0: none) */
  size_t ncurves;
  curve curves[2];
  char e2e_what[256];
} bench_results;

static void help(void) {
  printf("usage: mlo bench [--platform P] [--json] [--quick | --full] [--path CKPT]\n"
         "                 [--max-size SIZE]\n\n"
         "Measures offload's costs as ratios, each a median of several runs:\n"
         "  load        component load throughput / raw copy throughput, 1 MiB .. 1 GiB\n"
         "              (raw copy: memcpy on host, one pinned platform copy elsewhere)\n"
         "  hot path    a hooked forward of a resident component: ns and platform calls\n"
         "  switch      a DiT <-> encoder switch / (bytes / raw copy bandwidth), and the\n"
         "              specification-literal mode (sync device, per-tensor copies,\n"
         "              copy-back) beside it\n"
         "  end to end  per-prompt time of each policy / a warm all-resident run (weights\n"
         "              kept across prompts), steady state over several prompts, on a\n"
         "              generated Wan2.2-shaped pipeline (or --path), at budgets from\n"
         "              the strict need to everything, on host links throttled so one\n"
         "              DiT load takes 1 and 3 DiT steps; with stall per prompt,\n"
         "              bytes moved per prompt and peak device memory\n\n"
         "flags:\n"
         "  --platform P      host (default) | cuda[:N] | opencl[:N]\n"
         "  (default)         loads to 256 MiB, 3 paired runs, one throttled link, budgets\n"
         "                    with prefetch: under a minute on two cores\n"
         "  --quick           small sizes and one run (seconds; for tests)\n"
         "  --full            the long version: loads to 1 GiB, 5 paired runs, links at 1\n"
         "                    and 3 DiT steps per DiT load, budgets with and without\n"
         "                    prefetch, a pipeline twice the size (minutes)\n"
         "  --path CKPT       run the end-to-end part on this checkpoint\n"
         "  --max-size SIZE   largest load size (default 256M, 1G with --full, at most\n"
         "                    16M with --quick; capped by free memory)\n"
         "  --json            one JSON object on stdout\n\n"
         "examples:\n"
         "  mlo bench\n"
         "  mlo bench --platform cuda:0 --json > bench.json\n");
}

static int parse(int argc, char **argv, bench_args *b) {
  targs a;
  targs_init(&a, "bench", argc, argv);
  const char *v;
  while (targs_next(&a)) {
    if (targs_is_help(&a)) return -1;
    if (targs_value(&a, "--platform", &v)) {
      targs_platform(&a, "--platform", v);
      b->platform = v;
    } else if (targs_value(&a, "--path", &v)) {
      b->path = v;
    } else if (targs_value(&a, "--max-size", &v)) {
      b->have_max_size = targs_size(&a, "--max-size", v, &b->max_size);
    } else if (targs_flag(&a, "--json")) {
      b->json = true;
    } else if (targs_flag(&a, "--quick")) {
      b->quick = true;
    } else if (targs_flag(&a, "--full")) {
      b->full = true;
    } else if (targs_cur(&a)[0] == '-') {
      targs_unknown(&a);
    } else {
      targs_error(&a, "unexpected argument '%s'", targs_cur(&a));
    }
  }
  if (!a.failed && b->quick && b->full) targs_error(&a, "give --quick or --full, not both");
  return a.failed ? TOOL_EXIT_USAGE : 0;
}

/* A host spec for one measurement with room for `capacity`.  The host
 * platform's defaults are kept: with poisoning on it pools released blocks
 * for reuse, as a device allocator does, so a load measures copying rather
 * than the kernel faulting in fresh pages. */
static void bench_spec(const char *platform, uint64_t capacity, char *out, size_t outlen) {
  if (!tool_is_host(platform)) {
    snprintf(out, outlen, "%s", platform);
    return;
  }
  spec_with_capacity(platform, capacity, out, outlen);
}

/* Progress on stderr, a part at a time (a terminal only, as every bar of
 * the tool): the default run takes minutes, and said nothing until its
 * table (issue 43). */
static tool_progress bar;
static uint64_t bar_done;
static char bar_label[32];

static void part(const char *label, uint64_t total) {
  progress_finish(&bar);
  snprintf(bar_label, sizeof bar_label, "%s", label);
  progress_init(&bar, bar_label, total);
  bar_done = 0;
  progress_update(&bar, 0, total);
}

static void step(void) {
  progress_update(&bar, ++bar_done, bar.total);
}

static int run_loads(const bench_args *ba, bench_results *res, char *err, size_t errlen) {
  uint64_t avail = (uint64_t)sysconf(_SC_AVPHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
  /* --max-size, never above the quick run's sizes (seconds, for tests) */
  uint64_t top = ba->have_max_size ? ba->max_size : ba->depth->top_load;
  if (ba->depth == &depth_quick && top > depth_quick.top_load) top = depth_quick.top_load;
  /* source + destination + slab + device block, with half the memory spare
   * (top / 8, not top * 8: a --max-size near 2^64 must not wrap) */
  while (top > MIB && top > avail / 8) top /= 2;
  uint64_t sizes = 0;
  for (uint64_t size = MIB; size <= top && sizes < MAX_SIZES; size *= 4) sizes++;
  part("loads", sizes);
  for (uint64_t size = MIB; size <= top && res->nloads < MAX_SIZES; size *= 4) {
    char spec[512];
    bench_spec(ba->platform, 2 * size + 64 * MIB, spec, sizeof spec);
    int reps = size >= 256 * MIB ? 3 : ba->depth->load_reps;
    int rc = bench_load_throughput(spec, size, reps, &res->loads[res->nloads], err, errlen);
    if (rc) return rc;
    res->nloads++;
    step();
  }
  return MLO_OK;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static int open_mode(const bench_args *ba, const char *path, const mlo_open_options *oo,
                     const char *extra, uint64_t capacity, tool_session *s, char *err,
                     size_t errlen) {
  char spec[512], with[600];
  bench_spec(ba->platform, capacity, spec, sizeof spec);
  /* On host: device memory touched up front as a GPU's is, no poison fill
   * (a simulator's check, not a cost a GPU has: it would compete with the
   * forwards for the CPU), and the link throttled where asked. */
  if (tool_is_host(ba->platform))
    snprintf(with, sizeof with, "%s,prefault=1,poison=0%s", spec, extra);
  else
    snprintf(with, sizeof with, "%s", spec);
  tool_source src;
  source_init_path(&src, path);
  session_config cfg = {.source = &src,
                        .platform_spec = with,
                        .overrides = oo->overrides,
                        .override_count = oo->override_count};
  return session_open(s, &cfg, err, errlen);
}

static int run_mode(tool_session *s, const bench_results *res, const curve_point *pt, bool offload,
                    run_result *r, char *err, size_t errlen) {
  run_options o = {.offload = offload,
                   .steps = res->steps,
                   .first_steps = res->first_steps,
                   .prompts = res->prompts};
  o.settings = (mlo_offload_settings)MLO_OFFLOAD_SETTINGS_INIT;
  if (pt) {
    o.settings.policy = pt->policy;
    o.settings.budget_bytes = pt->budget;
    o.settings.prefetch = pt->prefetch;
  }
  return session_run(s, &o, r, err, errlen);
}

/* The compute rate: one DiT forward's seconds, from a resident run on an
 * unthrottled link. */
static int measure_dit_step(tool_session *s, bench_results *res, char *err, size_t errlen) {
  run_result r;
  int rc = run_mode(s, res, NULL, false, &r, err, errlen);
  run_result_free(&r);
  if (rc) return rc;
  res->dit_step_s = r.dit_step_s;
  for (size_t i = 0; i < mlo_pipeline_component_count(s->pipe); i++) {
    mlo_component *c = mlo_pipeline_component_at(s->pipe, i);
    if (mlo_component_role(c) == MLO_ROLE_DIT && mlo_component_bytes(c) > res->dit_bytes)
      res->dit_bytes = mlo_component_bytes(c);
  }
  if (res->dit_step_s <= 0) {
    snprintf(err, errlen, "the end-to-end pipeline has no DiT forwards to time");
    return MLO_EINVAL;
  }
  return MLO_OK;
}

static void add_point(curve *c, mlo_policy policy, uint64_t budget, bool prefetch) {
  if (c->npoints == MAX_POINTS) return;
  curve_point *p = &c->points[c->npoints++];
  memset(p, 0, sizeof *p);
  p->policy = policy;
  p->budget = budget;
  p->prefetch = prefetch;
  if (policy == MLO_POLICY_STRICT)
    snprintf(p->label, sizeof p->label, "strict");
  else
    snprintf(p->label, sizeof p->label, "budget %s%s", tool_size(budget),
             prefetch ? " + prefetch" : "");
}

/* One link: every mode in turn within each repetition, each against that
 * repetition's resident run. */
static int run_curve(const bench_args *ba, const char *path, const mlo_open_options *oo,
                     bench_results *res, curve *cv, char *err, size_t errlen) {
  char extra[64] = "";
  if (cv->bw) snprintf(extra, sizeof extra, ",bw=%llu", (unsigned long long)cv->bw);
  tool_session s;
  int rc = open_mode(ba, path, oo, extra, res->all + res->all / 8 + 64 * MIB, &s, err, errlen);
  if (rc) return rc;
  double resident[MAX_REPS], ratio[MAX_POINTS][MAX_REPS], stall[MAX_POINTS][MAX_REPS];
  double h2d[MAX_POINTS][MAX_REPS], loads[MAX_POINTS][MAX_REPS];
  char label[32];
  if (cv->steps_per_load)
    snprintf(label, sizeof label, "e2e, link %g", cv->steps_per_load);
  else
    snprintf(label, sizeof label, "end to end");
  part(label, (uint64_t)res->reps * (1 + cv->npoints));
  for (int i = 0; i < res->reps && !rc; i++) {
    run_result base;
    rc = run_mode(&s, res, NULL, false, &base, err, errlen);
    step();
    resident[i] = run_steady(&base, GEN_WALL);
    run_result_free(&base);
    for (size_t k = 0; k < cv->npoints && !rc; k++) {
      run_result r;
      curve_point *pt = &cv->points[k];
      rc = run_mode(&s, res, pt, true, &r, err, errlen);
      if (!rc) {
        ratio[k][i] = resident[i] > 0 ? run_steady(&r, GEN_WALL) / resident[i] : 0;
        stall[k][i] = run_steady(&r, GEN_STALL);
        h2d[k][i] = run_steady(&r, GEN_H2D);
        loads[k][i] = run_steady(&r, GEN_LOADS);
        if (r.stats.peak_device_bytes > pt->peak) pt->peak = r.stats.peak_device_bytes;
        if (r.reserved_peak > pt->reserved) pt->reserved = r.reserved_peak;
      }
      run_result_free(&r);
      step();
    }
  }
  session_close(&s);
  if (rc) return rc;
  size_t n = (size_t)res->reps;
  cv->resident_s = bench_median(resident, n);
  for (size_t k = 0; k < cv->npoints; k++) {
    curve_point *pt = &cv->points[k];
    pt->ratio_lo = pt->ratio_hi = ratio[k][0];
    for (size_t i = 1; i < n; i++) {
      if (ratio[k][i] < pt->ratio_lo) pt->ratio_lo = ratio[k][i];
      if (ratio[k][i] > pt->ratio_hi) pt->ratio_hi = ratio[k][i];
    }
    pt->ratio = bench_median(ratio[k], n);
    pt->stall_s = bench_median(stall[k], n);
    pt->h2d_bytes = (uint64_t)bench_median(h2d[k], n);
    pt->loads = (uint64_t)bench_median(loads[k], n);
    pt->exposed = cv->resident_s > 0 ? 1 + pt->stall_s / cv->resident_s : 0;
    if (cv->bw && pt->h2d_bytes)
      pt->stall_vs_bytes = pt->stall_s / ((double)pt->h2d_bytes / (double)cv->bw);
  }
  return MLO_OK;
}

/* The device bytes of each mode, from the headers alone. */
static int size_modes(const char *path, const mlo_open_options *oo, bench_results *res, char *err,
                      size_t errlen) {
  mlo_platform *plat = NULL;
  mlo_pipeline *pipe = NULL;
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  int rc = mlo_platform_open("host", &plat, err, errlen);
  po.platform = plat;
  if (!rc) rc = mlo_pipeline_open_path(&po, path, oo, &pipe, err, errlen);
  if (!rc) {
    res->all = mlo_workload_all_resident_bytes(pipe);
    res->need = mlo_workload_model_offload_bytes(pipe, NULL);
    uint64_t largest = mlo_workload_largest_bytes(pipe, NULL);
    uint64_t ahead = res->need + largest;
    res->ahead = ahead < res->all ? ahead : res->all;
    /* 60% of the largest component, or the least it streams in if more */
    uint64_t least = mlo_workload_stream_least_bytes(pipe, NULL);
    res->stream = largest * 3 / 5 > least ? largest * 3 / 5 : least;
    if (res->stream >= largest) res->stream = 0;
    tool_source src;
    source_init_path(&src, path);
    tool_split split;
    rc = split_resolve(&src, &(tool_split_args){0}, pipe, res->steps, &split, err, errlen);
    res->first_steps = split.first_steps;
  }
  mlo_pipeline_free(pipe);
  mlo_platform_close(plat);
  return rc;
}

static int run_e2e(const bench_args *ba, bench_results *res, char *err, size_t errlen) {
  char tmp[512] = "";
  const char *path = ba->path;
  mlo_open_options oo = MLO_OPEN_OPTIONS_INIT;
  int rc = MLO_OK;
  if (!path) {
    const char *base = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmp, sizeof tmp, "%s/mlo-bench-XXXXXX", base);
    if (!mkdtemp(tmp)) {
      snprintf(err, errlen, "cannot create a temporary folder in %s", base);
      return MLO_EIO;
    }
    /* at full depth: 40 blocks a DiT, as the real model (mlo synth --help) */
    rc = mlo_synth_write("wan2.2-t2v:full-depth", tmp, ba->depth->scale, NULL, NULL, err, errlen);
    path = tmp;
    oo.overrides = tool_wan_roles; /* generated here: its roles are known */
    oo.override_count = tool_wan_nroles;
  }
  snprintf(res->e2e_what, sizeof res->e2e_what, "%s, %d steps, %d prompts",
           ba->path ? ba->path : "generated wan2.2-t2v, full depth", res->steps, res->prompts);
  if (!rc) rc = size_modes(path, &oo, res, err, errlen);
  if (!rc) { /* the compute rate, unthrottled */
    tool_session s;
    rc = open_mode(ba, path, &oo, "", res->all + res->all / 8 + 64 * MIB, &s, err, errlen);
    if (!rc) rc = measure_dit_step(&s, res, err, errlen);
    if (!rc) session_close(&s);
  }
  /* Host links at one and three DiT steps per DiT load; a real device's
   * own link once. */
  static const double per_load[] = {1, 3};
  size_t nlinks = tool_is_host(ba->platform) ? ba->depth->links : 1;
  for (size_t l = 0; l < nlinks && !rc; l++) {
    curve *cv = &res->curves[res->ncurves++];
    cv->steps_per_load = tool_is_host(ba->platform) ? per_load[l] : 0;
    if (cv->steps_per_load) {
      double bw = (double)res->dit_bytes / (per_load[l] * res->dit_step_s);
      cv->bw = bw < 1e6 ? 1000000u : (uint64_t)bw;
    }
    add_point(cv, MLO_POLICY_STRICT, 0, false);
    uint64_t budgets[] = {res->need, res->ahead, res->all};
    for (size_t b = ba->depth == &depth_quick ? 1 : 0; b < 3; b++) {
      if (b && budgets[b] == budgets[b - 1]) continue;
      if (ba->depth->no_prefetch_rows) add_point(cv, MLO_POLICY_BUDGET, budgets[b], false);
      add_point(cv, MLO_POLICY_BUDGET, budgets[b], true);
    }
    if (res->stream) { /* below the largest component: the DiTs stream their blocks */
      add_point(cv, MLO_POLICY_BUDGET, res->stream, true);
      snprintf(cv->points[cv->npoints - 1].label, sizeof cv->points[0].label, "budget %s, streamed",
               tool_size(res->stream));
    }
    rc = run_curve(ba, path, &oo, res, cv, err, errlen);
  }
  if (tmp[0]) nftw(tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return rc;
}

static void print_text(const bench_args *ba, const bench_results *r) {
  printf("mlo bench on %s (medians; the %s run%s)\n\nload throughput / raw copy throughput\n",
         ba->platform, ba->depth->name,
         ba->depth == &depth_full ? "" : ": --full for the long one");
  printf("  %10s %12s %12s %8s\n", "size", "load", "raw copy", "ratio");
  for (size_t i = 0; i < r->nloads; i++)
    printf("  %10s %9.3f ms %9.3f ms %8.3f\n", tool_size(r->loads[i].bytes),
           r->loads[i].load_s * 1e3, r->loads[i].raw_s * 1e3, r->loads[i].ratio);
  printf("\nhot path: hooked forward of a resident component  %.0f ns, %.2f platform calls\n",
         r->hot_ns, r->hot_calls);
  printf("switch of %s: %.3f ms = %.2fx bytes/peak bandwidth (%.3f ms); literal mode %.3f ms = "
         "%.2fx\n",
         tool_size(r->sw.bytes), r->sw.switch_s * 1e3, tool_ratio(r->sw.switch_s, r->sw.ideal_s),
         r->sw.ideal_s * 1e3, r->sw.literal_s * 1e3, tool_ratio(r->sw.literal_s, r->sw.ideal_s));
  if (r->link.copies)
    printf(
        "host link model: %d copies of %s queued back to back at %.2f GB/s move %.4fx the rate\n",
        r->link.copies, tool_size(r->link.bytes), r->link.rate / 1e9, r->link.delivered);
  printf("\nend to end (%s; medians of %d paired runs)\n", r->e2e_what, r->reps);
  printf("  exposed = 1 + stall per prompt / warm all-resident time per prompt: the transfer\n"
         "  time offload puts on the critical path, which machine noise barely moves; wall =\n"
         "  measured per-prompt time / the resident run of the same repetition, with its\n"
         "  spread over the repetitions (on a shared machine, that spread is the noise)\n");
  printf("  one DiT step takes %.1f ms (measured, all resident); the largest DiT is %s\n",
         r->dit_step_s * 1e3, tool_size(r->dit_bytes));
  printf("  budgets: the strict need %s, + the largest component %s, everything %s\n",
         tool_size(r->need), tool_size(r->ahead), tool_size(r->all));
  for (size_t l = 0; l < r->ncurves; l++) {
    const curve *cv = &r->curves[l];
    if (cv->bw)
      printf("\n  link %.2f GB/s (a DiT load takes %.0f DiT step%s); warm all resident %.3f s "
             "per prompt\n",
             (double)cv->bw / 1e9, cv->steps_per_load, cv->steps_per_load == 1 ? "" : "s",
             cv->resident_s);
    else
      printf("\n  the device's own link; warm all resident %.3f s per prompt\n", cv->resident_s);
    printf("    %-28s %8s %17s %12s %12s %6s %10s %12s\n", "mode", "exposed", "wall (min-max)",
           "stall/prompt", "moved/prompt", "loads", "peak", "stall/(B/bw)");
    for (size_t k = 0; k < cv->npoints; k++) {
      const curve_point *p = &cv->points[k];
      char sv[16] = "-", wall[32];
      if (p->stall_vs_bytes > 0) snprintf(sv, sizeof sv, "%.2f", p->stall_vs_bytes);
      snprintf(wall, sizeof wall, "%.2fx (%.2f-%.2f)", p->ratio, p->ratio_lo, p->ratio_hi);
      printf("    %-28s %7.3fx %17s %10.3f s %12s %6llu %10s %12s\n", p->label, p->exposed, wall,
             p->stall_s, tool_size(p->h2d_bytes), (unsigned long long)p->loads, tool_size(p->peak),
             sv);
    }
  }
}

static void print_json(const bench_args *ba, const bench_results *r) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "platform", ba->platform);
  cJSON *loads = cJSON_AddArrayToObject(root, "load");
  for (size_t i = 0; i < r->nloads; i++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "bytes", (double)r->loads[i].bytes);
    cJSON_AddNumberToObject(o, "load_s", r->loads[i].load_s);
    cJSON_AddNumberToObject(o, "raw_copy_s", r->loads[i].raw_s);
    cJSON_AddNumberToObject(o, "ratio", r->loads[i].ratio);
    cJSON_AddItemToArray(loads, o);
  }
  cJSON *hot = cJSON_AddObjectToObject(root, "hot_forward");
  cJSON_AddNumberToObject(hot, "ns", r->hot_ns);
  cJSON_AddNumberToObject(hot, "platform_calls", r->hot_calls);
  cJSON *sw = cJSON_AddObjectToObject(root, "switch");
  cJSON_AddNumberToObject(sw, "bytes", (double)r->sw.bytes);
  cJSON_AddNumberToObject(sw, "switch_s", r->sw.switch_s);
  cJSON_AddNumberToObject(sw, "ideal_s", r->sw.ideal_s);
  cJSON_AddNumberToObject(sw, "ratio", tool_ratio(r->sw.switch_s, r->sw.ideal_s));
  cJSON_AddNumberToObject(sw, "literal_s", r->sw.literal_s);
  cJSON_AddNumberToObject(sw, "literal_ratio", tool_ratio(r->sw.literal_s, r->sw.ideal_s));
  if (r->link.copies) {
    cJSON *lk = cJSON_AddObjectToObject(root, "link_model");
    cJSON_AddNumberToObject(lk, "copies", r->link.copies);
    cJSON_AddNumberToObject(lk, "bytes", (double)r->link.bytes);
    cJSON_AddNumberToObject(lk, "rate", r->link.rate);
    cJSON_AddNumberToObject(lk, "delivered_ratio", r->link.delivered);
  }
  cJSON *e = cJSON_AddObjectToObject(root, "end_to_end");
  cJSON_AddStringToObject(root, "depth", ba->depth->name);
  cJSON_AddStringToObject(e, "pipeline", r->e2e_what);
  cJSON_AddNumberToObject(e, "runs", r->reps);
  cJSON_AddNumberToObject(e, "prompts", r->prompts);
  cJSON_AddNumberToObject(e, "dit_step_s", r->dit_step_s);
  cJSON_AddNumberToObject(e, "dit_bytes", (double)r->dit_bytes);
  cJSON_AddNumberToObject(e, "strict_need_bytes", (double)r->need);
  cJSON_AddNumberToObject(e, "need_plus_next_bytes", (double)r->ahead);
  cJSON_AddNumberToObject(e, "all_resident_bytes", (double)r->all);
  cJSON *links = cJSON_AddArrayToObject(e, "links");
  for (size_t l = 0; l < r->ncurves; l++) {
    const curve *cv = &r->curves[l];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "dit_steps_per_dit_load", cv->steps_per_load);
    cJSON_AddNumberToObject(o, "bw", (double)cv->bw);
    cJSON_AddNumberToObject(o, "resident_s", cv->resident_s);
    cJSON *pts = cJSON_AddArrayToObject(o, "modes");
    for (size_t k = 0; k < cv->npoints; k++) {
      const curve_point *p = &cv->points[k];
      cJSON *m = cJSON_CreateObject();
      cJSON_AddStringToObject(m, "mode", p->label);
      cJSON_AddStringToObject(m, "policy", mlo_policy_name(p->policy));
      cJSON_AddNumberToObject(m, "budget_bytes", (double)p->budget);
      cJSON_AddBoolToObject(m, "prefetch", p->prefetch);
      cJSON_AddNumberToObject(m, "overhead", p->ratio);
      cJSON_AddNumberToObject(m, "overhead_min", p->ratio_lo);
      cJSON_AddNumberToObject(m, "overhead_max", p->ratio_hi);
      cJSON_AddNumberToObject(m, "exposed", p->exposed);
      cJSON_AddNumberToObject(m, "stall_s", p->stall_s);
      cJSON_AddNumberToObject(m, "h2d_bytes", (double)p->h2d_bytes);
      cJSON_AddNumberToObject(m, "loads", (double)p->loads);
      cJSON_AddNumberToObject(m, "peak_device_bytes", (double)p->peak);
      cJSON_AddNumberToObject(m, "reserved_peak_bytes", (double)p->reserved);
      cJSON_AddNumberToObject(m, "stall_vs_bytes", p->stall_vs_bytes);
      cJSON_AddItemToArray(pts, m);
    }
    cJSON_AddItemToArray(links, o);
  }
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  tool_print_json_text(text);
}

int cmd_bench(int argc, char **argv) {
  bench_args ba = {.platform = "host"};
  int code = parse(argc, argv, &ba);
  if (code == -1) {
    help();
    return TOOL_EXIT_OK;
  }
  if (code) return code;
  ba.depth = ba.quick ? &depth_quick : ba.full ? &depth_full : &depth_default;
  bench_results res = {.reps = ba.depth->reps, .steps = ba.depth->steps, .prompts = 3};
  char err[1024] = "", spec[512];
  int rc = run_loads(&ba, &res, err, sizeof err);
  bench_spec(ba.platform, 64 * MIB, spec, sizeof spec);
  part("hot path", 1);
  if (!rc)
    rc = bench_hot_forward(spec, ba.depth->hot_reps, &res.hot_ns, &res.hot_calls, err, sizeof err);
  uint64_t sw = ba.depth->switch_bytes;
  bench_spec(ba.platform, 2 * sw + 64 * MIB, spec, sizeof spec);
  part("switch", 1);
  if (!rc) rc = bench_switch_cost(spec, sw, ba.depth->switch_reps, &res.sw, err, sizeof err);
  part("link model", 1);
  if (!rc && tool_is_host(ba.platform))
    rc = bench_link_model(ba.depth->link_reps, &res.link, err, sizeof err);
  part("e2e, setup", 1);
  if (!rc) rc = run_e2e(&ba, &res, err, sizeof err);
  progress_finish(&bar);
  if (rc) {
    tool_err("bench: %s", err[0] ? err : mlo_strerror(rc));
    return tool_exit_for(rc);
  }
  if (ba.json)
    print_json(&ba, &res);
  else
    print_text(&ba, &res);
  return TOOL_EXIT_OK;
}
