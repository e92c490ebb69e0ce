/*
 * fakecuda_mem.c — the fake CUDA runtime's memory (fakecuda.c has the
 * model): device blocks in host memory with the device's byte budget,
 * stream-ordered pools whose frees run when their stream reaches them
 * (poisoning with 0xA5), page-locked host memory and registrations as
 * bookkeeping, and copies queued on streams.
 */
#include "fakecuda.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum fc_state { FC_LIVE, FC_FREEING, FC_FREE };

struct fc_block {
  char *ptr;
  size_t size;
  int device;
  struct CUmemPoolHandle_st *pool; /* NULL: cudaMalloc's, or its pool is gone */
  enum fc_state state;
  struct fc_marker *freed; /* FREEING/FREE: its free's completion */
  struct fc_block *next;
};

struct CUmemPoolHandle_st {
  int device;
  uint64_t max_size, threshold; /* 0: no limit */
  uint64_t reserved, reserved_high, used, used_high;
  bool reuse_internal;
};

/* Host memory the runtime knows: its own page-locked allocations and the
 * caller's registrations. */
struct fc_host {
  char *ptr;
  size_t size;
  bool allocated, read_only;
  struct fc_host *next;
  char *lo, *hi; /* the whole pages it locks (D9, add_host) */
};

/* D4: a stream-ordered pool maps physical memory in whole granules (the
 * allocation granularity cuMemGetAllocationGranularity reports, 2 MiB on
 * current GPUs; cudaMemPoolTrimTo: "The OS allocations may happen at
 * different granularity from the user allocations"), and maxSize bounds
 * what it has mapped, so a pool block here takes whole granules of the
 * reserve and of the device.  The fake never shares a granule between two
 * allocations (the runtime may, for small ones): the pessimistic side. */
#define FC_GRANULE ((size_t)2 << 20)

static size_t granules(size_t size) {
  return size > SIZE_MAX - FC_GRANULE ? SIZE_MAX : (size + FC_GRANULE - 1) & ~(FC_GRANULE - 1);
}

static struct fc_block *blocks; /* guarded by fc.lock */
static struct fc_host *hosts;   /* guarded by fc.lock */

/* Bytes the device can still hand out. */
static uint64_t device_room(int d) {
  struct fc_device *dev = &fc.dev[d];
  uint64_t avail = dev->total - (dev->ctx_created ? fc.ctx_reserve : 0);
  return avail > dev->used ? avail - dev->used : 0;
}

static void release_block(struct fc_block *b) {
  struct fc_block **at = &blocks;
  while (*at != b) at = &(*at)->next;
  *at = b->next;
  fc.dev[b->device].used -= b->size;
  if (b->pool) b->pool->reserved -= b->size;
  fc_marker_put(b->freed);
  free(b->ptr);
  free(b);
}

static struct fc_block *find_block(const void *p, size_t n) {
  for (struct fc_block *b = blocks; b; b = b->next)
    if ((const char *)p >= b->ptr && (const char *)p + n <= b->ptr + b->size) return b;
  return NULL;
}

void fc_check_device_access(const void *p, size_t n) {
  struct fc_block *b = find_block(p, n);
  if (!b || b->state == FC_FREE) fc.use_after_free++;
}

/* A block taken again while its free was queued (its new owner's stream
 * waits for this free) is poisoned only: it is live again. */
void fc_block_freed(struct fc_block *b, struct fc_marker *m) {
  memset(b->ptr, 0xA5, b->size);
  if (b->state != FC_FREEING || b->freed != m) return;
  b->state = FC_FREE;
  if (!b->pool) release_block(b);
}

/* Gives one block of pool whose free has completed back to the device. */
static bool release_one(struct CUmemPoolHandle_st *pool) {
  for (struct fc_block *b = blocks; b; b = b->next)
    if (b->pool == pool && b->state == FC_FREE) {
      release_block(b);
      return true;
    }
  return false;
}

