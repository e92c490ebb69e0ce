/*
 * host_blas.c — the reference workload's backend for the host-backed
 * platform: device blocks are host addresses, so W is read in place (f32)
 * or widened from bf16/f16 a slice of rows at a time into a reused scratch
 * buffer, and Y = X * W^T is one cblas_sgemm per slice (OpenBLAS, Debian).
 *
 * Widening in slices keeps the scratch bounded (a 5120x13824 f32 copy of an
 * FFN weight would be 280 MB) and the slice size is a constant, so the
 * summation order, hence the digest, never depends on run-time state.
 * OpenBLAS's sgemm is deterministic for a fixed thread count, which a
 * process keeps; digests are compared only within one process and config.
 *
 * The host platform's copy engine is a thread: left to itself OpenBLAS
 * takes every core and the "DMA" steals compute time from the forwards,
 * which a GPU's copy engine never does.  So compute gets one core fewer
 * than the machine has (at least one), unless OPENBLAS_NUM_THREADS says.
 */
#include "base/sysio.h"
#include "workload/workload.h"

#include <cblas.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Bytes of widened f32 weights per gemm call. */
#define SLICE_BYTES (4u << 20)

struct host_ctx {
  float *w;     /* widened weight rows (SLICE_BYTES) */
  float *x;     /* the input X (tokens x in) */
  size_t x_cap; /* floats allocated for x */
  float *y;     /* the output Y (tokens x out) */
  size_t y_cap;
  /* X is a pure function of these; regenerate only when they change. */
  uint64_t x_seed;
  int64_t x_in;
  int x_tokens;
  int x_valid;
};

static void leave_a_core_for_copies(void) {
  if (getenv("OPENBLAS_NUM_THREADS")) return; /* the user's choice */
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  openblas_set_num_threads(cpus > 2 ? (int)cpus - 1 : 1);
}

static int host_create(mlo_platform *p, void **ctx) {
  (void)p;
  leave_a_core_for_copies();
  struct host_ctx *c = mlo_calloc(1, sizeof *c);
  if (!c) return MLO_ENOMEM;
  c->w = mlo_malloc(SLICE_BYTES);
  if (!c->w) {
    free(c);
    return MLO_ENOMEM;
  }
  *ctx = c;
  return MLO_OK;
}

static void host_destroy(void *ctx) {
  struct host_ctx *c = ctx;
  if (!c) return;
  free(c->w);
  free(c->x);
  free(c->y);
  free(c);
}

/* Grows a float buffer to at least n floats; keeps the old one on failure. */
static int grow(float **buf, size_t *cap, size_t n) {
  if (n <= *cap) return MLO_OK;
  if (n > SIZE_MAX / sizeof(float)) return MLO_ENOMEM;
  float *b = mlo_realloc(*buf, n * sizeof(float));
  if (!b) return MLO_ENOMEM;
  *buf = b;
  *cap = n;
  return MLO_OK;
}

static int prepare_input(struct host_ctx *c, uint64_t seed, int64_t in, int tokens) {
  if (c->x_valid && c->x_seed == seed && c->x_in == in && c->x_tokens == tokens) return MLO_OK;
  c->x_valid = 0;
  int rc = grow(&c->x, &c->x_cap, (size_t)in * (size_t)tokens);
  if (rc) return rc;
  for (int t = 0; t < tokens; t++)
    for (int64_t k = 0; k < in; k++)
      c->x[(size_t)t * (size_t)in + (size_t)k] = mlo_workload_input(seed, t, k);
  c->x_seed = seed;
  c->x_in = in;
  c->x_tokens = tokens;
  c->x_valid = 1;
  return MLO_OK;
}

static float bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* IEEE half to single, subnormals, infinities and NaNs included. */
static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else { /* subnormal: normalize */
    exp = 113;
    while (!(man & 0x400u)) {
      man <<= 1;
      exp--;
    }
    bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* Widens `count` 16-bit values starting at src (possibly unaligned). */
static void widen16(float *dst, const unsigned char *src, size_t count, mlo_dtype dtype) {
  for (size_t i = 0; i < count; i++) {
    uint16_t v = (uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)); /* little-endian */
    dst[i] = dtype == MLO_DTYPE_BF16 ? bf16_to_f32(v) : f16_to_f32(v);
  }
}

/* Y[:, r0:r0+rows] = X * W[r0:r0+rows]^T. */
static void gemm_rows(struct host_ctx *c, const float *w_rows, int64_t r0, int64_t rows,
                      int64_t out, int64_t in, int tokens) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tokens, (int)rows, (int)in, 1.0f, c->x,
              (int)in, w_rows, (int)in, 0.0f, c->y + r0, (int)out);
}

static int host_gemm_digest(void *ctx, void *block, size_t offset, mlo_dtype dtype, int64_t out,
                            int64_t in, int tokens, uint64_t seed, uint64_t *digest) {
  struct host_ctx *c = ctx;
  if (out <= 0 || in <= 0 || tokens <= 0) return out == 0 || in == 0 ? MLO_OK : MLO_EINVAL;
  if (out > INT32_MAX || in > INT32_MAX) return MLO_EUNSUPPORTED; /* BLAS takes int dims */
  int rc = prepare_input(c, seed, in, tokens);
  if (!rc) rc = grow(&c->y, &c->y_cap, (size_t)out * (size_t)tokens);
  if (rc) return rc;
  const unsigned char *w = (const unsigned char *)block + offset;
  if (dtype == MLO_DTYPE_F32 && ((uintptr_t)w % sizeof(float)) == 0) {
    gemm_rows(c, (const float *)w, 0, out, out, in, tokens);
  } else {
    size_t esize = dtype == MLO_DTYPE_F32 ? 4 : 2;
    int64_t slice = (int64_t)(SLICE_BYTES / sizeof(float)) / in;
    if (slice < 1) {
      /* One row wider than the scratch: grow the scratch to one row. */
      float *bigger = mlo_realloc(c->w, (size_t)in * sizeof(float));
      if (!bigger) return MLO_ENOMEM;
      c->w = bigger;
      slice = 1;
    }
    for (int64_t r0 = 0; r0 < out; r0 += slice) {
      int64_t rows = out - r0 < slice ? out - r0 : slice;
      const unsigned char *src = w + (size_t)r0 * (size_t)in * esize;
      size_t count = (size_t)rows * (size_t)in;
      if (esize == 4)
        memcpy(c->w, src, count * sizeof(float)); /* unaligned f32 */
      else
        widen16(c->w, src, count, dtype);
      gemm_rows(c, c->w, r0, rows, out, in, tokens);
    }
  }
  *digest = mlo_digest_fold(*digest, c->y, (size_t)out * (size_t)tokens * sizeof(float));
  return MLO_OK;
}

static int host_bytes_digest(void *ctx, void *block, size_t offset, uint64_t nbytes,
                             uint64_t *digest) {
  (void)ctx;
  if (nbytes > SIZE_MAX) return MLO_EUNSUPPORTED;
  *digest = mlo_digest_fold(*digest, (const unsigned char *)block + offset, (size_t)nbytes);
  return MLO_OK;
}

const struct mlo_workload_ops mlo_workload_host_ops = {
    .platform = "host",
    .create = host_create,
    .destroy = host_destroy,
    .gemm_digest = host_gemm_digest,
    .bytes_digest = host_bytes_digest,
};
