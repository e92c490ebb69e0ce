/*
 * cuda.c — the CUDA platform: "cuda[:N][:key=value,...]", plain C against
 * the CUDA runtime API.
 *
 * Four non-blocking streams: COPY (loads), READBACK (write-backs, which
 * wait for compute and so must not hold up loads), COMPUTE (the queue
 * users submit their forwards to, exposed by compute_queue; the caller's
 * with stream=) and RELEASE (where device blocks are returned to the
 * pool).  Ordering is done with events, never with a host synchronize
 * (docs/platforms.md has the argument in full):
 *  - a block is allocated from our memory pool ON THE COPY STREAM, so the
 *    copies into it are ordered after the allocation for free, and compute
 *    reaches it only through compute_wait on an event recorded after those
 *    copies;
 *  - a block is freed on the RELEASE stream after that stream waits for the
 *    current tails of COPY and READBACK and for the compute that used it
 *    (the event core recorded at its last release, dev_free_after; the
 *    COMPUTE tail where there is none), so the free is ordered after every
 *    copy and kernel that may touch it, and neither working stream stalls
 *    on the other; a later allocation that reuses the memory gets the
 *    dependency from the pool (cudaMemPoolReuseAllowInternalDependencies).
 * Host slabs are pinned with cudaHostAlloc (portable), falling back to
 * pageable memory with one warning; MLO_NO_PINNED=1 or pinned=0 turn it off.
 */
