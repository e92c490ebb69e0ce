/*
 * workload.h — the reference workload used by `mlo run` and the benches
 * (docs/design.md §5).  It is a benchmark workload, not a model: for each
 * 2-D weight W (out x in) of a component it computes Y = X * W^T for T
 * deterministic tokens in f32 (bf16/f16 widened, f32 accumulation) on the
 * platform's BLAS, and folds Y into a 64-bit digest; other tensors are
 * folded directly.  An offloaded run's digest must equal an all-resident
 * run's, bit for bit, on the same platform.
 *
 * One backend per platform (host: OpenBLAS; cuda: cuBLAS; opencl: CLBlast
 * or our own kernel) behind this small table; mlo_workload_open picks the
 * one matching mlo_platform_name().
 */
#ifndef MLO_WORKLOAD_H
#define MLO_WORKLOAD_H

#include "mlo/mlo.h"

#include <stdint.h>

typedef struct mlo_workload mlo_workload;

struct mlo_workload_ops {
  const char *platform; /* matches mlo_platform_name() */
  int (*create)(mlo_platform *p, void **ctx);
  void (*destroy)(void *ctx);
  /* Y = X * W^T where W is the (out x in) tensor at (block, offset) on the
   * device, X is the (tokens x in) deterministic input (seeded by `seed`),
   * ordered on the platform's compute queue.  Folds Y into *digest
   * (mlo_digest_fold over Y's f32 bytes in row-major order). */
  int (*gemm_digest)(void *ctx, void *block, size_t offset, mlo_dtype dtype, int64_t out,
                     int64_t in, int tokens, uint64_t seed, uint64_t *digest);
  /* Folds a tensor's raw device bytes into *digest (non-2-D tensors). */
  int (*bytes_digest)(void *ctx, void *block, size_t offset, uint64_t nbytes, uint64_t *digest);
};

extern const struct mlo_workload_ops mlo_workload_host_ops;
extern const struct mlo_workload_ops mlo_workload_cuda_ops;   /* when built */
extern const struct mlo_workload_ops mlo_workload_opencl_ops; /* when built */

/* 64-bit FNV-1a-style fold used by every backend, so digests compare. */
uint64_t mlo_digest_fold(uint64_t digest, const void *bytes, size_t len);
/* The deterministic input X[t][k] for a seed: identical on every backend. */
float mlo_workload_input(uint64_t seed, int64_t t, int64_t k);

#endif
