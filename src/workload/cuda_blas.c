/*
 * cuda_blas.c — the reference workload's backend for the CUDA platform.
 *
 * Y = X * W^T is one cublasGemmEx on the platform's compute stream (so it is
 * ordered after the load by the platform's compute_wait), with W read in
 * place in its own dtype (f32, bf16 or f16) and f32 accumulation
 * (CUBLAS_COMPUTE_32F: f32 products and sums, never TF32).  cublasGemmEx
 * needs A and B of one type, so X — mlo_workload_input's f32 values — is
 * rounded to W's dtype (round to nearest even) when W is bf16/f16; for f32
 * it is exact.  X is generated on the host into pinned memory, copied on
 * the compute stream and cached per (seed, tokens, in, dtype).
 *
 * Y (or a tensor's raw bytes) is copied back on the compute stream into a
 * ring of pinned slots and folded only when its slot is needed again or at
 * flush: the host never drains the GPU per gemm, forwards return with
 * GEMMs in flight, and the releases and evictions behind them rely on C9's
 * stream-ordered frees, as a real engine's do.
 *
 * Device scratch (X, Y and cuBLAS's workspace) comes from the platform's
 * own allocator, so capacity= bounds it with the weights and a pool's
 * reserve reports it.  It is allocated on the compute stream, its only
 * user (dev_alloc_compute), so the GEMMs never wait for the copy queue (a
 * prefetch in flight, a join's gated copies: review D10); only where the
 * platform lacks that slot is a dev_alloc block (ordered on the copy
 * stream) handed to compute through an event.
 *
 * cuBLAS is bit-reproducible for one configuration on one GPU model, so an
 * offloaded run's digest equals an all-resident run's on the same device.
 * One context is used by one thread at a time (mlo run's schedule).  Every
 * entry point makes the compute stream's context current (the platform's
 * own for the legacy default stream, which names none: stream_context) and
 * puts the caller's back (platform/cuda_ctx.h): a thread that had none is
 * left with none, never with a context on device 0.
 */
#include "base/sysio.h"
#include "base/log.h"
#include "platform/cuda_ctx.h"
#include "platform/platform.h"
#include "workload/workload.h"
#include "platform/module.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define X_CACHE 4
#define RING 8                             /* results in flight before the oldest must be folded */
#define WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLAS's recommendation for Hopper */

/* A pinned host buffer that only grows. */
struct host_buf {
  void *ptr;
  size_t bytes;
};

/* A device input X with the pinned host copy it was uploaded from (reused:
 * overwritten only after `uploaded`). */
struct x_entry {
  uint64_t seed;
  int64_t in;
  int tokens;
  mlo_dtype dtype;
  void *dev;
  size_t dev_bytes;
  struct host_buf host;
  cudaEvent_t uploaded;
  bool valid, pending;
};

/* One result on its way to the fold: Y on the device, its copy on the host,
 * the event behind that copy, and the digest it goes into. */
struct slot {
  void *y;
  size_t y_bytes;
  struct host_buf host;
  cudaEvent_t done;
  uint64_t *digest;
  size_t bytes;
};

/* A pinned buffer outgrown mid-run, freed at destroy (grow_host). */
struct retired {
  void *ptr;
  struct retired *next;
};

struct cuda_blas {
  mlo_platform *platform;
  void *ctx; /* the compute stream's context: current in every call, the caller's put back */
  cudaStream_t stream;
  cublasHandle_t handle;
  void *workspace;
  mlo_event *ready; /* orders a fresh platform block into the compute stream */
  struct x_entry x[X_CACHE];
  unsigned next_victim;
  struct slot ring[RING]; /* FIFO: `count` slots from `head` are in flight */
  unsigned head, count;
  struct retired *retired;
};

static int cu_status(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return MLO_OK;
  (void)cudaGetLastError();
  if (e == cudaErrorMemoryAllocation) return MLO_ENOMEM_DEVICE;
  mlo_logf(MLO_LOG_ERROR, "cuda workload: %s failed: %s", what, cudaGetErrorString(e));
  return MLO_EPLATFORM;
}

