/*
 * cuda_ctx.c — the context guard of cuda_ctx.h: cuCtxGetCurrent,
 * cuCtxSetCurrent and cuStreamGetCtx, looked up once through
 * cudaGetDriverEntryPointByVersion (so the modules link only the runtime).
 */
#include "platform/cuda_ctx.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <pthread.h>
#include <stddef.h>

static struct {
  pthread_once_t once;
  PFN_cuCtxGetCurrent_v4000 get;
  PFN_cuCtxSetCurrent_v4000 set;
  PFN_cuStreamGetCtx_v9020 of_stream;
} drv = {.once = PTHREAD_ONCE_INIT};

/* 12000: the ABI of each symbol as of CUDA 12.0 (cuStreamGetCtx's two-
 * argument form; later versions added a green-context argument). */
static void *entry(const char *symbol) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return fn;
}

static void resolve(void) {
  drv.get = (PFN_cuCtxGetCurrent_v4000)entry("cuCtxGetCurrent");
  drv.set = (PFN_cuCtxSetCurrent_v4000)entry("cuCtxSetCurrent");
  drv.of_stream = (PFN_cuStreamGetCtx_v9020)entry("cuStreamGetCtx");
}

static bool ready(void) {
  pthread_once(&drv.once, resolve);
  return drv.get && drv.set && drv.of_stream;
}

cudaError_t mlo_cu_ctx_current(void **ctx) {
  *ctx = NULL;
  return ready() ? (cudaError_t)drv.get((CUcontext *)ctx) : cudaErrorSymbolNotFound;
}

cudaError_t mlo_cu_ctx_of_stream(cudaStream_t stream, void **ctx) {
  *ctx = NULL;
  return ready() ? (cudaError_t)drv.of_stream((CUstream)stream, (CUcontext *)ctx)
                 : cudaErrorSymbolNotFound;
}

cudaError_t mlo_cu_ctx_set(void *ctx) {
  return ready() ? (cudaError_t)drv.set((CUcontext)ctx) : cudaErrorSymbolNotFound;
}

cudaError_t mlo_cu_ctx_enter(void *ctx, mlo_cu_guard *g) {
  g->switched = false;
  void *cur = NULL;
  cudaError_t e = mlo_cu_ctx_current(&cur);
  if (e != cudaSuccess || cur == ctx) return e;
  e = mlo_cu_ctx_set(ctx);
  if (e == cudaSuccess) {
    g->prev = cur;
    g->switched = true;
  }
  return e;
}

cudaError_t mlo_cu_ctx_leave(const mlo_cu_guard *g) {
  return g->switched ? mlo_cu_ctx_set(g->prev) : cudaSuccess;
}
