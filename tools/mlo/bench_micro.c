/*
 * bench_micro.c — the three small measurements of `mlo bench` (bench/README.md), each a ratio
 * against what the hardware allows rather than a bare time: a component load against a raw copy of
 * the same size, a hooked forward of a resident component (ns and platform calls: the hot path must
 * not synchronize), and a DiT <-> encoder switch against bytes / peak
 * bandwidth, with the specification-literal mode beside it; and, on the host, what its throttled
 * link delivers against the rate set (the benchmarks' bounds assume it).  Pipelines are
 * built in memory through the public API; no checkpoint is read.
 */
#include "platform/platform.h" /* a plain copy through a non-host platform */
#include "tool.h"

#include <stdlib.h>
#include <string.h>

#define SWITCH_TENSORS 64

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double bench_median(double *v, size_t n) {
  if (!n) return 0;
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double seconds_since(uint64_t t0) {
  return (double)(mlo_now_ns() - t0) / 1e9;
}

static int open_pipeline(const char *spec, mlo_platform **plat, mlo_pipeline **pipe, char *err,
                         size_t errlen) {
  int rc = mlo_platform_open(spec, plat, err, errlen);
  if (rc) return rc;
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = *plat;
  rc = mlo_pipeline_create(&po, pipe);
  if (rc) {
    snprintf(err, errlen, "cannot create a pipeline: %s", mlo_strerror(rc));
    mlo_platform_close(*plat);
    *plat = NULL;
  }
  return rc;
}

/* A component of `parts` U8 tensors that together hold `bytes`, each
 * copied from data (at least bytes/parts long) at materialization. */
static int add_component(mlo_pipeline *pipe, const char *name, mlo_role role, uint64_t bytes,
                         int parts, const void *data, mlo_component **out) {
  int rc = mlo_component_add(pipe, name, role, out);
  for (int i = 0; !rc && i < parts; i++) {
    char tname[32];
    snprintf(tname, sizeof tname, "w%d", i);
    mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
    d.name = tname;
    d.dtype = MLO_DTYPE_U8;
    d.ndim = 1;
    d.shape[0] = (int64_t)(bytes / (uint64_t)parts);
    d.data = data;
    rc = mlo_tensor_add(*out, &d, NULL);
  }
  return rc;
}

/* A plain copy of `bytes` host -> device: memcpy on host (the device is
 * host memory), one platform copy of pinned memory elsewhere. */
static int raw_copy_s(mlo_platform *p, void *src, void *dst, uint64_t bytes, double *secs) {
  if (!strcmp(mlo_platform_name(p), "host")) {
    uint64_t t0 = mlo_now_ns();
    memcpy(dst, src, bytes);
    *secs = seconds_since(t0);
    return MLO_OK;
  }
  void *block = NULL, *pinned = NULL;
  bool got = false;
  int rc = mlo_plat_dev_alloc(p, bytes, &block);
  if (rc) return rc;
  rc = mlo_plat_host_alloc(p, bytes, true, &pinned, &got);
  if (!rc) {
    memcpy(pinned, src, bytes);
    uint64_t t0 = mlo_now_ns();
    rc = mlo_plat_copy_h2d(p, block, 0, pinned, bytes);
    if (!rc) rc = mlo_plat_synchronize(p);
    *secs = seconds_since(t0);
    mlo_plat_host_free(p, pinned, bytes, got);
  }
  mlo_plat_dev_free(p, block, bytes);
  mlo_plat_synchronize(p);
  return rc;
}

static int load_once(mlo_platform *plat, mlo_component *c, double *secs) {
  uint64_t t0 = mlo_now_ns();
  int rc = mlo_component_load(c);
  if (!rc) rc = mlo_platform_synchronize(plat);
  *secs = seconds_since(t0);
  if (!rc) rc = mlo_component_evict(c);
  if (!rc) rc = mlo_platform_synchronize(plat);
  return rc;
}

/* Loads and raw copies alternate, so that both see the same machine (other
 * processes, frequency, caches) and the ratio is fair even when it is busy.
 * One untimed load first: the device pool faults its pages in once. */
static int time_loads(mlo_platform *plat, mlo_component *c, unsigned char *src, unsigned char *dst,
                      uint64_t bytes, int reps, double *load_s, double *raw_s) {
  double warm;
  int rc = load_once(plat, c, &warm);
  for (int i = 0; !rc && i < reps; i++) {
    rc = load_once(plat, c, &load_s[i]);
    if (!rc) rc = raw_copy_s(plat, src, dst, bytes, &raw_s[i]);
  }
  return rc;
}

int bench_load_throughput(const char *spec, uint64_t bytes, int reps, bench_load *out, char *err,
                          size_t errlen) {
  memset(out, 0, sizeof *out);
  out->bytes = bytes;
  unsigned char *src = malloc(bytes), *dst = malloc(bytes);
  double *load_s = calloc((size_t)reps, sizeof *load_s),
         *raw_s = calloc((size_t)reps, sizeof *raw_s);
  mlo_platform *plat = NULL;
  mlo_pipeline *pipe = NULL;
  mlo_component *c = NULL;
  int rc = MLO_ENOMEM;
  if (!src || !dst || !load_s || !raw_s) goto out_free;
  for (uint64_t i = 0; i < bytes; i++) src[i] = (unsigned char)(i * 131u >> 3);
  memset(dst, 0, bytes); /* touch every page so the copy measures copying */
  rc = open_pipeline(spec, &plat, &pipe, err, errlen);
  if (!rc) rc = add_component(pipe, "component", MLO_ROLE_ENCODER, bytes, 1, src, &c);
  if (!rc) rc = mlo_pipeline_materialize(pipe);
  if (!rc) rc = time_loads(plat, c, src, dst, bytes, reps, load_s, raw_s);
  if (rc) {
    if (!err[0]) snprintf(err, errlen, "load of %s: %s", tool_size(bytes), mlo_strerror(rc));
    goto out_free;
  }
  out->load_s = bench_median(load_s, (size_t)reps);
  out->raw_s = bench_median(raw_s, (size_t)reps);
  out->ratio = out->load_s > 0 ? out->raw_s / out->load_s : 0;
out_free:
  mlo_pipeline_free(pipe);
  mlo_platform_close(plat);
  free(src);
  free(dst);
  free(load_s);
  free(raw_s);
  return rc;
}

static int noop_forward(mlo_component *comp, void *user) {
  (void)comp;
  (void)user;
  return 0;
}

int bench_link_model(int reps, bench_link *out, char *err, size_t errlen) {
  /* A DiT block's copy at a PCIe-like ratio, scaled: 1 MiB at 0.5 GB/s is
   * 2 ms, 48 of them about a tenth of a second a repetition. */
  *out = (bench_link){.copies = 48, .bytes = 1u << 20, .rate = 5e8};
  mlo_platform *plat = NULL;
  int rc = mlo_platform_open("host:capacity=4M,bw=5e8,prefault=1,poison=0", &plat, err, errlen);
  if (rc) return rc;
  void *src = malloc(out->bytes), *block = NULL;
  double *v = calloc((size_t)reps, sizeof *v);
  rc = src && v ? mlo_plat_dev_alloc(plat, out->bytes, &block) : MLO_ENOMEM;
  if (src) memset(src, 0x5a, out->bytes);
  for (int r = 0; !rc && r < reps; r++) {
    uint64_t t0 = mlo_now_ns();
    for (int i = 0; !rc && i < out->copies; i++)
      rc = mlo_plat_copy_h2d(plat, block, 0, src, out->bytes);
    if (!rc) rc = mlo_plat_synchronize(plat);
    v[r] = (double)out->bytes * out->copies / seconds_since(t0) / out->rate;
  }
  if (rc)
    snprintf(err, errlen, "host link model: %s", mlo_strerror(rc));
  else
    out->delivered = bench_median(v, (size_t)reps);
  if (block) mlo_plat_dev_free(plat, block, out->bytes);
  mlo_platform_close(plat);
  free(src);
  free(v);
  return rc;
}

int bench_hot_forward(const char *spec, int batches, double *ns, double *platform_calls, char *err,
                      size_t errlen) {
  enum { PER_BATCH = 10000, BYTES = 1 << 20 };
  static unsigned char data[BYTES];
  mlo_platform *plat = NULL;
  mlo_pipeline *pipe = NULL;
  mlo_component *enc = NULL, *dit = NULL;
  double *per_call = calloc((size_t)batches, sizeof *per_call);
  int rc = per_call ? open_pipeline(spec, &plat, &pipe, err, errlen) : MLO_ENOMEM;
  if (!rc) rc = add_component(pipe, "text_encoder", MLO_ROLE_ENCODER, BYTES, 4, data, &enc);
  if (!rc) rc = add_component(pipe, "transformer", MLO_ROLE_DIT, BYTES, 4, data, &dit);
  if (!rc) rc = mlo_offload_enable(pipe, NULL);
  if (!rc) rc = mlo_component_forward(enc, noop_forward, NULL); /* now resident */
  uint64_t calls0 = plat ? mlo_plat_call_count(plat) : 0;
  for (int b = 0; !rc && b < batches; b++) {
    uint64_t t0 = mlo_now_ns();
    for (int i = 0; !rc && i < PER_BATCH; i++) rc = mlo_component_forward(enc, noop_forward, NULL);
    per_call[b] = (double)(mlo_now_ns() - t0) / PER_BATCH;
  }
  if (!rc) {
    *platform_calls = (double)(mlo_plat_call_count(plat) - calls0) / ((double)batches * PER_BATCH);
    *ns = bench_median(per_call, (size_t)batches);
  } else if (!err[0]) {
    snprintf(err, errlen, "hot forward: %s", mlo_strerror(rc));
  }
  mlo_pipeline_free(pipe);
  mlo_platform_close(plat);
  free(per_call);
  return rc;
}

/* Median time of a forward that has to switch (evict the other, load). */
typedef struct {
  unsigned char *src, *dst;
  uint64_t bytes;
  double *raw_s; /* one raw copy per switch, NULL: none */
} raw_pair;

static int time_switches(mlo_pipeline *pipe, mlo_component *a, mlo_component *b,
                         const mlo_offload_settings *settings, int reps, raw_pair *raw,
                         double *median_s) {
  double *t = calloc((size_t)reps, sizeof *t);
  if (!t) return MLO_ENOMEM;
  int rc = mlo_offload_enable(pipe, settings);
  /* Warm up: the first switches allocate and fault in memory. */
  for (int i = 0; !rc && i < 2; i++) {
    rc = mlo_component_forward(a, noop_forward, NULL);
    if (!rc) rc = mlo_component_forward(b, noop_forward, NULL);
  }
  for (int i = 0; !rc && i < reps; i++) {
    mlo_component *next = i % 2 ? b : a;
    uint64_t t0 = mlo_now_ns();
    rc = mlo_component_forward(next, noop_forward, NULL);
    if (!rc) rc = mlo_platform_synchronize(mlo_pipeline_platform(pipe));
    t[i] = seconds_since(t0);
    if (!rc && raw->raw_s)
      rc = raw_copy_s(mlo_pipeline_platform(pipe), raw->src, raw->dst, raw->bytes, &raw->raw_s[i]);
  }
  if (!rc) *median_s = bench_median(t, (size_t)reps);
  int off = mlo_offload_disable(pipe);
  free(t);
  return rc ? rc : off;
}

int bench_switch_cost(const char *spec, uint64_t bytes, int reps, bench_switch *out, char *err,
                      size_t errlen) {
  memset(out, 0, sizeof *out);
  uint64_t part = bytes / SWITCH_TENSORS;
  out->bytes = part * SWITCH_TENSORS;
  unsigned char *src = malloc(out->bytes), *dst = malloc(out->bytes);
  mlo_platform *plat = NULL;
  mlo_pipeline *pipe = NULL;
  mlo_component *enc = NULL, *dit = NULL;
  int rc = src && dst ? MLO_OK : MLO_ENOMEM;
  if (!rc) {
    for (uint64_t i = 0; i < out->bytes; i++) src[i] = (unsigned char)(i * 7u);
    memset(dst, 0, out->bytes);
    rc = open_pipeline(spec, &plat, &pipe, err, errlen);
  }
  if (!rc)
    rc = add_component(pipe, "text_encoder", MLO_ROLE_ENCODER, bytes, SWITCH_TENSORS, src, &enc);
  if (!rc) rc = add_component(pipe, "transformer", MLO_ROLE_DIT, bytes, SWITCH_TENSORS, src, &dit);
  if (!rc) rc = mlo_pipeline_materialize(pipe);
  mlo_offload_settings fast = MLO_OFFLOAD_SETTINGS_INIT, literal = MLO_OFFLOAD_SETTINGS_INIT;
  literal.sync = MLO_SYNC_DEVICE;
  literal.per_tensor_copies = true;
  literal.copy_back = true;
  raw_pair raw = {src, dst, out->bytes, calloc((size_t)reps, sizeof(double))};
  if (!rc && !raw.raw_s) rc = MLO_ENOMEM;
  if (!rc) rc = time_switches(pipe, dit, enc, &fast, reps, &raw, &out->switch_s);
  if (!rc) out->ideal_s = bench_median(raw.raw_s, (size_t)reps);
  free(raw.raw_s);
  raw.raw_s = NULL; /* the literal mode is judged against the same ideal */
  if (!rc) rc = time_switches(pipe, dit, enc, &literal, reps, &raw, &out->literal_s);
  if (rc && !err[0]) snprintf(err, errlen, "switch of %s: %s", tool_size(bytes), mlo_strerror(rc));
  mlo_pipeline_free(pipe);
  mlo_platform_close(plat);
  free(src);
  free(dst);
  return rc;
}
