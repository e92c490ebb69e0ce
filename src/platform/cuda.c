/*
 * cuda.c — the CUDA platform: "cuda[:N][:key=value,...]", plain C against
 * the CUDA runtime API.
 *
 * Three non-blocking streams: COPY (loads and write-backs), COMPUTE (the
 * queue users submit their forwards to, exposed by compute_queue) and
 * RELEASE (where device blocks are returned to the pool).  Ordering is done
 * with events, never with a host synchronize (docs/platforms.md has the
 * argument in full):
 *  - a block is allocated from our memory pool ON THE COPY STREAM, so the
 *    copies into it are ordered after the allocation for free, and compute
 *    reaches it only through compute_wait on an event recorded after those
 *    copies;
 *  - a block is freed on the RELEASE stream after that stream waits for the
 *    current tails of both COPY and COMPUTE, so the free is ordered after
 *    every copy and kernel already submitted, and neither working stream
 *    stalls on the other; a later allocation that reuses the memory gets
 *    the dependency from the pool (cudaMemPoolReuseAllowInternalDependencies).
 * Host slabs are pinned with cudaHostAlloc (portable), falling back to
 * pageable memory with one warning; MLO_NO_PINNED=1 or pinned=0 turn it off.
 */
#include "base/sysio.h"
#include "base/log.h"
#include "platform/platform.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Copies are cut into pieces this large: big enough for full link speed,
 * small enough that a pageable source is staged in bounded chunks. */
#define DEFAULT_CHUNK ((uint64_t)64 << 20)

struct cuda_options {
  unsigned long index;
  int pinned;        /* -1: on unless MLO_NO_PINNED=1 */
  uint64_t chunk;    /* bytes per cudaMemcpyAsync */
  uint64_t capacity; /* 0: the whole device */
};

struct cuda_ctx {
  int device;
  cudaStream_t copy, compute, release;
  cudaEvent_t copy_tail, compute_tail; /* free ordering; guarded by lock */
  cudaMemPool_t pool;                  /* NULL: no pool support, plain cudaMalloc */
  size_t chunk;
  bool pinned, host_register;
  pthread_mutex_t lock;
  bool warned_pageable;
  uint64_t capacity; /* bytes mlo may hand out: capacity= or the device's total */
  uint64_t used;     /* bytes of live blocks; guarded by lock */
};

/* Maps a runtime error to a status and clears it from the thread's last
 * error, so the next unrelated call does not report it again. */
static int cuda_status(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return MLO_OK;
  (void)cudaGetLastError();
  if (e == cudaErrorMemoryAllocation) {
    mlo_logf(MLO_LOG_INFO, "cuda: %s: device out of memory", what);
    return MLO_ENOMEM_DEVICE;
  }
  mlo_logf(MLO_LOG_ERROR, "cuda: %s failed: %s (%s)", what, cudaGetErrorString(e),
           cudaGetErrorName(e));
  return MLO_EPLATFORM;
}

/* The current device is per host thread; every entry point may run on a
 * thread that has never selected ours. */
static int use_device(struct cuda_ctx *c) {
  return cuda_status(cudaSetDevice(c->device), "cudaSetDevice");
}

/* ---- device blocks ------------------------------------------------------ */

static int cu_dev_alloc(void *ctx, size_t bytes, void **block) {
  struct cuda_ctx *c = ctx;
  *block = NULL;
  int rc = use_device(c);
  if (rc) return rc;
  /* Reserve against the capacity first (capacity= lets a big GPU stand in
   * for a smaller one), so two threads cannot both pass the check. */
  pthread_mutex_lock(&c->lock);
  bool fits = bytes <= c->capacity - c->used;
  if (fits) c->used += bytes;
  pthread_mutex_unlock(&c->lock);
  if (!fits) return MLO_ENOMEM_DEVICE;
  void *ptr = NULL;
  size_t n = bytes ? bytes : 1;
  cudaError_t e =
      c->pool ? cudaMallocFromPoolAsync(&ptr, n, c->pool, c->copy) : cudaMalloc(&ptr, n);
  if (e == cudaErrorMemoryAllocation && c->pool) {
    /* A block freed with cudaFreeAsync behind queued work may not count as
     * free until the host has seen the free complete: drain the release
     * stream and try once more before calling it out of memory. */
    (void)cudaGetLastError();
    if (cudaStreamSynchronize(c->release) == cudaSuccess)
      e = cudaMallocFromPoolAsync(&ptr, n, c->pool, c->copy);
  }
  rc = cuda_status(e, "allocating a device block");
  if (!rc) {
    *block = ptr;
    return MLO_OK;
  }
  pthread_mutex_lock(&c->lock);
  c->used -= bytes;
  pthread_mutex_unlock(&c->lock);
  return rc;
}