#include "base/sysio.h"
#include "base/log.h"
#include "platform/cuda_internal.h"
#include "platform/module.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* As cu_enter, for the calls that give things back (destroy, free): after a
 * sticky error they are still made, best effort, so that what the runtime
 * can release it does (their errors are the context's, already said);
 * nothing waits then.  *lost says whether the context was lost. */
static int cu_enter_to_free(struct cuda_ctx *c, mlo_cu_guard *g, bool *lost) {
  g->switched = false;
  pthread_mutex_lock(&c->lock);
  *lost = c->sticky;
  pthread_mutex_unlock(&c->lock);
  if (!*lost) return cu_enter(c, g);
  return mlo_cu_ctx_enter(c->primary, g) == cudaSuccess ? MLO_OK : MLO_EPLATFORM;
}

/* ---- device blocks ------------------------------------------------------ */

/* What a block of `bytes` counts against the capacity: whole granules
 * (UINT64_MAX where that does not fit a size). */
static uint64_t granules(size_t bytes) {
  uint64_t n = bytes ? (uint64_t)bytes : 1;
  return n > UINT64_MAX - CU_GRANULE ? UINT64_MAX : (n + CU_GRANULE - 1) & ~(CU_GRANULE - 1);
}

/* A block from the pool in `on`'s order (COPY for loads, COMPUTE for a
 * workload's scratch, D10). */
static int cu_alloc_on(struct cuda_ctx *c, size_t bytes, void **block, cudaStream_t on) {
  *block = NULL;
  mlo_cu_guard g;
  int rc = cu_enter(c, &g);
  if (rc) return rc;
  /* Reserve against the capacity first (capacity= lets a big GPU stand in
   * for a smaller one), so two threads cannot both pass the check. */
  uint64_t need = granules(bytes);
  pthread_mutex_lock(&c->lock);
  bool fits = need <= c->capacity - c->used;
  if (fits) c->used += need;
  pthread_mutex_unlock(&c->lock);
  if (!fits) {
    cu_leave(c, &g);
    return MLO_ENOMEM_DEVICE;
  }
  void *ptr = NULL;
  size_t n = bytes ? bytes : 1;
  cudaError_t e = c->pool ? cudaMallocFromPoolAsync(&ptr, n, c->pool, on) : cudaMalloc(&ptr, n);
  if (e == cudaErrorMemoryAllocation && c->pool) {
    /* A block freed with cudaFreeAsync behind queued work may not count as
     * free until the host has seen the free complete: drain the release
     * stream.  The pool's idle reserve (freed blocks too small or too
     * scattered for this one) still counts against its maxSize, and the
     * runtime promises to give it back only at cudaMemPoolTrimTo (or a
     * synchronize over the release threshold, which capped is the whole
     * cap): trim it, then try once more before calling it out of memory.
     * What backs live blocks is never released by a trim. */
    (void)cudaGetLastError();
    if (cu_stream_sync(c, c->release, "cudaStreamSynchronize(release)") == MLO_OK &&
        cu_status(c, cudaMemPoolTrimTo(c->pool, 0), "cudaMemPoolTrimTo") == MLO_OK)
      e = cudaMallocFromPoolAsync(&ptr, n, c->pool, on);
  }
  rc = cu_status(c, e, "allocating a device block");
  if (!rc) {
    *block = ptr;
  } else {
    pthread_mutex_lock(&c->lock);
    c->used -= need;
    pthread_mutex_unlock(&c->lock);
  }
  cu_leave(c, &g);
  return rc;
}

static int cu_dev_alloc(void *ctx, size_t bytes, void **block) {
  struct cuda_ctx *c = ctx;
  return cu_alloc_on(c, bytes, block, c->copy);
}

static int cu_dev_alloc_compute(void *ctx, size_t bytes, void **block) {
  struct cuda_ctx *c = ctx;
  return cu_alloc_on(c, bytes, block, c->compute);
}

/* The bytes a block held stop counting once its free is queued: a free
 * that fails leaves them held, as they are. */
static int freed(struct cuda_ctx *c, size_t bytes, int rc) {
  if (rc) return rc;
  pthread_mutex_lock(&c->lock);
  c->used -= granules(bytes);
  pthread_mutex_unlock(&c->lock);
  return MLO_OK;
}

/* RELEASE waits for the copy and readback tails (copies either way into
 * or out of the block) and for `used` — the compute tail (every kernel
 * already submitted) for dev_free, the block's own last-use event for
 * dev_free_after — then returns the block to the pool.  No host wait. */
static int release_after(struct cuda_ctx *c, void *block, size_t bytes, cudaEvent_t used) {
  mlo_cu_guard g;
  int rc = cu_enter(c, &g);
  if (rc) return rc;
  if (!c->pool) { /* no stream-ordered allocator: drain (watched: cudaFree
                   * synchronizes the device, review D5), then free */
    cu_gather_settle(c);
    cu_stream_sync(c, c->copy, "cudaStreamSynchronize(copy)");
    cu_stream_sync(c, c->readback, "cudaStreamSynchronize(readback)");
    cu_stream_sync(c, c->compute, "cudaStreamSynchronize(compute)");
    rc = freed(c, bytes, cu_status(c, cudaFree(block), "cudaFree"));
    cu_leave(c, &g);
    return rc;
  }
  pthread_mutex_lock(&c->lock);
  cudaError_t e = cudaEventRecord(c->copy_tail, c->copy);
  if (e == cudaSuccess) e = cudaEventRecord(c->readback_tail, c->readback);
  if (e == cudaSuccess && !used) e = cudaEventRecord(c->compute_tail, c->compute);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(c->release, c->copy_tail, 0);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(c->release, c->readback_tail, 0);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(c->release, used ? used : c->compute_tail, 0);
  pthread_mutex_unlock(&c->lock);
  if (e != cudaSuccess) {
    /* Could not order it: leaking is wrong, freeing early is worse. */
    cu_status(c, e, "ordering a free");
    cu_stream_sync(c, c->copy, "cudaStreamSynchronize(copy)");
    cu_stream_sync(c, c->readback, "cudaStreamSynchronize(readback)");
    cu_stream_sync(c, c->compute, "cudaStreamSynchronize(compute)");
  }
  rc = freed(c, bytes, cu_status(c, cudaFreeAsync(block, c->release), "cudaFreeAsync"));
  cu_leave(c, &g);
  return rc;
}

static int cu_dev_free(void *ctx, void *block, size_t bytes) {
  return release_after(ctx, block, bytes, NULL);
}

/* After the block's last use (core's event, recorded at its last release),
 * not after compute queued since: a prefetch into this memory overlaps
 * the current forward (issue 25, item 7). */
static int cu_dev_free_after(void *ctx, void *block, size_t bytes, mlo_event *used) {
  return release_after(ctx, block, bytes, used->e);
}

/* Free memory as the device sees it, plus what our pool holds in reserve
 * (freed blocks it keeps for reuse, which cudaMemGetInfo counts as used). */
static int cu_get_memory(void *ctx, uint64_t *total, uint64_t *free_bytes) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  int rc = cu_enter(c, &g);
  if (rc) return rc;
  size_t f = 0, t = 0;
  rc = cu_status(c, cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
  uint64_t reserved = 0, used = 0;
  if (!rc && c->pool &&
      cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrReservedMemCurrent, &reserved) ==
          cudaSuccess &&
      cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess &&
      reserved > used)
    f += (size_t)(reserved - used);
  cu_leave(c, &g);
  if (rc) return rc;
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

/* The pool's reserve high-water mark: what the device really gave us,
 * which capacity= bounds through the pool's maxSize. */
static int cu_reserved_peak(void *ctx, uint64_t *bytes) {
  struct cuda_ctx *c = ctx;
  if (!c->pool) return MLO_EUNSUPPORTED;
  mlo_cu_guard g;
  int rc = cu_enter(c, &g);
  if (rc) return rc;
  rc = cu_status(c, cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrReservedMemHigh, bytes),
                 "cudaMemPoolGetAttribute(ReservedMemHigh)");
  cu_leave(c, &g);
  return rc;
}