static int blas_status(cublasStatus_t s, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS) return MLO_OK;
  if (s == CUBLAS_STATUS_ALLOC_FAILED) return MLO_ENOMEM_DEVICE;
  mlo_logf(MLO_LOG_ERROR, "cuda workload: %s failed: %s", what, cublasGetStatusString(s));
  return MLO_EPLATFORM;
}

static uint16_t bf16_from_float(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* IEEE binary16, round to nearest even, subnormals included. */
static uint16_t f16_from_float(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return sign | 0x7e00u;  /* NaN */
  if (mag >= 0x477ff000u) return sign | 0x7c00u; /* rounds to infinity (>= 65520) */
  uint32_t h, rem, half;
  if (mag < 0x38800000u) { /* below 2^-14: a subnormal half, or zero */
    if (mag < 0x33000000u) return sign;
    uint32_t mant = (mag & 0x7fffffu) | 0x800000u;
    unsigned shift = 126u - (mag >> 23); /* 14..24 */
    h = mant >> shift;
    rem = mant & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
  } else {
    h = (mag >> 13) - ((127u - 15u) << 10);
    rem = mag & 0x1fffu;
    half = 0x1000u;
  }
  if (rem > half || (rem == half && (h & 1u))) h++; /* a carry into the exponent is right */
  return (uint16_t)(sign | h);
}

/* Grows a pinned buffer nothing is copying from or into any more, at
 * least doubling it.  The old one is kept until destroy, not freed here:
 * cudaFreeHost synchronizes the whole device, and mid-forward that is a
 * stall of every stream, and on a sharded run an unwatched wait on a
 * pending all-gather that a missing rank never ends (review D5).  Doubling
 * keeps what is kept below the largest buffer's size. */
static int grow_host(struct cuda_blas *cb, struct host_buf *b, size_t bytes) {
  if (bytes <= b->bytes) return MLO_OK;
  size_t want = b->bytes > bytes / 2 && b->bytes <= SIZE_MAX / 2 ? 2 * b->bytes : bytes;
  if (b->ptr) {
    struct retired *r = malloc(sizeof *r);
    if (!r) return MLO_ENOMEM;
    *r = (struct retired){b->ptr, cb->retired};
    cb->retired = r;
  }
  b->ptr = NULL;
  b->bytes = 0;
  int rc = cu_status(cudaMallocHost(&b->ptr, want), "cudaMallocHost");
  if (rc) return rc == MLO_ENOMEM_DEVICE ? MLO_ENOMEM : rc;
  b->bytes = want;
  return MLO_OK;
}

/* A device buffer from the platform, usable on the compute stream. */
static int scratch_alloc(struct cuda_blas *b, size_t bytes, void **ptr) {
  int rc = mlo_plat_dev_alloc_compute(b->platform, bytes, ptr);
  if (rc != MLO_EUNSUPPORTED) return rc; /* in compute's order: no wait on COPY */
  rc = mlo_plat_dev_alloc(b->platform, bytes, ptr);
  if (rc) return rc;
  if (!b->ready) rc = mlo_plat_event_create(b->platform, &b->ready);
  if (!rc) rc = mlo_plat_event_record_copy(b->platform, b->ready);
  if (!rc) rc = mlo_plat_compute_wait(b->platform, b->ready);
  if (rc) {
    mlo_plat_dev_free(b->platform, *ptr, bytes);
    *ptr = NULL;
  }
  return rc;
}

/* Stream-ordered after every queued use (the platform's dev_free). */
static void scratch_free(struct cuda_blas *b, void *ptr, size_t bytes) {
  if (ptr) mlo_plat_dev_free(b->platform, ptr, bytes);
}

/* Folds the oldest result in flight, once its copy has landed. */
static int retire_oldest(struct cuda_blas *b) {
  struct slot *sl = &b->ring[b->head];
  int rc = cu_status(cudaEventSynchronize(sl->done), "cudaEventSynchronize (result)");
  if (!rc) *sl->digest = mlo_digest_fold(*sl->digest, sl->host.ptr, sl->bytes);
  b->head = (b->head + 1) % RING;
  b->count--;
  return rc;
}

/* Enters the workload's context for one entry point (cuda_ctx.h). */
static int enter(struct cuda_blas *b, mlo_cu_guard *g) {
  g->switched = false;
  return cu_status(mlo_cu_ctx_enter(b->ctx, g), "making the stream's context current");
}

static void leave(const mlo_cu_guard *g) {
  cu_status(mlo_cu_ctx_leave(g), "restoring the caller's context");
}

static int cb_flush(void *ctx) {
  struct cuda_blas *b = ctx;
  mlo_cu_guard g;
  int rc = enter(b, &g);
  while (!rc && b->count) {
    int r = retire_oldest(b);
    if (!rc) rc = r;
  }
  leave(&g);
  return rc;
}

/* The next free slot (folding the oldest when all are in flight). */
static int take_slot(struct cuda_blas *b, struct slot **out) {
  int rc = b->count == RING ? retire_oldest(b) : MLO_OK;
  if (rc) return rc;
  *out = &b->ring[(b->head + b->count) % RING];
  return MLO_OK;
}

/* Queues the copy of `bytes` at `src` into the slot and its fold into
 * *digest; the slot counts as in flight from here. */
static int queue_result(struct cuda_blas *b, struct slot *sl, const void *src, size_t bytes,
                        uint64_t *digest) {
  int rc = grow_host(b, &sl->host, bytes ? bytes : 1);
  if (!rc)
    rc = cu_status(cudaMemcpyAsync(sl->host.ptr, src, bytes, cudaMemcpyDeviceToHost, b->stream),
                   "cudaMemcpyAsync (result)");
  if (!rc) rc = cu_status(cudaEventRecord(sl->done, b->stream), "cudaEventRecord (result)");
  if (rc) return rc;
  sl->digest = digest;
  sl->bytes = bytes;
  b->count++;
  return MLO_OK;
}

static void cb_destroy(void *ctx) {
  struct cuda_blas *b = ctx;
  if (!b) return;
  if (!b->ctx) { /* nothing was made: no runtime call, which would make a context */
    free(b);
    return;
  }
  mlo_cu_guard g = {0};
  enter(b, &g);
  cudaStreamSynchronize(b->stream); /* nothing reads or writes what goes below */
  b->count = 0;                     /* results never flushed are dropped */
  for (int i = 0; i < X_CACHE; i++) {
    scratch_free(b, b->x[i].dev, b->x[i].dev_bytes);
    if (b->x[i].host.ptr) cudaFreeHost(b->x[i].host.ptr);
    if (b->x[i].uploaded) cudaEventDestroy(b->x[i].uploaded);
  }
  for (int i = 0; i < RING; i++) {
    scratch_free(b, b->ring[i].y, b->ring[i].y_bytes);
    if (b->ring[i].host.ptr) cudaFreeHost(b->ring[i].host.ptr);
    if (b->ring[i].done) cudaEventDestroy(b->ring[i].done);
  }
  while (b->retired) {
    struct retired *r = b->retired;
    b->retired = r->next;
    cudaFreeHost(r->ptr);
    free(r);
  }
  if (b->handle) cublasDestroy(b->handle); /* before its workspace goes */
  scratch_free(b, b->workspace, WORKSPACE_BYTES);
  mlo_plat_event_destroy(b->platform, b->ready);
  (void)cudaGetLastError();
  leave(&g);
  free(b);
}

/* The context the platform's compute stream lives in, which every entry
 * point makes current.  A stream made by the platform or given to it names
 * its own (cuStreamGetCtx).  The legacy default stream (stream=0; 1,
 * cudaStreamLegacy, names it too) names none: the runtime resolves it in
 * whichever context the calling thread has current, and cuStreamGetCtx
 * answers that one, or fails where there is none (review D11).  It is the
 * platform's context's legacy stream that the platform orders compute and
 * frees on, so that context is asked of the platform; entered in every
 * call, stream 0 is then that context's legacy stream, whatever the
 * caller's thread has current.  The per-thread handle (2) names each
 * calling thread's own stream, not one: refused, as the platform refuses
 * it. */
static int stream_context(mlo_platform *p, cudaStream_t stream, void **ctx) {
  *ctx = NULL;
  if (stream == cudaStreamPerThread) {
    mlo_logf(MLO_LOG_ERROR, "cuda workload: the compute stream is cudaStreamPerThread, which "
                            "names each calling thread's own stream: give a stream");
    return MLO_EINVAL;
  }
  if (stream && stream != cudaStreamLegacy)
    return cu_status(mlo_cu_ctx_of_stream(stream, ctx), "cuStreamGetCtx");
  *ctx = mlo_plat_compute_context(p);
  if (*ctx) return MLO_OK;
  mlo_logf(MLO_LOG_ERROR, "cuda workload: the platform's compute stream is the legacy default "
                          "stream, and it names no context to resolve it in");
  return MLO_EINVAL;
}

static int cb_create(mlo_platform *p, void **ctx) {
  *ctx = NULL;
  cudaStream_t stream = mlo_platform_compute_queue(p);
  struct cuda_blas *b = mlo_calloc(1, sizeof *b);
  if (!b) return MLO_ENOMEM;
  b->stream = stream;
  b->platform = p;
  int rc = stream_context(p, stream, &b->ctx);
  mlo_cu_guard g = {0};
  if (!rc) rc = enter(b, &g);
  if (!rc) rc = blas_status(cublasCreate(&b->handle), "cublasCreate");
  if (!rc) rc = blas_status(cublasSetStream(b->handle, stream), "cublasSetStream");
  /* Its workspace from the platform, so capacity= counts it. */
  if (!rc) rc = scratch_alloc(b, WORKSPACE_BYTES, &b->workspace);
  const unsigned flags = cudaEventDisableTiming | cudaEventBlockingSync;
  for (int i = 0; i < RING && !rc; i++)
    rc = cu_status(cudaEventCreateWithFlags(&b->ring[i].done, flags), "cudaEventCreate");
  for (int i = 0; i < X_CACHE && !rc; i++)
    rc = cu_status(cudaEventCreateWithFlags(&b->x[i].uploaded, flags), "cudaEventCreate");
  if (!rc)
    rc = blas_status(cublasSetWorkspace(b->handle, b->workspace, WORKSPACE_BYTES),
                     "cublasSetWorkspace");
  if (rc) cb_destroy(b);
  leave(&g);
  if (!rc) *ctx = b;
  return rc;
}

static void fill_input(void *host, mlo_dtype dtype, uint64_t seed, int tokens, int64_t in) {
  size_t i = 0;
  for (int t = 0; t < tokens; t++)
    for (int64_t k = 0; k < in; k++, i++) {
      float v = mlo_workload_input(seed, t, k);
      if (dtype == MLO_DTYPE_F32)
        ((float *)host)[i] = v;
      else if (dtype == MLO_DTYPE_BF16)
        ((uint16_t *)host)[i] = bf16_from_float(v);
      else
        ((uint16_t *)host)[i] = f16_from_float(v);
    }
}

/* The device X for these parameters, generated and uploaded on a miss into
 * the least recently filled entry, whose buffers are reused: the host copy
 * once its last upload is done, the device copy in stream order (the
 * GEMMs that read it were queued before the new upload). */
static int get_input(struct cuda_blas *b, mlo_dtype dtype, uint64_t seed, int tokens, int64_t in,
                     const void **dev) {
  for (int i = 0; i < X_CACHE; i++) {
    struct x_entry *e = &b->x[i];
    if (e->valid && e->seed == seed && e->tokens == tokens && e->in == in && e->dtype == dtype) {
      *dev = e->dev;
      return MLO_OK;
    }
  }
  struct x_entry *e = &b->x[b->next_victim++ % X_CACHE];
  e->valid = false;
  size_t bytes = (size_t)tokens * (size_t)in * (dtype == MLO_DTYPE_F32 ? 4 : 2);
  int rc = e->pending ? cu_status(cudaEventSynchronize(e->uploaded), "cudaEventSynchronize (X)")
                      : MLO_OK;
  e->pending = false;
  if (!rc) rc = grow_host(b, &e->host, bytes);
  if (!rc && bytes > e->dev_bytes) {
    scratch_free(b, e->dev, e->dev_bytes);
    e->dev = NULL;
    e->dev_bytes = 0;
    rc = scratch_alloc(b, bytes, &e->dev);
    if (!rc) e->dev_bytes = bytes;
  }
  if (!rc) {
    fill_input(e->host.ptr, dtype, seed, tokens, in);
    rc = cu_status(cudaMemcpyAsync(e->dev, e->host.ptr, bytes, cudaMemcpyHostToDevice, b->stream),
                   "cudaMemcpyAsync (X)");
  }
  if (!rc) rc = cu_status(cudaEventRecord(e->uploaded, b->stream), "cudaEventRecord (X)");
  if (rc) return rc;
  e->pending = true;
  e->valid = true;
  e->seed = seed;
  e->tokens = tokens;
  e->in = in;
  e->dtype = dtype;
  *dev = e->dev;
  return MLO_OK;
}

static int cb_gemm_digest(void *ctx, void *block, size_t offset, mlo_dtype dtype, int64_t out,
                          int64_t in, int tokens, uint64_t seed, uint64_t *digest) {
  struct cuda_blas *b = ctx;
  cudaDataType_t type = dtype == MLO_DTYPE_F32    ? CUDA_R_32F
                        : dtype == MLO_DTYPE_BF16 ? CUDA_R_16BF
                        : dtype == MLO_DTYPE_F16  ? CUDA_R_16F
                                                  : (cudaDataType_t)-1;
  if (type == (cudaDataType_t)-1) return MLO_EUNSUPPORTED;
  if (out <= 0 || in <= 0 || tokens <= 0 || out > INT_MAX || in > INT_MAX) return MLO_EINVAL;
  if ((uint64_t)out > SIZE_MAX / 4 / (uint64_t)tokens) return MLO_EINVAL;
  mlo_cu_guard g;
  int rc = enter(b, &g);
  const void *x = NULL;
  if (!rc) rc = get_input(b, dtype, seed, tokens, in, &x);
  size_t y_bytes = (size_t)tokens * (size_t)out * sizeof(float);
  struct slot *sl = NULL;
  if (!rc) rc = take_slot(b, &sl);
  if (!rc && y_bytes > sl->y_bytes) {
    scratch_free(b, sl->y, sl->y_bytes);
    sl->y = NULL;
    sl->y_bytes = 0;
    rc = scratch_alloc(b, y_bytes, &sl->y);
    if (!rc) sl->y_bytes = y_bytes;
  }
  /* Column-major view: Y^T (out x tokens) = W (op T of in x out) * X^T. */
  const float one = 1.0f, zero = 0.0f;
  if (!rc)
    rc = blas_status(cublasGemmEx(b->handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, tokens, (int)in,
                                  &one, (const char *)block + offset, type, (int)in, x, type,
                                  (int)in, &zero, sl->y, CUDA_R_32F, (int)out, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
  if (!rc) rc = queue_result(b, sl, sl->y, y_bytes, digest);
  leave(&g);
  return rc;
}

static int cb_bytes_digest(void *ctx, void *block, size_t offset, uint64_t nbytes,
                           uint64_t *digest) {
  struct cuda_blas *b = ctx;
  if (nbytes > SIZE_MAX) return MLO_EINVAL;
  mlo_cu_guard g;
  int rc = enter(b, &g);
  struct slot *sl = NULL;
  if (!rc) rc = take_slot(b, &sl);
  if (!rc) rc = queue_result(b, sl, (const char *)block + offset, (size_t)nbytes, digest);
  leave(&g);
  return rc;
}

static const struct mlo_workload_ops cuda_workload_ops = {
    .platform = "cuda",
    .create = cb_create,
    .destroy = cb_destroy,
    .gemm_digest = cb_gemm_digest,
    .bytes_digest = cb_bytes_digest,
    .flush = cb_flush,
};

/* The module's description (platform/module.h): libmlo-workload-cuda.so. */
MLO_MODULE_DEFINE_WORKLOAD("cuda", &cuda_workload_ops);