/* Ordered after every copy and compute already submitted: RELEASE waits for
 * both tails, then returns the block to the pool.  No host wait. */
/* The bytes a block held stop counting once its free is queued: a free
 * that fails leaves them held, as they are. */
static void freed(struct cuda_ctx *c, size_t bytes, int rc) {
  if (rc) return;
  pthread_mutex_lock(&c->lock);
  c->used -= bytes;
  pthread_mutex_unlock(&c->lock);
}

static void cu_dev_free(void *ctx, void *block, size_t bytes) {
  struct cuda_ctx *c = ctx;
  if (use_device(c)) return;
  if (!c->pool) { /* no stream-ordered allocator: drain, then free */
    cudaStreamSynchronize(c->copy);
    cudaStreamSynchronize(c->compute);
    freed(c, bytes, cuda_status(cudaFree(block), "cudaFree"));
    return;
  }
  pthread_mutex_lock(&c->lock);
  cudaError_t e = cudaEventRecord(c->copy_tail, c->copy);
  if (e == cudaSuccess) e = cudaEventRecord(c->compute_tail, c->compute);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(c->release, c->copy_tail, 0);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(c->release, c->compute_tail, 0);
  pthread_mutex_unlock(&c->lock);
  if (e != cudaSuccess) {
    /* Could not order it: leaking is wrong, freeing early is worse. */
    cuda_status(e, "ordering a free");
    cudaStreamSynchronize(c->copy);
    cudaStreamSynchronize(c->compute);
  }
  freed(c, bytes, cuda_status(cudaFreeAsync(block, c->release), "cudaFreeAsync"));
}

/* Free memory as the device sees it, plus what our pool holds in reserve
 * (freed blocks it keeps for reuse, which cudaMemGetInfo counts as used). */
static int cu_get_memory(void *ctx, uint64_t *total, uint64_t *free_bytes) {
  struct cuda_ctx *c = ctx;
  int rc = use_device(c);
  if (rc) return rc;
  size_t f = 0, t = 0;
  rc = cuda_status(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
  if (rc) return rc;
  uint64_t reserved = 0, used = 0;
  if (c->pool &&
      cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrReservedMemCurrent, &reserved) ==
          cudaSuccess &&
      cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess &&
      reserved > used)
    f += (size_t)(reserved - used);
  if (f > t) f = t;
  /* Under capacity= the device looks as big as the cap, and no freer than
   * the cap leaves or the device really is. */
  pthread_mutex_lock(&c->lock);
  uint64_t cap_free = c->capacity - c->used;
  *total = c->capacity < t ? c->capacity : t;
  pthread_mutex_unlock(&c->lock);
  *free_bytes = f < cap_free ? f : cap_free;
  return MLO_OK;
}

/* ---- host memory -------------------------------------------------------- */

static void warn_pageable_once(struct cuda_ctx *c, const char *why) {
  pthread_mutex_lock(&c->lock);
  bool first = !c->warned_pageable;
  c->warned_pageable = true;
  pthread_mutex_unlock(&c->lock);
  if (first) mlo_logf(MLO_LOG_WARN, "cuda: host memory is pageable: %s", why);
}