/* Setting the high-water attribute to 0 resets it (to the current reserve). */
static void cu_reset_reserved_peak(void *ctx) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  if (!c->pool || cu_enter(c, &g)) return;
  uint64_t zero = 0;
  cu_status(c, cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReservedMemHigh, &zero),
            "cudaMemPoolSetAttribute(ReservedMemHigh)");
  cu_leave(c, &g);
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
  mlo_cu_guard g;
  if (pinned && c->pinned && bytes && !cu_enter(c, &g)) {
    /* Portable: the slab stays pinned for every device and context. */
    cudaError_t e = cudaHostAlloc(ptr, bytes, cudaHostAllocPortable);
    if (e == cudaSuccess) {
      *got_pinned = true;
      cu_leave(c, &g);
      return MLO_OK;
    }
    *ptr = NULL;
    char why[160];
    /* cudaErrorMemoryAllocation here is the host's page-locked memory
     * running out (the OS limit, RLIMIT_MEMLOCK), not the device's:
     * cu_status would log it as device out of memory. */
    bool host_oom = e == cudaErrorMemoryAllocation;
    snprintf(why, sizeof why, "cudaHostAlloc of %zu bytes failed (%s)", bytes,
             host_oom ? "out of page-locked host memory" : cudaGetErrorString(e));
    if (host_oom)
      (void)cudaGetLastError(); /* ours: the call just returned it */
    else
      cu_status(c, e, "cudaHostAlloc");
    cu_leave(c, &g);
    warn_pageable_once(c, why);
  }
  size_t rounded = (bytes + 4095) & ~(size_t)4095;
  if (rounded < bytes) return MLO_ENOMEM;
  *ptr = mlo_aligned_alloc(4096, rounded ? rounded : 4096);
  return *ptr ? MLO_OK : MLO_ENOMEM;
}

/* cudaFreeHost does not wait for copies still reading the buffer (it is no
 * synchronization), and neither does free: both copy streams drain first,
 * for pageable buffers too (a copy stages from them asynchronously). */
static void cu_host_free(void *ctx, void *ptr, size_t bytes, bool pinned) {
  struct cuda_ctx *c = ctx;
  (void)bytes;
  mlo_cu_guard g;
  bool in = !cu_enter(c, &g);
  if (in) {
    cu_stream_sync(c, c->copy, "cudaStreamSynchronize(copy)");
    cu_stream_sync(c, c->readback, "cudaStreamSynchronize(readback)");
    /* cudaFreeHost synchronizes the whole device: whatever it would wait
     * for, a pending all-gather and the kernels behind it, is waited for
     * here first, where a stalled gather is watched and given up on
     * (review D5) */
    if (pinned) {
      cu_gather_settle(c);
      cu_stream_sync(c, c->compute, "cudaStreamSynchronize(compute)");
    }
  }
  if (!pinned)
    free(ptr);
  else
    cu_status(c, cudaFreeHost(ptr), "cudaFreeHost");
  if (in) cu_leave(c, &g);
}

/* A range its owner page-locked (registered here as if by us, never
 * unregistered by us), remembered until its unregister; lock held. */
