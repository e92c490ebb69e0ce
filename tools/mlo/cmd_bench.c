/*
 * cmd_bench.c — `mlo bench`: what offload costs, as ratios measured in one
 * run (design.md §6): load throughput against a raw copy from 1 MiB to
 * 1 GiB (capped by the memory available), the hot path of a resident
 * hooked forward, a switch against bytes / peak bandwidth, and end to end
 * offloaded / all-resident wall time with the specification-literal mode
 * (--sync device, per-tensor copies, copy-back) beside it as the baseline.
 * Every figure is a median of several runs.
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

typedef struct {
  const char *platform, *path;
  bool json, quick;
  uint64_t max_size;
} bench_args;

typedef struct {
  size_t nloads;
  bench_load loads[MAX_SIZES];
  double hot_ns, hot_calls;
  bench_switch sw;
  int reps, steps;
  double e2e_resident, e2e_offload, e2e_literal;
  uint64_t peak_resident, peak_offload, peak_literal;
  char e2e_what[256];
} bench_results;

static void help(void) {
  printf("usage: mlo bench [--platform P] [--json] [--quick] [--path CKPT] [--max-size SIZE]\n\n"
         "Measures offload's costs as ratios, each a median of several runs:\n"
         "  load        component load throughput / raw copy throughput, 1 MiB .. 1 GiB\n"
         "              (raw copy: memcpy on host, one pinned platform copy elsewhere)\n"
         "  hot path    a hooked forward of a resident component: ns and platform calls\n"
         "  switch      a DiT <-> encoder switch / (bytes / raw copy bandwidth), and the\n"
         "              specification-literal mode (sync device, per-tensor copies,\n"
         "              copy-back) beside it\n"
         "  end to end  offloaded / all-resident wall time of the reference workload on\n"
         "              a generated Wan2.2-shaped pipeline (or --path), literal mode beside\n\n"
         "flags:\n"
         "  --platform P      host (default) | cuda[:N] | opencl[:N]\n"
         "  --quick           small sizes and few runs (seconds; for tests)\n"
         "  --path CKPT       run the end-to-end part on this checkpoint\n"
         "  --max-size SIZE   largest load size (default 1G, capped by free memory)\n"
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
      if (v && strncmp(v, "host", 4) && strncmp(v, "cuda", 4) && strncmp(v, "opencl", 6))
        targs_error(&a, "--platform: expected host, cuda[:N] or opencl[:N], got '%s'", v);
      b->platform = v;
    } else if (targs_value(&a, "--path", &v)) {
      b->path = v;
    } else if (targs_value(&a, "--max-size", &v)) {
      targs_size(&a, "--max-size", v, &b->max_size);
    } else if (targs_flag(&a, "--json")) {
      b->json = true;
    } else if (targs_flag(&a, "--quick")) {
      b->quick = true;
    } else if (targs_cur(&a)[0] == '-') {
      targs_unknown(&a);
    } else {
      targs_error(&a, "unexpected argument '%s'", targs_cur(&a));
    }
  }
  return a.failed ? TOOL_EXIT_USAGE : 0;
}

static bool is_host(const char *spec) {
  return !strncmp(spec, "host", 4) && (spec[4] == '\0' || spec[4] == ':');
}

/* A host spec for one measurement with room for `capacity`.  The host
 * platform's defaults are kept: with poisoning on it pools released blocks
 * for reuse, as a device allocator does, so a load measures copying rather
 * than the kernel faulting in fresh pages. */
static void bench_spec(const char *platform, uint64_t capacity, char *out, size_t outlen) {
  if (!is_host(platform)) {
    snprintf(out, outlen, "%s", platform);
    return;
  }
  spec_with_capacity(platform, capacity, out, outlen);
}