void fc_trim_pools(int device) {
  pthread_mutex_lock(&fc.lock);
  for (struct fc_block *b = blocks, *next; b; b = next) {
    next = b->next;
    if (b->device == device && b->pool && b->state == FC_FREE &&
        b->pool->reserved > b->pool->threshold)
      release_block(b);
  }
  pthread_mutex_unlock(&fc.lock);
}

static struct fc_block *new_block(int device, size_t size, struct CUmemPoolHandle_st *pool) {
  struct fc_block *b = calloc(1, sizeof *b);
  if (b) b->ptr = malloc(size);
  if (!b || !b->ptr) {
    free(b);
    return NULL;
  }
  b->size = size;
  b->device = device;
  b->pool = pool;
  b->next = blocks;
  blocks = b;
  fc.dev[device].used += size;
  if (pool) {
    pool->reserved += size;
    if (pool->reserved > pool->reserved_high) pool->reserved_high = pool->reserved;
  }
  return b;
}

/* The smallest block of pool in state st that holds size bytes. */
static struct fc_block *pick(struct CUmemPoolHandle_st *pool, size_t size, enum fc_state st) {
  struct fc_block *best = NULL;
  for (struct fc_block *b = blocks; b; b = b->next)
    if (b->pool == pool && b->state == st && b->size >= size && (!best || b->size < best->size))
      best = b;
  return best;
}

/* ---- pools -------------------------------------------------------------- */

cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const struct cudaMemPoolProps *props) {
  fc_init();
  if (props->location.type != cudaMemLocationTypeDevice || props->location.id < 0 ||
      props->location.id >= fc.ndevices)
    return fc_fail(cudaErrorInvalidValue);
  struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
  if (!p) return fc_fail(cudaErrorMemoryAllocation);
  p->device = props->location.id;
  p->max_size = props->maxSize;
  *pool = p;
  return cudaSuccess;
}

/* Blocks still allocated or being freed outlive it, as the runtime's do. */
cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  if (!pool) return fc_fail(cudaErrorInvalidValue);
  pthread_mutex_lock(&fc.lock);
  while (release_one(pool)) {
  }
  for (struct fc_block *b = blocks; b; b = b->next)
    if (b->pool == pool) b->pool = NULL;
  pthread_mutex_unlock(&fc.lock);
  free(pool);
  return cudaSuccess;
}

/* "Releases memory back to the OS until the pool contains fewer than
 * minBytesToKeep reserved bytes, or there is no more memory that the
 * allocator can safely release" (cudaMemPoolTrimTo): only blocks whose free
 * has run go, and never below minBytesToKeep. */
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t minBytesToKeep) {
  if (!pool) return fc_fail(cudaErrorInvalidValue);
  pthread_mutex_lock(&fc.lock);
  for (struct fc_block *b = blocks, *next; b; b = next) {
    next = b->next;
    if (b->pool == pool && b->state == FC_FREE && pool->reserved >= minBytesToKeep + b->size)
      release_block(b);
  }
  pthread_mutex_unlock(&fc.lock);
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  if (!pool) return fc_fail(cudaErrorInvalidValue);
  pthread_mutex_lock(&fc.lock);
  cudaError_t e = cudaSuccess;
  switch (attr) {
  case cudaMemPoolAttrReleaseThreshold:
    pool->threshold = *(uint64_t *)value;
    break;
  case cudaMemPoolReuseAllowInternalDependencies:
    pool->reuse_internal = *(int *)value != 0;
    break;
  case cudaMemPoolReuseFollowEventDependencies:
  case cudaMemPoolReuseAllowOpportunistic:
    break;
  case cudaMemPoolAttrReservedMemHigh: /* only a reset is allowed */
    pool->reserved_high = pool->reserved;
    break;
  case cudaMemPoolAttrUsedMemHigh:
    pool->used_high = pool->used;
    break;
  default:
    e = cudaErrorInvalidValue;
  }
  pthread_mutex_unlock(&fc.lock);
  return fc_fail(e);
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  if (!pool) return fc_fail(cudaErrorInvalidValue);
  pthread_mutex_lock(&fc.lock);
  cudaError_t e = cudaSuccess;
  switch (attr) {
  case cudaMemPoolAttrReleaseThreshold:
    *(uint64_t *)value = pool->threshold;
    break;
  case cudaMemPoolAttrReservedMemCurrent:
    *(uint64_t *)value = pool->reserved;
    break;
  case cudaMemPoolAttrReservedMemHigh:
    *(uint64_t *)value = pool->reserved_high;
    break;
  case cudaMemPoolAttrUsedMemCurrent:
    *(uint64_t *)value = pool->used;
    break;
  case cudaMemPoolAttrUsedMemHigh:
    *(uint64_t *)value = pool->used_high;
    break;
  case cudaMemPoolReuseAllowInternalDependencies:
    *(int *)value = pool->reuse_internal;
    break;
  default:
    e = cudaErrorInvalidValue;
  }
  pthread_mutex_unlock(&fc.lock);
  return fc_fail(e);
}