static int add_foreign(struct cuda_ctx *c, void *ptr) {
  if (c->nforeign == c->foreign_cap) {
    size_t cap = c->foreign_cap ? 2 * c->foreign_cap : 16;
    void **grown = mlo_realloc(c->foreign, cap * sizeof *grown);
    if (!grown) return MLO_ENOMEM;
    c->foreign = grown;
    c->foreign_cap = cap;
  }
  c->foreign[c->nforeign++] = ptr;
  return MLO_OK;
}

static bool take_foreign(struct cuda_ctx *c, void *ptr) {
  pthread_mutex_lock(&c->lock);
  bool found = false;
  for (size_t i = 0; i < c->nforeign && !found; i++)
    if (c->foreign[i] == ptr) {
      found = true;
      c->foreign[i] = c->foreign[--c->nforeign];
    }
  pthread_mutex_unlock(&c->lock);
  return found;
}

/* Pins caller-owned memory in place (portable; read-only where core says
 * nothing is ever copied into it and the device supports it: a write-back
 * into memory registered read-only fails).  Best effort.  Memory its owner
 * page-locked already (torch's pin_memory(), cudaHostAlloc) copies at link
 * speed as it is: it counts as pinned, and is neither registered (the
 * runtime would refuse, cudaErrorHostMemoryAlreadyRegistered) nor, later,
 * unregistered (it is not ours to unpin). */
static int cu_host_register(void *ctx, void *ptr, size_t bytes, bool read_only) {
  struct cuda_ctx *c = ctx;
  if (!c->pinned || !bytes) return MLO_EUNSUPPORTED;
  mlo_cu_guard g;
  int rc = cu_enter(c, &g);
  if (rc) return rc;
  if (cu_page_locked(ptr, bytes)) {
    pthread_mutex_lock(&c->lock);
    rc = add_foreign(c, ptr);
    pthread_mutex_unlock(&c->lock);
    cu_leave(c, &g);
    return rc;
  }
  int ro = 0;
  if (read_only && cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported,
                                          c->device) != cudaSuccess) {
    (void)cudaGetLastError();
    ro = 0;
  }
  unsigned flags = cudaHostRegisterPortable | (ro ? cudaHostRegisterReadOnly : 0);
  cudaError_t e = cudaHostRegister(ptr, bytes, flags);
  if (e != cudaSuccess && cu_is_sticky(e)) {
    rc = cu_status(c, e, "cudaHostRegister");
  } else if (e != cudaSuccess) { /* not page-aligned, already registered, no room: pageable */
    (void)cudaGetLastError();
    mlo_logf(MLO_LOG_INFO, "cuda: cudaHostRegister of %zu bytes failed (%s): left pageable", bytes,
             cudaGetErrorString(e));
    rc = MLO_EUNSUPPORTED;
  }
  cu_leave(c, &g);
  return rc;
}

static void cu_host_unregister(void *ctx, void *ptr) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  if (cu_enter(c, &g)) return;
  /* copies from it (loads) and into it (write-backs into a slab pinned
   * in place) may still be queued */
  cu_stream_sync(c, c->copy, "cudaStreamSynchronize(copy)");
  cu_stream_sync(c, c->readback, "cudaStreamSynchronize(readback)");
  if (!take_foreign(c, ptr)) cu_status(c, cudaHostUnregister(ptr), "cudaHostUnregister");
  cu_leave(c, &g);
}

/* ---- copies ------------------------------------------------------------- */

/* Pinned sources copy asynchronously at link speed in any size; the chunk
 * only bounds each call.  A pageable source of a load goes through the
 * staging ring (cuda_bounce.c), so that the calling thread never waits for
 * the copy stream (review D8); where there is no ring, the driver stages
 * it through its own buffer, chunked or not, and the call returns once
 * staged. */
static int copy_chunks(struct cuda_ctx *c, cudaStream_t stream, char *dst, const char *src,
                       size_t bytes, enum cudaMemcpyKind kind) {
  mlo_cu_guard g;
  int rc = cu_enter(c, &g);
  if (rc) return rc;
  if (kind == cudaMemcpyHostToDevice) {
    rc = cu_bounce_h2d(c, dst, src, bytes);
    if (rc != MLO_EUNSUPPORTED) {
      cu_leave(c, &g);
      return rc;
    }
    rc = MLO_OK;
  }
  for (size_t done = 0; !rc && done < bytes; done += c->chunk) {
    size_t n = bytes - done < c->chunk ? bytes - done : c->chunk;
    rc = cu_status(c, cudaMemcpyAsync(dst + done, src + done, n, kind, stream), "cudaMemcpyAsync");
  }
  cu_leave(c, &g);
  return rc;
}

