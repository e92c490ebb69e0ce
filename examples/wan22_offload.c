/*
 * wan22_offload.c — learn the mlo API in five minutes.
 *
 * Builds a Wan2.2-shaped pipeline in code (one text encoder, two DiTs, one
 * VAE), turns model-level offload on, and runs the Wan2.2 call sequence:
 * encode -> DiT1 x k -> DiT2 x m -> decode.  Only the executing component's
 * weights are on the device; the counters printed at the end show what
 * moved.  The "device" is the host-backed platform with a capacity smaller
 * than the whole pipeline, so this runs anywhere; pass another platform
 * spec as the first argument ("cuda:0", "opencl:0") to use a real one.
 *
 * The third argument picks the residency policy: "strict" (the default)
 * is the specification's rule; "budget" keeps what fits in the device's
 * free memory, evicts by next use in the schedule the pipeline declares,
 * and loads the next component while the current one computes.  Two
 * prompts run, so the second shows the steady state.
 *
 *   ./wan22_offload [PLATFORM] [STEPS] [strict|budget]
 */
#include "mlo/mlo.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A component's shape: its name, role and a few weight matrices. */
struct demo_component {
  const char *name;
  mlo_role role;
  int layers;
  int64_t width;
};

static const struct demo_component wan22[] = {
    {"text_encoder", MLO_ROLE_ENCODER, 4, 512}, /* UMT5 */
    {"transformer", MLO_ROLE_DIT, 6, 768},      /* high-noise expert */
    {"transformer_2", MLO_ROLE_DIT, 6, 768},    /* low-noise expert */
    {"vae", MLO_ROLE_VAE, 2, 384},
};
#define NCOMP (sizeof wan22 / sizeof wan22[0])

/* Declares each layer's weight as a bf16 matrix.  The data pointer is
 * copied into the component's host slab when the pipeline materializes. */
static int add_weights(mlo_component *comp, const struct demo_component *dc, uint16_t *data) {
  for (int layer = 0; layer < dc->layers; layer++) {
    char name[64];
    snprintf(name, sizeof name, "blocks.%d.attn.to_q.weight", layer);
    mlo_tensor_desc desc = MLO_TENSOR_DESC_INIT;
    desc.name = name;
    desc.dtype = MLO_DTYPE_BF16;
    desc.ndim = 2;
    desc.shape[0] = dc->width;
    desc.shape[1] = dc->width;
    desc.data = data;
    int rc = mlo_tensor_add(comp, &desc, NULL);
    if (rc) return rc;
  }
  return MLO_OK;
}

/* The "model": here it only sums the first weight on the device.  A real
 * engine launches its kernels on mlo_platform_compute_queue() with the
 * device addresses from mlo_tensor_device(). */
static int forward(mlo_component *comp, void *user) {
  double *checksum = user;
  const mlo_tensor *w = mlo_component_tensor_at(comp, 0);
  mlo_platform_caps caps;
  mlo_platform_get_caps(mlo_pipeline_platform(mlo_component_pipeline(comp)), &caps);
  /* Only the host-backed device may be read through its pointer; on CUDA
   * the address is for kernels (dereferencing it on the host crashes), on
   * OpenCL there is none. */
  const uint16_t *dev = caps.host_addressable ? mlo_tensor_device_ptr(w) : NULL;
  if (dev) *checksum += dev[0] + dev[mlo_tensor_nbytes(w) / 2 - 1];
  return 0;
}

static void print_counters(mlo_pipeline *pipe) {
  char h2d[32], d2h[32], size[32], peak[32];
  printf("%-14s %-8s %10s %6s %6s %10s %10s\n", "component", "role", "size", "loads", "evicts",
         "h2d", "d2h");
  for (size_t i = 0; i < mlo_pipeline_component_count(pipe); i++) {
    mlo_component *c = mlo_pipeline_component_at(pipe, i);
    mlo_component_stats s;
    mlo_component_get_stats(c, &s);
    printf("%-14s %-8s %10s %6llu %6llu %10s %10s\n", mlo_component_name(c),
           mlo_role_name(mlo_component_role(c)),
           mlo_format_size(mlo_component_bytes(c), size, sizeof size), (unsigned long long)s.loads,
           (unsigned long long)s.evictions, mlo_format_size(s.h2d_bytes, h2d, sizeof h2d),
           mlo_format_size(s.d2h_bytes, d2h, sizeof d2h));
  }
  mlo_pipeline_stats ps;
  mlo_pipeline_get_stats(pipe, &ps);
  printf("peak device memory: %s; waited on transfers: %.3f ms\n",
         mlo_format_size(ps.peak_device_bytes, peak, sizeof peak), ps.total.wait_ns / 1e6);
}

