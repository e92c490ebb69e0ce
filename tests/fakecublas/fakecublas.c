/*
 * fakecublas.c — a fake cuBLAS (libcublas.so.<major>) for tests: the few
 * calls the reference workload's CUDA back-end makes
 * (src/workload/cuda_blas.c), over the fake CUDA runtime.
 *
 * Why: `mlo run --platform cuda` runs the reference workload, whose GEMMs
 * are cuBLAS's; on the fake runtime (tests/fakecuda) they could not run,
 * so no test could compare a multi-rank CUDA run's digest with one
 * process's (issue 25, item 5).  This library lets the real tool run on
 * the fakes; its folder goes on LD_LIBRARY_PATH for those tests alone.
 *
 * What it models: cublasCreate/Destroy/SetStream/SetWorkspace as
 * bookkeeping, and cublasGemmEx (column-major, op N or T on either side,
 * A and B f32, bf16 or f16, C f32, f32 products and sums in a fixed order)
 * queued on the handle's stream as a host function, so it runs in stream
 * order after the copies and waits before it, on the bytes the fake's
 * device memory holds.  A handle's stream is resolved at each call as the
 * runtime resolves it (cuBLAS launches on it then): the legacy default
 * stream (0) is the calling thread's current context's; the device it
 * resolved to is kept for tests (fakecublas_last_gemm_device).  What it does not: any other call or
 * type, tensor cores, TF32, and the cost of anything.  Its results are deterministic, not bitwise
 * cuBLAS's: digests compare between runs on this fake only.
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct cublasContext {
  cudaStream_t stream;
};

static _Atomic int last_gemm_device = -1;

/* The device of the stream the last cublasGemmEx was queued on, -1 before
 * the first (a test helper, looked up with dlsym). */
int fakecublas_last_gemm_device(void) {
  return last_gemm_device;
}

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  *h = calloc(1, sizeof **h);
  return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  if (h && h->stream) cudaStreamSynchronize(h->stream);
  free(h);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t bytes) {
  (void)ws, (void)bytes;
  return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char *cublasGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "success (fake cuBLAS)" : "failure (fake cuBLAS)";
}

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0 && man == 0) {
    bits = sign;
  } else if (exp == 0) { /* subnormal */
    exp = 127 - 15 + 1;
    while (!(man & 0x400)) man <<= 1, exp--;
    bits = sign | exp << 23 | (man & 0x3ff) << 13;
  } else if (exp == 31) {
    bits = sign | 0xff << 23 | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static float load(const char *base, size_t i, cudaDataType t) {
  if (t == CUDA_R_32F) {
    float f;
    memcpy(&f, base + i * 4, 4);
    return f;
  }
  uint16_t v;
  memcpy(&v, base + i * 2, 2);
  if (t == CUDA_R_16F) return half_to_float(v);
  uint32_t bits = (uint32_t)v << 16; /* bf16 */
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

struct gemm {
  cublasOperation_t ta, tb;
  int m, n, k, lda, ldb, ldc;
  float alpha, beta;
  const char *a, *b;
  float *c;
  cudaDataType at, bt;
};

static void gemm_fn(void *user) {
  struct gemm *g = user;
  for (int j = 0; j < g->n; j++)
    for (int i = 0; i < g->m; i++) {
      float sum = 0;
      for (int l = 0; l < g->k; l++) {
        size_t ai =
            g->ta == CUBLAS_OP_N ? (size_t)i + (size_t)l * g->lda : (size_t)l + (size_t)i * g->lda;
        size_t bi =
            g->tb == CUBLAS_OP_N ? (size_t)l + (size_t)j * g->ldb : (size_t)j + (size_t)l * g->ldb;
        sum += load(g->a, ai, g->at) * load(g->b, bi, g->bt);
      }
      float *out = g->c + (size_t)i + (size_t)j * g->ldc;
      *out = g->alpha * sum + (g->beta != 0 ? g->beta * *out : 0);
    }
  free(g);
}

static bool known(cudaDataType t) {
  return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *a, cudaDataType at,
                            int lda, const void *b, cudaDataType bt, int ldb, const void *beta,
                            void *c, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
  (void)algo;
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0 || !known(at) || !known(bt) || ct != CUDA_R_32F ||
      compute != CUBLAS_COMPUTE_32F || (ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) ||
      (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  struct gemm *g = malloc(sizeof *g);
  if (!g) return CUBLAS_STATUS_ALLOC_FAILED;
  *g = (struct gemm){ta, tb, m, n,  k, lda, ldb, ldc, *(const float *)alpha, *(const float *)beta,
                     a,  b,  c, at, bt};
  int device = -1;
  if (cudaStreamGetDevice(h->stream, &device) != cudaSuccess ||
      cudaLaunchHostFunc(h->stream, gemm_fn, g) != cudaSuccess) {
    free(g);
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  last_gemm_device = device;
  return CUBLAS_STATUS_SUCCESS;
}