static int cu_copy_h2d(void *ctx, void *block, size_t offset, const void *src, size_t bytes) {
  struct cuda_ctx *c = ctx;
  return copy_chunks(c, c->copy, (char *)block + offset, src, bytes, cudaMemcpyHostToDevice);
}

static int cu_copy_d2h(void *ctx, void *dst, const void *block, size_t offset, size_t bytes) {
  struct cuda_ctx *c = ctx;
  return copy_chunks(c, c->readback, dst, (const char *)block + offset, bytes,
                     cudaMemcpyDeviceToHost);
}

/* ---- events: a cudaEvent_t and its completion stamp --------------------- */

static int cu_event_create(void *ctx, mlo_event **ev) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  int rc = cu_enter(c, &g);
  if (rc) return rc;
  mlo_event *m = mlo_calloc(1, sizeof *m);
  if (!m) {
    cu_leave(c, &g);
    return MLO_ENOMEM;
  }
  /* BlockingSync: a host waiting on it sleeps instead of spinning a core. */
  rc = cu_status(c, cudaEventCreateWithFlags(&m->e, cudaEventDisableTiming | cudaEventBlockingSync),
                 "cudaEventCreate");
  cu_leave(c, &g);
  if (rc) {
    free(m);
    return rc;
  }
  pthread_mutex_init(&m->lock, NULL);
  *ev = m;
  return MLO_OK;
}

static void cu_event_destroy(void *ctx, mlo_event *ev) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  bool lost;
  bool in = !cu_enter_to_free(c, &g, &lost);
  if (in) {
    if (lost)
      (void)cudaEventDestroy(ev->e);
    else
      cu_status(c, cudaEventDestroy(ev->e), "cudaEventDestroy");
    cu_leave(c, &g);
  }
  mlo_stamp_put(ev->stamp);
  pthread_mutex_destroy(&ev->lock);
  free(ev);
}

/* Runs on a driver thread once the copy stream reaches it; only records. */
static void CUDART_CB stamp_host_fn(void *user) {
  mlo_stamp_fire(user);
}

/* Records on a stream; with `stamped`, also a host function behind it that
 * notes the completion time, for traces (best effort: no stamp, unknown). */
static int record_on(struct cuda_ctx *c, mlo_event *ev, cudaStream_t stream, bool stamped,
                     const char *what) {
  mlo_cu_guard g;
  int rc = cu_enter(c, &g);
  if (!rc) {
    /* numbered with the record, under the lock a gather's record takes:
     * what compute_wait compares with a pending gather's number */
    pthread_mutex_lock(&c->lock);
    cudaError_t e = cudaEventRecord(ev->e, stream);
    if (e == cudaSuccess)
      ev->copy_seq = stream == c->copy ? ++c->copy_records : stream == c->readback ? UINT64_MAX : 0;
    pthread_mutex_unlock(&c->lock);
    rc = cu_status(c, e, what);
  }
  mlo_stamp *stamp = NULL;
  if (!rc && stamped) {
    stamp = mlo_stamp_new();
    cudaError_t e = stamp ? cudaLaunchHostFunc(stream, stamp_host_fn, stamp) : cudaSuccess;
    if (e != cudaSuccess) {
      cu_status(c, e, "cudaLaunchHostFunc"); /* a refused launch, unless the context is lost */
      mlo_stamp_put(stamp);
      mlo_stamp_put(stamp);
      stamp = NULL;
    }
  }
  cu_leave(c, &g);
  if (rc || !stamped) return rc;
  pthread_mutex_lock(&ev->lock);
  mlo_stamp *old = ev->stamp;
  ev->stamp = stamp;
  pthread_mutex_unlock(&ev->lock);
  mlo_stamp_put(old);
  return MLO_OK;
}

/* Stamped only while a trace wants it (want_stamps) or the INFO log is on
 * (its "loaded" line times the load by the stamp): cudaLaunchHostFunc
 * holds the copy stream until the driver's callback thread has run it, a
 * bubble per record that small blocks feel; event_time answers
 * MLO_EUNSUPPORTED without one, and core uses its own clock. */
