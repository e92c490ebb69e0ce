/*
 * cuda_ctx.h — entering a device's primary context for one call and
 * leaving the calling thread's context as it was, for the CUDA platform
 * (cuda.c) and the CUDA workload backend (src/workload/cuda_blas.c).
 *
 * Why not cudaGetDevice/cudaSetDevice: a thread that never chose a device
 * reports device 0, and since CUDA 12 cudaSetDevice(0) creates device 0's
 * primary context (hundreds of MiB) — so "putting the caller's device
 * back" put a context on GPU 0 in every process that used another GPU.
 * The guard works on contexts instead: it makes ours current only when it
 * is not, and restores exactly what was current before, none included.
 * The two driver calls come through the runtime's driver entry points, so
 * neither module links libcuda.
 */
#ifndef MLO_PLATFORM_CUDA_CTX_H
#define MLO_PLATFORM_CUDA_CTX_H

#include <cuda_runtime_api.h>
#include <stdbool.h>

typedef struct {
  void *prev; /* the caller's current context (CUcontext), NULL for none */
  bool switched;
} mlo_cu_guard;

/* The calling thread's current context (NULL: none), without creating one.
 * Driver failures come back as the cudaError_t of the same number. */
cudaError_t mlo_cu_ctx_current(void **ctx);
/* The context a stream belongs to. */
cudaError_t mlo_cu_ctx_of_stream(cudaStream_t stream, void **ctx);
/* Makes ctx current (NULL: none). */
cudaError_t mlo_cu_ctx_set(void *ctx);
/* Makes ctx current unless it is; g says what to put back. */
cudaError_t mlo_cu_ctx_enter(void *ctx, mlo_cu_guard *g);
/* Puts back what enter found (nothing if it switched nothing). */
cudaError_t mlo_cu_ctx_leave(const mlo_cu_guard *g);

#endif