/* One request of the Wan2.2 call sequence: encode, DiT1 x k, DiT2 x the
 * rest, decode. */
static int run_request(mlo_component *comps[NCOMP], int steps, int k, double *checksum) {
  int rc = mlo_component_forward(comps[0], forward, checksum);
  for (int s = 0; s < steps && !rc; s++)
    rc = mlo_component_forward(s < k ? comps[1] : comps[2], forward, checksum);
  /* Decode is not a forward: acquire/release give it the same treatment. */
  if (!rc && !(rc = mlo_component_acquire(comps[3]))) {
    forward(comps[3], checksum);
    rc = mlo_component_release(comps[3]);
  }
  return rc;
}

int main(int argc, char **argv) {
  const char *spec = argc > 1 ? argv[1] : "host:capacity=10M";
  int steps = argc > 2 ? atoi(argv[2]) : 8;
  if (steps < 1) steps = 8;
  bool budget = argc > 3 && !strcmp(argv[3], "budget");
  char err[256];
  mlo_platform *platform = NULL;
  int rc = mlo_platform_open(spec, &platform, err, sizeof err);
  if (rc) {
    fprintf(stderr, "cannot open platform '%s': %s\n", spec, err);
    return 2;
  }
  mlo_pipeline_options opts = MLO_PIPELINE_OPTIONS_INIT;
  opts.platform = platform;
  mlo_pipeline *pipe = NULL;
  rc = mlo_pipeline_create(&opts, &pipe);
  uint16_t *weights = calloc(768 * 768, sizeof *weights); /* shared source bytes */
  mlo_component *comps[NCOMP] = {0};
  for (size_t i = 0; i < NCOMP && !rc && weights; i++) {
    rc = mlo_component_add(pipe, wan22[i].name, wan22[i].role, &comps[i]);
    if (!rc) rc = add_weights(comps[i], &wan22[i], weights);
  }
  int k = steps / 2; /* Wan2.2 switches experts at a boundary step */
  mlo_offload_settings settings = MLO_OFFLOAD_SETTINGS_INIT;
  if (budget && !rc) {
    /* Say what the pipeline will call, so mlo can plan: one request is the
     * encoder once, each expert for its steps, the VAE once. */
    mlo_schedule_entry request[NCOMP];
    size_t n = 0;
    request[n++] = (mlo_schedule_entry){comps[0], 1};
    if (k) request[n++] = (mlo_schedule_entry){comps[1], (uint32_t)k};
    if (steps - k) request[n++] = (mlo_schedule_entry){comps[2], (uint32_t)(steps - k)};
    request[n++] = (mlo_schedule_entry){comps[3], 1};
    rc = mlo_pipeline_set_schedule(pipe, request, n);
    settings.policy = MLO_POLICY_BUDGET; /* budget_bytes 0: the device's free memory */
  }
  /* Enable offload.  strict: encoders and the VAE become resident, DiTs
   * wait.  budget: the first components of the request start loading. */
  if (!rc) rc = mlo_offload_enable(pipe, &settings);
  double checksum = 0;
  for (int prompt = 1; prompt <= 2 && !rc; prompt++) {
    mlo_pipeline_stats before, after;
    mlo_pipeline_get_stats(pipe, &before);
    rc = run_request(comps, steps, k, &checksum);
    mlo_pipeline_get_stats(pipe, &after);
    if (!rc)
      printf("prompt %d: %llu loads (%llu ahead of use), %llu evictions\n", prompt,
             (unsigned long long)(after.total.loads - before.total.loads),
             (unsigned long long)(after.total.prefetches - before.total.prefetches),
             (unsigned long long)(after.total.evictions - before.total.evictions));
  }
  if (rc) {
    fprintf(stderr, "error: %s (%s)\n", mlo_pipeline_errmsg(pipe), mlo_err_name(rc));
  } else {
    printf("platform: %s; policy %s; %d steps (%d on transformer, %d on transformer_2)\n",
           mlo_platform_description(platform), mlo_policy_name(settings.policy), steps, k,
           steps - k);
    print_counters(pipe);
  }
  mlo_pipeline_free(pipe);
  mlo_platform_close(platform);
  free(weights);
  return rc ? 1 : 0;
}