/* The stream the last pool allocation was ordered on, as given: a test asks
 * which queue a block was allocated in (review D10). */
static _Atomic(cudaStream_t) last_pool_alloc;

cudaStream_t fakecuda_last_pool_alloc_stream(void) {
  return atomic_load(&last_pool_alloc);
}

/* A block whose free has run; else, with internal dependencies allowed,
 * one whose free is queued (the stream then waits for that free); else
 * new memory, giving back what the pool holds free to make room. */
cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t pool,
                                    cudaStream_t stream) {
  struct CUstream_st *s = fc_stream(stream);
  if (!s || !pool) return fc_fail(cudaErrorInvalidResourceHandle);
  atomic_store(&last_pool_alloc, stream);
  if (!size) size = 1;
  struct fc_op *wait = calloc(1, sizeof *wait);
  if (!wait) return fc_fail(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&fc.lock);
  struct fc_block *b = pick(pool, size, FC_FREE);
  if (!b && pool->reuse_internal && (b = pick(pool, size, FC_FREEING))) {
    wait->kind = FC_WAIT;
    wait->marker = b->freed;
    wait->marker->refs++;
    fc_enqueue(s, wait);
    wait = NULL;
  }
  /* New memory is mapped in granules, and never past maxSize: a pool at
   * its limit refuses (cudaErrorMemoryAllocation) rather than give back its
   * idle reserve, which it does only at a synchronize over its release
   * threshold or at cudaMemPoolTrimTo (the runtime documents nothing
   * more).  Short of device memory, it gives back what it holds free. */
  size_t mapped = granules(size);
  bool over_max =
      !b && pool->max_size && (mapped > pool->max_size || pool->reserved > pool->max_size - mapped);
  while (!b && !over_max && device_room(pool->device) < mapped)
    if (!release_one(pool)) break;
  if (!b && !over_max && device_room(pool->device) >= mapped)
    b = new_block(pool->device, mapped, pool);
  if (b) {
    b->state = FC_LIVE;
    fc_marker_put(b->freed);
    b->freed = NULL;
    pool->used += b->size;
    if (pool->used > pool->used_high) pool->used_high = pool->used;
    *ptr = b->ptr;
  }
  pthread_mutex_unlock(&fc.lock);
  free(wait);
  return b ? cudaSuccess : fc_fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream) {
  if (!ptr) return cudaSuccess;
  struct CUstream_st *s = fc_stream(stream);
  if (!s) return fc_fail(cudaErrorInvalidResourceHandle);
  struct fc_op *op = calloc(1, sizeof *op);
  if (!op) return fc_fail(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&fc.lock);
  struct fc_block *b = find_block(ptr, 1);
  struct fc_marker *m =
      b && b->ptr == ptr && b->state == FC_LIVE && !fc.free_fails ? fc_marker_new() : NULL;
  if (!m) {
    pthread_mutex_unlock(&fc.lock);
    free(op);
    return fc_fail(cudaErrorInvalidValue);
  }
  m->refs++; /* the block's */
  b->state = FC_FREEING;
  b->freed = m;
  if (b->pool) b->pool->used -= b->size;
  op->kind = FC_RELEASE;
  op->block = b;
  op->marker = m;
  fc_enqueue(s, op);
  pthread_mutex_unlock(&fc.lock);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t size) {
  struct CUctx_st *ctx = fc_need_ctx();
  if (!ctx) return fc_fail(cudaErrorNoDevice);
  if (!size) size = 1;
  pthread_mutex_lock(&fc.lock);
  struct fc_block *b = device_room(ctx->device) >= size ? new_block(ctx->device, size, NULL) : NULL;
  if (b) *ptr = b->ptr;
  pthread_mutex_unlock(&fc.lock);
  return b ? cudaSuccess : fc_fail(cudaErrorMemoryAllocation);
}