static int cu_event_record_copy(void *ctx, mlo_event *ev) {
  struct cuda_ctx *c = ctx;
  pthread_mutex_lock(&c->lock);
  bool stamped = c->stamp_users > 0;
  pthread_mutex_unlock(&c->lock);
  stamped = stamped || mlo_log_enabled(MLO_LOG_INFO);
  return record_on(c, ev, c->copy, stamped, "cudaEventRecord(copy)");
}

static void cu_want_stamps(void *ctx, int delta) {
  struct cuda_ctx *c = ctx;
  pthread_mutex_lock(&c->lock);
  c->stamp_users += delta;
  pthread_mutex_unlock(&c->lock);
}

static int cu_event_record_readback(void *ctx, mlo_event *ev) {
  struct cuda_ctx *c = ctx;
  return record_on(c, ev, c->readback, false, "cudaEventRecord(readback)");
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
  return record_on(c, ev, c->compute, false, "cudaEventRecord(compute)");
}

static int stream_wait(struct cuda_ctx *c, cudaStream_t stream, mlo_event *ev) {
  mlo_cu_guard g;
  int rc = cu_enter(c, &g);
  if (rc) return rc;
  rc = cu_status(c, cudaStreamWaitEvent(stream, ev->e, 0), "cudaStreamWaitEvent");
  cu_leave(c, &g);
  return rc;
}

static int cu_compute_wait(void *ctx, mlo_event *ev) {
  struct cuda_ctx *c = ctx;
  /* compute must not queue behind a gather that nobody watches: a load's
   * copies (a replicated one's, a streamed block's) may follow one on
   * COPY.  Only an event recorded after a pending gather can: one recorded
   * before (a block of the running forward while a sharded prefetch
   * gathers) is waited for without holding the host (docs/distributed.md:
   * prefetches still overlap). */
  pthread_mutex_lock(&c->lock);
  uint64_t seq = ev->copy_seq;
  pthread_mutex_unlock(&c->lock);
  int rc = MLO_OK;
  if (cu_gather_before(c, seq)) {
    mlo_cu_guard g;
    rc = cu_enter(c, &g);
    if (!rc) {
      pthread_mutex_lock(&c->lock);
      c->gather_settles++;
      pthread_mutex_unlock(&c->lock);
      rc = cu_gather_settle(c);
      cu_leave(c, &g);
    }
  }
  return rc ? rc : stream_wait(c, c->compute, ev);
}

static int cu_copy_wait(void *ctx, mlo_event *ev) {
  struct cuda_ctx *c = ctx;
  return stream_wait(c, c->copy, ev);
}

static int cu_readback_wait(void *ctx, mlo_event *ev) {
  struct cuda_ctx *c = ctx;
  return stream_wait(c, c->readback, ev);
}

static int cu_event_sync(void *ctx, mlo_event *ev) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  int rc = cu_enter(c, &g);
  if (rc) return rc;
  char err[512];
  rc = cu_host_wait(c, ev->e, NULL, "cudaEventSynchronize", err, sizeof err);
  cu_leave(c, &g);
  return rc;
}

static int cu_event_query(void *ctx, mlo_event *ev) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  int rc = cu_enter(c, &g);
  if (rc) return rc;
  cudaError_t e = cu_query(ev->e, NULL);
  rc = e == cudaErrorNotReady ? MLO_EBUSY : cu_status(c, e, "cudaEventQuery");
  cu_leave(c, &g);
  return rc;
}

static int cu_synchronize(void *ctx) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  int rc = cu_enter(c, &g);
  if (rc) return rc;
  cudaStream_t streams[] = {c->copy, c->readback, c->compute, c->release};
  for (int i = 0; i < 4 && !rc; i++) rc = cu_stream_sync(c, streams[i], "cudaStreamSynchronize");
  cu_leave(c, &g);
  return rc;
}

static void *cu_compute_queue(void *ctx) {
  return ((struct cuda_ctx *)ctx)->compute;
}

/* The context every entry point enters: where the legacy default stream
 * (stream=0, compute NULL) is the one compute_wait and frees order on. */