static int cu_host_alloc(void *ctx, size_t bytes, bool pinned, void **ptr, bool *got_pinned) {
  struct cuda_ctx *c = ctx;
  *ptr = NULL;
  *got_pinned = false;
  if (pinned && !c->pinned) warn_pageable_once(c, "pinning disabled (pinned=0 or MLO_NO_PINNED=1)");
  if (pinned && c->pinned && bytes && !use_device(c)) {
    /* Portable: the slab stays pinned for every device and context. */
    cudaError_t e = cudaHostAlloc(ptr, bytes, cudaHostAllocPortable);
    if (e == cudaSuccess) {
      *got_pinned = true;
      return MLO_OK;
    }
    (void)cudaGetLastError();
    *ptr = NULL;
    char why[160];
    snprintf(why, sizeof why, "cudaHostAlloc of %zu bytes failed (%s)", bytes,
             cudaGetErrorString(e));
    warn_pageable_once(c, why);
  }
  size_t rounded = (bytes + 4095) & ~(size_t)4095;
  if (rounded < bytes) return MLO_ENOMEM;
  *ptr = mlo_aligned_alloc(4096, rounded ? rounded : 4096);
  return *ptr ? MLO_OK : MLO_ENOMEM;
}

/* cudaFreeHost does not wait for copies still reading the buffer (it is no
 * synchronization), and neither does free: the copy stream drains first,
 * for pageable buffers too (a copy stages from them asynchronously). */
static void cu_host_free(void *ctx, void *ptr, size_t bytes, bool pinned) {
  struct cuda_ctx *c = ctx;
  (void)bytes;
  if (!use_device(c)) cuda_status(cudaStreamSynchronize(c->copy), "cudaStreamSynchronize(copy)");
  if (!pinned) {
    free(ptr);
    return;
  }
  cuda_status(cudaFreeHost(ptr), "cudaFreeHost");
}

/* ---- copies ------------------------------------------------------------- */

static int copy_chunks(struct cuda_ctx *c, char *dst, const char *src, size_t bytes,
                       enum cudaMemcpyKind kind) {
  int rc = use_device(c);
  for (size_t done = 0; !rc && done < bytes; done += c->chunk) {
    size_t n = bytes - done < c->chunk ? bytes - done : c->chunk;
    rc = cuda_status(cudaMemcpyAsync(dst + done, src + done, n, kind, c->copy), "cudaMemcpyAsync");
  }
  return rc;
}

static int cu_copy_h2d(void *ctx, void *block, size_t offset, const void *src, size_t bytes) {
  return copy_chunks(ctx, (char *)block + offset, src, bytes, cudaMemcpyHostToDevice);
}

static int cu_copy_d2h(void *ctx, void *dst, const void *block, size_t offset, size_t bytes) {
  return copy_chunks(ctx, dst, (const char *)block + offset, bytes, cudaMemcpyDeviceToHost);
}

/* ---- events: a cudaEvent_t and its completion stamp --------------------- */

struct mlo_event {
  cudaEvent_t e;
  mlo_stamp *stamp; /* when the copy queue reached the last copy-side record */
  pthread_mutex_t lock;
};

static int cu_event_create(void *ctx, mlo_event **ev) {
  int rc = use_device(ctx);
  if (rc) return rc;
  mlo_event *m = mlo_calloc(1, sizeof *m);
  if (!m) return MLO_ENOMEM;
  /* BlockingSync: a host waiting on it sleeps instead of spinning a core. */
  rc = cuda_status(cudaEventCreateWithFlags(&m->e, cudaEventDisableTiming | cudaEventBlockingSync),
                   "cudaEventCreate");
  if (rc) {
    free(m);
    return rc;
  }
  pthread_mutex_init(&m->lock, NULL);
  *ev = m;
  return MLO_OK;
}

static void cu_event_destroy(void *ctx, mlo_event *ev) {
  (void)ctx;
  cuda_status(cudaEventDestroy(ev->e), "cudaEventDestroy");
  mlo_stamp_put(ev->stamp);
  pthread_mutex_destroy(&ev->lock);
  free(ev);
}