/* Synchronizes the device first, as the runtime's cudaFree does. */
cudaError_t cudaFree(void *ptr) {
  if (!ptr) return cudaSuccess;
  cudaError_t e = cudaDeviceSynchronize();
  if (e) return e;
  pthread_mutex_lock(&fc.lock);
  struct fc_block *b = find_block(ptr, 1);
  bool ok = b && b->ptr == ptr && b->state == FC_LIVE && !b->pool && !fc.free_fails;
  if (ok) {
    b->state = FC_FREEING;
    fc_block_freed(b, NULL);
  }
  pthread_mutex_unlock(&fc.lock);
  return ok ? cudaSuccess : fc_fail(cudaErrorInvalidValue);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  struct CUctx_st *ctx = fc_need_ctx();
  if (!ctx) return fc_fail(cudaErrorNoDevice);
  pthread_mutex_lock(&fc.lock);
  *free_bytes = (size_t)device_room(ctx->device);
  *total = (size_t)fc.dev[ctx->device].total;
  pthread_mutex_unlock(&fc.lock);
  return cudaSuccess;
}

/* ---- host memory -------------------------------------------------------- */

static struct fc_host *find_host(const void *p, size_t n) {
  for (struct fc_host *h = hosts; h; h = h->next)
    if ((const char *)p < h->ptr + h->size && (const char *)p + n > h->ptr) return h;
  return NULL;
}

/* D9: page-locking is page-granular: cudaHostRegister locks every page the
 * range touches, and a range on a page already locked is refused with
 * cudaErrorHostMemoryAlreadyRegistered ("the memory range passed to
 * cudaHostRegister() has already been registered", driver_types.h), even
 * where the bytes do not overlap. */
#define FC_PAGE ((uintptr_t)4096)

static struct fc_host *find_pages(const char *lo, const char *hi) {
  for (struct fc_host *h = hosts; h; h = h->next)
    if (lo < h->hi && hi > h->lo) return h;
  return NULL;
}

static cudaError_t add_host(void *ptr, size_t size, bool allocated, bool read_only) {
  struct fc_host *h = calloc(1, sizeof *h);
  if (!h) return fc_fail(cudaErrorMemoryAllocation);
  char *lo = (char *)((uintptr_t)ptr / FC_PAGE * FC_PAGE);
  char *hi = (char *)(((uintptr_t)ptr + size + FC_PAGE - 1) / FC_PAGE * FC_PAGE);
  *h = (struct fc_host){ptr, size, allocated, read_only, NULL, lo, hi};
  pthread_mutex_lock(&fc.lock);
  bool overlap = find_pages(lo, hi) != NULL;
  if (!overlap) {
    h->next = hosts;
    hosts = h;
  }
  pthread_mutex_unlock(&fc.lock);
  if (overlap) free(h);
  return overlap ? fc_fail(cudaErrorHostMemoryAlreadyRegistered) : cudaSuccess;
}