static void *cu_compute_context(void *ctx) {
  return ((struct cuda_ctx *)ctx)->primary;
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
  mlo_cu_guard g;
  bool lost;
  if (!cu_enter_to_free(c, &g, &lost)) {
    cudaStream_t streams[] = {c->copy, c->readback, c->compute, c->release};
    for (int i = 0; i < 4; i++)
      if (streams[i]) {
        if (!lost) cu_stream_sync(c, streams[i], "cudaStreamSynchronize");
        if (!(i == 2 && c->compute_external)) cudaStreamDestroy(streams[i]);
      }
    if (c->copy_tail) cudaEventDestroy(c->copy_tail);
    if (c->readback_tail) cudaEventDestroy(c->readback_tail);
    if (c->compute_tail) cudaEventDestroy(c->compute_tail);
    if (c->gather_ev) cudaEventDestroy(c->gather_ev);
    cu_bounce_destroy(c, lost); /* after COPY drained: its last copies read the ring */
    if (c->pool) cudaMemPoolDestroy(c->pool);
    (void)cudaGetLastError();
    cu_leave(c, &g);
  }
  free(c->foreign);
  pthread_mutex_destroy(&c->bounce_lock);
  pthread_mutex_destroy(&c->nccl_lock);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

#ifdef MLO_HAVE_NCCL
static const struct mlo_platform_coll_ops cuda_coll_ops = {
    .gather = cu_all_gather,
    .check = cu_coll_check,
    .id = cu_coll_id,
    .init = cu_coll_init,
    .destroy = cu_coll_destroy,
    .wait = cu_coll_wait,
};
#endif

static const struct mlo_platform_ops cuda_ops = {
    .name = "cuda",
    .destroy = cu_destroy,
    .get_caps = cu_get_caps,
    .get_memory = cu_get_memory,
    .reserved_peak = cu_reserved_peak,
    .reset_reserved_peak = cu_reset_reserved_peak,
    .dev_alloc = cu_dev_alloc,
    .dev_alloc_compute = cu_dev_alloc_compute,
    .dev_free = cu_dev_free,
    .dev_free_after = cu_dev_free_after,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .host_register = cu_host_register,
    .host_unregister = cu_host_unregister,
    .copy_h2d = cu_copy_h2d,
    .copy_d2h = cu_copy_d2h,
    .event_create = cu_event_create,
    .event_destroy = cu_event_destroy,
    .event_record_copy = cu_event_record_copy,
    .event_record_compute = cu_event_record_compute,
    .compute_wait = cu_compute_wait,
    .copy_wait = cu_copy_wait,
    .event_record_readback = cu_event_record_readback,
    .readback_wait = cu_readback_wait,
    .event_sync = cu_event_sync,
    .event_query = cu_event_query,
    .event_time = cu_event_time,
    .want_stamps = cu_want_stamps,
    .synchronize = cu_synchronize,
    .compute_queue = cu_compute_queue,
    .compute_context = cu_compute_context,
#ifdef MLO_HAVE_NCCL
    .coll = &cuda_coll_ops,
#endif
};

static int mlo_cuda_platform_create(const char *spec_args, mlo_platform *p, char *err,
                                    size_t errlen) {
  struct cuda_options opt = {.index = 0, .pinned = -1, .chunk = DEFAULT_CHUNK};
  int rc = cu_parse_spec(spec_args ? spec_args : "", &opt, err, errlen);
  if (!rc) rc = cu_find_device(opt.index, err, errlen);
  if (rc) return rc;
  struct cuda_ctx *c = mlo_calloc(1, sizeof *c);
  if (!c) return MLO_ENOMEM;
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_init(&c->nccl_lock, NULL);
  pthread_mutex_init(&c->bounce_lock, NULL);
  c->device = (int)opt.index;
  c->chunk = (size_t)opt.chunk;
  c->capacity = opt.capacity;
  c->compute = (cudaStream_t)opt.stream;
  c->compute_external = opt.stream_given; /* 0: the legacy default stream */
  /* The environment is a kill switch: it wins over pinned=1. */
  c->pinned = opt.pinned != 0 && !mlo_env_flag("MLO_NO_PINNED");
  rc = cu_create_streams(c, err, errlen);
  if (rc) {
    cu_destroy(c);
    return rc;
  }
  cu_describe(c, p);
  p->ops = &cuda_ops;
  p->ctx = c;
  return MLO_OK;
}

/* The module's description (module.h): libmlo-cuda.so is this file. */
MLO_MODULE_DEFINE_PLATFORM("cuda", mlo_cuda_platform_create);
