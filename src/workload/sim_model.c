/*
 * sim_model.c — the reference workload's backend for the simulated
 * platform: a forward computes nothing and takes the time the caller
 * modelled for it (mlo_workload_set_model_time: `mlo plan`'s FLOPs model
 * or --step-time), spent on the platform's virtual clock.  Everything
 * around it — the hooks, the waits, the policies — is the real code.
 */
#include "base/sysio.h"
#include "platform/platform.h"
#include "workload/workload.h"

#include <stdlib.h>

static int sim_create(mlo_platform *p, void **ctx) {
  *ctx = p;
  return MLO_OK;
}

static void sim_destroy(void *ctx) {
  (void)ctx;
}

static int sim_not_modelled(void) {
  return MLO_EUNSUPPORTED; /* model_forward replaces the per-tensor calls */
}

static int sim_gemm(void *ctx, void *block, size_t offset, mlo_dtype dtype, int64_t out, int64_t in,
                    int tokens, uint64_t seed, uint64_t *digest) {
  (void)ctx, (void)block, (void)offset, (void)dtype, (void)out, (void)in, (void)tokens, (void)seed,
      (void)digest;
  return sim_not_modelled();
}

static int sim_bytes(void *ctx, void *block, size_t offset, uint64_t nbytes, uint64_t *digest) {
  (void)ctx, (void)block, (void)offset, (void)nbytes, (void)digest;
  return sim_not_modelled();
}

static int sim_forward(void *ctx, uint64_t ns, uint64_t *digest) {
  int rc = mlo_sim_compute(ctx, ns);
  if (!rc) *digest = mlo_digest_fold(*digest, &ns, sizeof ns);
  return rc;
}

const struct mlo_workload_ops mlo_workload_sim_ops = {
    .platform = "sim",
    .create = sim_create,
    .destroy = sim_destroy,
    .gemm_digest = sim_gemm,
    .bytes_digest = sim_bytes,
    .model_forward = sim_forward,
};