/* Removes the entry that starts at ptr, if it is of the kind asked. */
static bool remove_host(void *ptr, bool allocated) {
  pthread_mutex_lock(&fc.lock);
  struct fc_host **at = &hosts;
  while (*at && !((*at)->ptr == ptr && (*at)->allocated == allocated)) at = &(*at)->next;
  struct fc_host *h = *at;
  if (h) *at = h->next;
  pthread_mutex_unlock(&fc.lock);
  free(h);
  return h != NULL;
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags) {
  (void)flags;
  if (!fc_need_ctx()) return fc_fail(cudaErrorNoDevice);
  if (fc.host_alloc_fails) return fc_fail(cudaErrorMemoryAllocation);
  size_t rounded = (size + 4095) & ~(size_t)4095;
  *ptr = aligned_alloc(4096, rounded ? rounded : 4096);
  if (!*ptr) return fc_fail(cudaErrorMemoryAllocation);
  cudaError_t e = add_host(*ptr, size ? size : 1, true, false);
  if (e) free(*ptr);
  return e;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
  return cudaHostAlloc(ptr, size, 0);
}

/* Synchronizes the device first, as the runtime's cudaFreeHost does (an
 * implicit device-wide synchronize: every stream's queued work, a pending
 * all-gather included, is waited for, outside any of mlo's watched waits:
 * review D5); counted (fakecuda_free_host_calls). */
cudaError_t cudaFreeHost(void *ptr) {
  if (!ptr) return cudaSuccess;
  pthread_mutex_lock(&fc.lock);
  fc.free_host_calls++;
  pthread_mutex_unlock(&fc.lock);
  cudaError_t e = cudaDeviceSynchronize();
  if (e) return e;
  if (!remove_host(ptr, true)) return fc_fail(cudaErrorInvalidValue);
  free(ptr);
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
  if (!fc_need_ctx()) return fc_fail(cudaErrorNoDevice);
  if (fc.no_host_register) return fc_fail(cudaErrorNotSupported);
  if (!ptr || !size) return fc_fail(cudaErrorInvalidValue);
  return add_host(ptr, size, false, (flags & cudaHostRegisterReadOnly) != 0);
}

cudaError_t cudaHostUnregister(void *ptr) {
  if (!fc_need_ctx()) return fc_fail(cudaErrorNoDevice);
  return remove_host(ptr, false) ? cudaSuccess : fc_fail(cudaErrorHostMemoryNotRegistered);
}

/* The CUDA runtime API (unified addressing, cudaPointerGetAttributes):
 * memory from cudaHostAlloc/cudaMallocHost or registered with
 * cudaHostRegister is cudaMemoryTypeHost, anywhere inside the range;
 * device memory is cudaMemoryTypeDevice; any other pointer is
 * cudaMemoryTypeUnregistered, and the call still returns cudaSuccess (so
 * since CUDA 11.0). */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *ptr) {
  if (!a) return fc_fail(cudaErrorInvalidValue);
  struct CUctx_st *ctx = fc_need_ctx();
  if (!ctx) return fc_fail(cudaErrorNoDevice);
  memset(a, 0, sizeof *a);
  a->device = ctx->device;
  pthread_mutex_lock(&fc.lock);
  struct fc_host *h = find_host(ptr, 1);
  struct fc_block *b = h ? NULL : find_block(ptr, 1);
  if (h) {
    a->type = cudaMemoryTypeHost;
    a->hostPointer = a->devicePointer = (void *)ptr;
  } else if (b && b->state == FC_LIVE) {
    a->type = cudaMemoryTypeDevice;
    a->device = b->device;
    a->devicePointer = (void *)ptr;
  } else {
    a->type = cudaMemoryTypeUnregistered;
  }
  pthread_mutex_unlock(&fc.lock);
  return cudaSuccess;
}

/* Bytes of caller memory registered now (a test helper). */
uint64_t fakecuda_host_registered_bytes(void) {
  uint64_t n = 0;
  pthread_mutex_lock(&fc.lock);
  for (struct fc_host *h = hosts; h; h = h->next)
    if (!h->allocated) n += h->size;
  pthread_mutex_unlock(&fc.lock);
  return n;
}