static int run_loads(const bench_args *ba, bench_results *res, char *err, size_t errlen) {
  uint64_t avail = (uint64_t)sysconf(_SC_AVPHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
  uint64_t top = ba->quick ? 16 * MIB : ba->max_size;
  /* source + destination + slab + device block, with half the memory spare */
  while (top > MIB && top * 8 > avail) top /= 2;
  for (uint64_t size = MIB; size <= top && res->nloads < MAX_SIZES; size *= 4) {
    char spec[512];
    bench_spec(ba->platform, 2 * size + 64 * MIB, spec, sizeof spec);
    int reps = ba->quick ? 3 : size >= 256 * MIB ? 3 : 7;
    int rc = bench_load_throughput(spec, size, reps, &res->loads[res->nloads], err, errlen);
    if (rc) return rc;
    res->nloads++;
  }
  return MLO_OK;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

/* One run of a mode; keeps its wall time and peak. */
static int timed_run(tool_session *s, run_options *o, const mlo_offload_settings *settings,
                     bool offload, double *wall, uint64_t *peak, char *err, size_t errlen) {
  run_result r;
  o->offload = offload;
  o->settings = *settings;
  int rc = session_run(s, o, &r, err, errlen);
  if (rc) return rc;
  *wall = r.wall_s;
  *peak = r.stats.peak_device_bytes;
  return MLO_OK;
}

static int open_mode(const bench_args *ba, const char *path, const mlo_open_options *oo,
                     uint64_t capacity, tool_session *s, char *err, size_t errlen) {
  char spec[512];
  bench_spec(ba->platform, capacity, spec, sizeof spec);
  session_config cfg = {path, spec, oo->overrides, oo->override_count, false, {0}};
  return session_open(s, &cfg, err, errlen);
}

/* The three modes run in turn within each repetition (resident, offloaded,
 * literal), so that drift on a busy machine touches all of them alike; the
 * figures are medians over the repetitions. */
static int e2e_modes(const bench_args *ba, const char *path, const mlo_open_options *oo,
                     uint64_t all, uint64_t need, run_options *o, bench_results *res, char *err,
                     size_t errlen) {
  tool_session resident, offload;
  int rc = open_mode(ba, path, oo, all + all / 8 + 64 * MIB, &resident, err, errlen);
  if (rc) return rc;
  rc = open_mode(ba, path, oo, need + need / 8 + 16 * MIB, &offload, err, errlen);
  if (rc) {
    session_close(&resident);
    return rc;
  }
  mlo_offload_settings fast = MLO_OFFLOAD_SETTINGS_INIT, literal = fast;
  literal.sync = MLO_SYNC_DEVICE;
  literal.per_tensor_copies = true;
  literal.copy_back = true;
  double t_res[16], t_off[16], t_lit[16];
  for (int i = 0; i < res->reps && !rc; i++) {
    rc = timed_run(&resident, o, &fast, false, &t_res[i], &res->peak_resident, err, errlen);
    if (!rc) rc = timed_run(&offload, o, &fast, true, &t_off[i], &res->peak_offload, err, errlen);
    if (!rc)
      rc = timed_run(&offload, o, &literal, true, &t_lit[i], &res->peak_literal, err, errlen);
  }
  if (!rc) {
    res->e2e_resident = bench_median(t_res, (size_t)res->reps);
    res->e2e_offload = bench_median(t_off, (size_t)res->reps);
    res->e2e_literal = bench_median(t_lit, (size_t)res->reps);
  }
  session_close(&offload);
  session_close(&resident);
  return rc;
}

/* The device bytes of each mode, from the headers alone. */
static int size_modes(const char *path, const mlo_open_options *oo, uint64_t *all, uint64_t *need,
                      char *err, size_t errlen) {
  mlo_platform *plat = NULL;
  mlo_pipeline *pipe = NULL;
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  int rc = mlo_platform_open("host", &plat, err, errlen);
  po.platform = plat;
  if (!rc) rc = mlo_pipeline_open_path(&po, path, oo, &pipe, err, errlen);
  if (!rc) {
    *all = mlo_workload_all_resident_bytes(pipe);
    *need = mlo_workload_model_offload_bytes(pipe, NULL);
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
    rc = mlo_synth_write("wan2.2-t2v", tmp, ba->quick ? 0.0005 : 0.002, NULL, NULL, err, errlen);
    path = tmp;
    oo.overrides = tool_wan_roles; /* generated here: its roles are known */
    oo.override_count = tool_wan_nroles;
  }
  snprintf(res->e2e_what, sizeof res->e2e_what, "%s, %d steps",
           ba->path ? ba->path : "generated wan2.2-t2v", res->steps);
  run_options o = {.steps = res->steps, .boundary = 0.875};
  uint64_t all = 0, need = 0;
  if (!rc) rc = size_modes(path, &oo, &all, &need, err, errlen);
  if (!rc) rc = e2e_modes(ba, path, &oo, all, need, &o, res, err, errlen);
  if (tmp[0]) nftw(tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return rc;
}

static double ratio(double a, double b) {
  return b > 0 ? a / b : 0;
}

static void print_text(const bench_args *ba, const bench_results *r) {
  printf("mlo bench on %s (medians)\n\nload throughput / raw copy throughput\n", ba->platform);
  printf("  %10s %12s %12s %8s\n", "size", "load", "raw copy", "ratio");
  for (size_t i = 0; i < r->nloads; i++)
    printf("  %10s %9.3f ms %9.3f ms %8.3f\n", tool_size(r->loads[i].bytes),
           r->loads[i].load_s * 1e3, r->loads[i].raw_s * 1e3, r->loads[i].ratio);
  printf("\nhot path: hooked forward of a resident component  %.0f ns, %.2f platform calls\n",
         r->hot_ns, r->hot_calls);
  printf("switch of %s: %.3f ms = %.2fx bytes/peak bandwidth (%.3f ms); literal mode %.3f ms = "
         "%.2fx\n",
         tool_size(r->sw.bytes), r->sw.switch_s * 1e3, ratio(r->sw.switch_s, r->sw.ideal_s),
         r->sw.ideal_s * 1e3, r->sw.literal_s * 1e3, ratio(r->sw.literal_s, r->sw.ideal_s));
  printf("\nend to end (%s; medians of %d runs)\n", r->e2e_what, r->reps);
  printf("  all resident  %8.3f s          peak %s\n", r->e2e_resident,
         tool_size(r->peak_resident));
  printf("  offloaded     %8.3f s  %5.2fx  peak %s\n", r->e2e_offload,
         ratio(r->e2e_offload, r->e2e_resident), tool_size(r->peak_offload));
  printf("  literal mode  %8.3f s  %5.2fx  peak %s\n", r->e2e_literal,
         ratio(r->e2e_literal, r->e2e_resident), tool_size(r->peak_literal));
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
  cJSON_AddNumberToObject(sw, "ratio", ratio(r->sw.switch_s, r->sw.ideal_s));
  cJSON_AddNumberToObject(sw, "literal_s", r->sw.literal_s);
  cJSON_AddNumberToObject(sw, "literal_ratio", ratio(r->sw.literal_s, r->sw.ideal_s));
  cJSON *e = cJSON_AddObjectToObject(root, "end_to_end");
  cJSON_AddStringToObject(e, "pipeline", r->e2e_what);
  cJSON_AddNumberToObject(e, "runs", r->reps);
  cJSON_AddNumberToObject(e, "resident_s", r->e2e_resident);
  cJSON_AddNumberToObject(e, "offloaded_s", r->e2e_offload);
  cJSON_AddNumberToObject(e, "literal_s", r->e2e_literal);
  cJSON_AddNumberToObject(e, "ratio", ratio(r->e2e_offload, r->e2e_resident));
  cJSON_AddNumberToObject(e, "literal_ratio", ratio(r->e2e_literal, r->e2e_resident));
  cJSON_AddNumberToObject(e, "peak_resident_bytes", (double)r->peak_resident);
  cJSON_AddNumberToObject(e, "peak_offloaded_bytes", (double)r->peak_offload);
  cJSON_AddNumberToObject(e, "peak_literal_bytes", (double)r->peak_literal);
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  tool_print_json_text(text);
}

int cmd_bench(int argc, char **argv) {
  bench_args ba = {.platform = "host", .max_size = 1024 * MIB};
  int code = parse(argc, argv, &ba);
  if (code == -1) {
    help();
    return TOOL_EXIT_OK;
  }
  if (code) return code;
  bench_results res = {.reps = ba.quick ? 1 : 7, .steps = ba.quick ? 2 : 8};
  char err[1024] = "", spec[512];
  int rc = run_loads(&ba, &res, err, sizeof err);
  bench_spec(ba.platform, 64 * MIB, spec, sizeof spec);
  if (!rc)
    rc = bench_hot_forward(spec, ba.quick ? 5 : 21, &res.hot_ns, &res.hot_calls, err, sizeof err);
  uint64_t sw = ba.quick ? 8 * MIB : 64 * MIB;
  bench_spec(ba.platform, 2 * sw + 64 * MIB, spec, sizeof spec);
  if (!rc) rc = bench_switch_cost(spec, sw, ba.quick ? 5 : 11, &res.sw, err, sizeof err);
  if (!rc) rc = run_e2e(&ba, &res, err, sizeof err);
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