/* Runs on a driver thread once the copy stream reaches it; only records. */
static void CUDART_CB stamp_host_fn(void *user) {
  mlo_stamp_fire(user);
}

static int cu_event_record_copy(void *ctx, mlo_event *ev) {
  struct cuda_ctx *c = ctx;
  int rc = cuda_status(cudaEventRecord(ev->e, c->copy), "cudaEventRecord(copy)");
  if (rc) return rc;
  /* The completion time, for traces; best effort (no stamp: unknown). */
  mlo_stamp *stamp = mlo_stamp_new();
  if (stamp && cudaLaunchHostFunc(c->copy, stamp_host_fn, stamp) != cudaSuccess) {
    (void)cudaGetLastError(); /* not sticky: a launch the runtime refused */
    mlo_stamp_put(stamp);
    mlo_stamp_put(stamp);
    stamp = NULL;
  }
  pthread_mutex_lock(&ev->lock);
  mlo_stamp *old = ev->stamp;
  ev->stamp = stamp;
  pthread_mutex_unlock(&ev->lock);
  mlo_stamp_put(old);
  return MLO_OK;
}

static int cu_event_time(void *ctx, mlo_event *ev, uint64_t *t_ns) {
  (void)ctx;
  pthread_mutex_lock(&ev->lock);
  int rc = mlo_stamp_time(ev->stamp, t_ns);
  pthread_mutex_unlock(&ev->lock);
  return rc;
}

static int cu_event_record_compute(void *ctx, mlo_event *ev) {
  struct cuda_ctx *c = ctx;
  return cuda_status(cudaEventRecord(ev->e, c->compute), "cudaEventRecord(compute)");
}

static int cu_compute_wait(void *ctx, mlo_event *ev) {
  struct cuda_ctx *c = ctx;
  return cuda_status(cudaStreamWaitEvent(c->compute, ev->e, 0), "cudaStreamWaitEvent");
}

static int cu_copy_wait(void *ctx, mlo_event *ev) {
  struct cuda_ctx *c = ctx;
  return cuda_status(cudaStreamWaitEvent(c->copy, ev->e, 0), "cudaStreamWaitEvent");
}

static int cu_event_sync(void *ctx, mlo_event *ev) {
  (void)ctx;
  return cuda_status(cudaEventSynchronize(ev->e), "cudaEventSynchronize");
}

static int cu_event_query(void *ctx, mlo_event *ev) {
  (void)ctx;
  cudaError_t e = cudaEventQuery(ev->e);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return MLO_EBUSY;
  }
  return cuda_status(e, "cudaEventQuery");
}

static int cu_synchronize(void *ctx) {
  struct cuda_ctx *c = ctx;
  int rc = use_device(c);
  if (!rc) rc = cuda_status(cudaStreamSynchronize(c->copy), "cudaStreamSynchronize(copy)");
  if (!rc) rc = cuda_status(cudaStreamSynchronize(c->compute), "cudaStreamSynchronize(compute)");
  if (!rc) rc = cuda_status(cudaStreamSynchronize(c->release), "cudaStreamSynchronize(release)");
  return rc;
}

static void *cu_compute_queue(void *ctx) {
  return ((struct cuda_ctx *)ctx)->compute;
}

static void cu_get_caps(void *ctx, mlo_platform_caps *caps) {
  struct cuda_ctx *c = ctx;
  *caps = (mlo_platform_caps){
      .async_copy = true,
      .events = true,
      .pinned_host = c->pinned,
      .host_register = c->host_register,
      .blocking_d2h = false,
      .device_pointers = true,
  };
}

static void cu_destroy(void *ctx) {
  struct cuda_ctx *c = ctx;
  if (!c) return;
  if (!use_device(c)) {
    cudaStream_t streams[] = {c->copy, c->compute, c->release};
    for (int i = 0; i < 3; i++)
      if (streams[i]) {
        cudaStreamSynchronize(streams[i]);
        cudaStreamDestroy(streams[i]);
      }
    if (c->copy_tail) cudaEventDestroy(c->copy_tail);
    if (c->compute_tail) cudaEventDestroy(c->compute_tail);
    if (c->pool) cudaMemPoolDestroy(c->pool);
  }
  (void)cudaGetLastError();
  pthread_mutex_destroy(&c->lock);
  free(c);
}