/* ---- copies ------------------------------------------------------------- */

/* Returns once s has run everything queued on it so far (a marker queued
 * now and waited for, so work queued later by other threads is not waited
 * for); the whole stream where there is no memory for a marker.  fc.lock
 * held. */
static void reach(struct CUstream_st *s) {
  struct fc_op *mark = calloc(1, sizeof *mark);
  struct fc_marker *m = mark ? fc_marker_new() : NULL;
  if (!m) {
    free(mark);
    fc_drain(s);
    return;
  }
  mark->kind = FC_RECORD;
  mark->marker = m;
  m->refs++;
  fc_enqueue(s, mark);
  while (!m->done) pthread_cond_wait(&fc.cond, &fc.lock);
  fc_marker_put(m);
}

/* Queues a copy on s; with `wait`, returns once it has run.  A copy into
 * pageable memory is waited for (the driver's is synchronous).
 *
 * A pageable source (host memory neither allocated page-locked nor
 * registered) is staged by the driver: the runtime API's "API
 * synchronization behavior" says that for transfers between device memory
 * and pageable host memory the async copy "might be synchronous with
 * respect to host", and that "if pageable memory must first be staged to
 * pinned memory, the driver may synchronize with the stream and stage the
 * copy into pinned memory".  The fake takes the documented worst case,
 * which is what a copy larger than the driver's staging buffer meets: the
 * call returns only once the stream has run everything queued before it
 * (a copy behind a cudaStreamWaitEvent holds the calling thread until that
 * event completes, review D8), and the source is snapshotted then. */
static cudaError_t copy_on(struct CUstream_st *s, void *dst, const void *src, size_t n,
                           enum cudaMemcpyKind kind, bool wait) {
  if (!n) return cudaSuccess;
  bool dev_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  bool dev_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  struct fc_op *op = calloc(1, sizeof *op);
  if (!op) return fc_fail(cudaErrorMemoryAllocation);
  *op = (struct fc_op){
      .kind = FC_COPY, .dst = dst, .src = src, .bytes = n, .dev_dst = dev_dst, .dev_src = dev_src};
  pthread_mutex_lock(&fc.lock);
  struct fc_host *h = dev_dst ? NULL : find_host(dst, n);
  if (h && h->read_only) {
    pthread_mutex_unlock(&fc.lock);
    free(op);
    return fc_fail(cudaErrorInvalidValue);
  }
  wait |= !dev_dst && !h;
  bool pageable_src = !dev_src && !find_host(src, n);
  if (pageable_src) {
    reach(s); /* the driver synchronizes with the stream, then stages */
    pthread_mutex_unlock(&fc.lock);
    op->staging = malloc(n);
    if (!op->staging) {
      free(op);
      return fc_fail(cudaErrorMemoryAllocation);
    }
    memcpy(op->staging, src, n);
    pthread_mutex_lock(&fc.lock);
  }
  fc_enqueue(s, op);
  if (wait) reach(s);
  pthread_mutex_unlock(&fc.lock);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  struct CUstream_st *s = fc_stream(stream);
  if (!s) return fc_fail(cudaErrorInvalidResourceHandle);
  cudaError_t st = fc_sticky();
  if (st) return st;
  return copy_on(s, dst, src, count, kind, false);
}

/* On the current device's default stream, returning once done. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  struct CUstream_st *s = fc_stream(NULL);
  if (!s) return fc_fail(cudaErrorNoDevice);
  return copy_on(s, dst, src, count, kind, true);
}

cudaError_t cudaMemset(void *dev, int value, size_t count) {
  struct CUstream_st *s = fc_stream(NULL);
  if (!s) return fc_fail(cudaErrorNoDevice);
  pthread_mutex_lock(&fc.lock);
  fc_drain(s);
  fc_check_device_access(dev, count);
  pthread_mutex_unlock(&fc.lock);
  memset(dev, value, count);
  return cudaSuccess;
}