static const struct mlo_platform_ops cuda_ops = {
    .name = "cuda",
    .destroy = cu_destroy,
    .get_caps = cu_get_caps,
    .get_memory = cu_get_memory,
    .dev_alloc = cu_dev_alloc,
    .dev_free = cu_dev_free,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .copy_h2d = cu_copy_h2d,
    .copy_d2h = cu_copy_d2h,
    .event_create = cu_event_create,
    .event_destroy = cu_event_destroy,
    .event_record_copy = cu_event_record_copy,
    .event_record_compute = cu_event_record_compute,
    .compute_wait = cu_compute_wait,
    .copy_wait = cu_copy_wait,
    .event_sync = cu_event_sync,
    .event_query = cu_event_query,
    .event_time = cu_event_time,
    .synchronize = cu_synchronize,
    .compute_queue = cu_compute_queue,
};

/* ---- the spec ----------------------------------------------------------- */

static int cu_option(const char *key, const char *value, void *user, char *err, size_t errlen) {
  struct cuda_options *o = user;
  if (!strcmp(key, "pinned")) {
    if (strcmp(value, "0") && strcmp(value, "1")) {
      snprintf(err, errlen, "cuda platform option pinned=%s: expected 0 or 1", value);
      return MLO_EINVAL;
    }
    o->pinned = value[0] == '1';
    return MLO_OK;
  }
  if (!strcmp(key, "chunk")) {
    if (mlo_parse_size(value, false, &o->chunk) || o->chunk < 4096 ||
        o->chunk > ((uint64_t)1 << 40)) {
      snprintf(err, errlen, "cuda platform option chunk=%s: expected a size from 4K to 1T", value);
      return MLO_EINVAL;
    }
    return MLO_OK;
  }
  if (!strcmp(key, "capacity")) {
    if (mlo_parse_size(value, false, &o->capacity)) {
      snprintf(err, errlen, "cuda platform option capacity=%s: expected a size such as 24G", value);
      return MLO_EINVAL;
    }
    return MLO_OK;
  }
  snprintf(err, errlen, "unknown cuda platform option %s=%s (known: pinned, chunk, capacity)", key,
           value);
  return MLO_EINVAL;
}

/* "" | "N" | "N:opts" | "opts".
 * Parsed before any CUDA call, so a bad spec is MLO_EINVAL even without a GPU. */
static int parse_spec(const char *args, struct cuda_options *o, char *err, size_t errlen) {
  return mlo_spec_parse_indexed("cuda", args, 1024, &o->index, cu_option, o, err, errlen);
}

static int find_device(unsigned long index, char *err, size_t errlen) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    snprintf(err, errlen, "no CUDA device visible (cudaGetDeviceCount: %s)",
             e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return MLO_ENODEV;
  }
  if (index >= (unsigned long)count) {
    snprintf(err, errlen, "CUDA device %lu not present (%d visible)", index, count);
    return MLO_ENODEV;
  }
  return MLO_OK;
}

/* Our own pool, so that its reserve is ours to report and reuse.  Capped
 * (capacity=), the pool may not grow past the cap (maxSize) and keeps up to
 * it in reserve; uncapped, the release threshold is 0, so memory freed by
 * evictions goes back to the driver at synchronize points and can serve the
 * user's own allocations and other processes (docs/platforms.md). */
static cudaError_t create_pool(struct cuda_ctx *c) {
  int supported = 0;
  cudaError_t e = cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, c->device);
  if (e != cudaSuccess || !supported) {
    (void)cudaGetLastError();
    mlo_logf(MLO_LOG_WARN, "cuda: no stream-ordered allocator on device %d: frees will synchronize",
             c->device);
    return cudaSuccess;
  }
  struct cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = c->device;
  bool capped = c->capacity != 0;
  if (capped) props.maxSize = (size_t)c->capacity;
  e = cudaMemPoolCreate(&c->pool, &props);
  uint64_t threshold = capped ? c->capacity : 0;
  int on = 1;
  if (e == cudaSuccess)
    e = cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  if (e == cudaSuccess)
    e = cudaMemPoolSetAttribute(c->pool, cudaMemPoolReuseAllowInternalDependencies, &on);
  return e;
}

static int create_streams(struct cuda_ctx *c, char *err, size_t errlen) {
  cudaError_t e = cudaSetDevice(c->device);
  const char *what = "cudaSetDevice";
  cudaStream_t *streams[] = {&c->copy, &c->compute, &c->release};
  for (int i = 0; i < 3 && e == cudaSuccess; i++) {
    what = "cudaStreamCreateWithFlags";
    e = cudaStreamCreateWithFlags(streams[i], cudaStreamNonBlocking);
  }
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->copy_tail, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->compute_tail, cudaEventDisableTiming);
  if (e == cudaSuccess) {
    what = "creating the memory pool";
    e = create_pool(c);
  }
  if (e == cudaSuccess) return MLO_OK;
  (void)cudaGetLastError();
  snprintf(err, errlen, "cuda platform: %s failed: %s", what, cudaGetErrorString(e));
  return e == cudaErrorMemoryAllocation ? MLO_ENOMEM_DEVICE : MLO_EPLATFORM;
}

static void describe(struct cuda_ctx *c, mlo_platform *p) {
  struct cudaDeviceProp prop;
  memset(&prop, 0, sizeof prop);
  if (cudaGetDeviceProperties(&prop, c->device) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(prop.name, sizeof prop.name, "?");
  }
  int reg = 0;
  if (cudaDeviceGetAttribute(&reg, cudaDevAttrHostRegisterSupported, c->device) != cudaSuccess)
    (void)cudaGetLastError();
  c->host_register = reg != 0;
  /* capacity=: never more than the device has; unknown size: no cap. */
  uint64_t total = prop.totalGlobalMem ? (uint64_t)prop.totalGlobalMem : UINT64_MAX;
  bool capped = c->capacity && c->capacity < total;
  c->capacity = capped ? c->capacity : total;
  char mem[32], cap[48] = "";
  mlo_format_size(prop.totalGlobalMem, mem, sizeof mem);
  if (capped) {
    char size[32];
    snprintf(cap, sizeof cap, ", capacity %s", mlo_format_size(c->capacity, size, sizeof size));
  }
  snprintf(p->description, sizeof p->description, "CUDA device %d: %.80s (%s, cc %d.%d)%s%s",
           c->device, prop.name, mem, prop.major, prop.minor, cap,
           c->pinned ? "" : ", pageable host memory");
}

int mlo_cuda_platform_create(const char *spec_args, mlo_platform *p, char *err, size_t errlen) {
  struct cuda_options opt = {.index = 0, .pinned = -1, .chunk = DEFAULT_CHUNK};
  int rc = parse_spec(spec_args ? spec_args : "", &opt, err, errlen);
  if (!rc) rc = find_device(opt.index, err, errlen);
  if (rc) return rc;
  struct cuda_ctx *c = mlo_calloc(1, sizeof *c);
  if (!c) return MLO_ENOMEM;
  pthread_mutex_init(&c->lock, NULL);
  c->device = (int)opt.index;
  c->chunk = (size_t)opt.chunk;
  c->capacity = opt.capacity;
  /* The environment is a kill switch: it wins over pinned=1. */
  c->pinned = opt.pinned != 0 && !mlo_env_flag("MLO_NO_PINNED");
  rc = create_streams(c, err, errlen);
  if (rc) {
    cu_destroy(c);
    return rc;
  }
  describe(c, p);
  p->ops = &cuda_ops;
  p->ctx = c;
  return MLO_OK;
}
