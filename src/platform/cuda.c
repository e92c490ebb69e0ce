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
#include "platform/cuda_internal.h"
#include "platform/module.h"

#include <errno.h>
#ifdef MLO_HAVE_NCCL
#include <nccl.h>
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Errors after which the context is unusable (CUDA runtime API, "sticky"
 * errors: the process must exit to recover). */
static bool is_sticky(cudaError_t e) {
  switch (e) {
  case cudaErrorIllegalAddress:
  case cudaErrorLaunchFailure:
  case cudaErrorHardwareStackError:
  case cudaErrorIllegalInstruction:
  case cudaErrorMisalignedAddress:
  case cudaErrorInvalidAddressSpace:
  case cudaErrorInvalidPc:
  case cudaErrorAssert:
  case cudaErrorECCUncorrectable:
  case cudaErrorContextIsDestroyed:
  case cudaErrorLaunchTimeout:
    return true;
  default:
    return false;
  }
}

/* Maps a runtime error to a status.  A non-sticky error is cleared from the
 * thread's last error (it is ours: the call just returned it), so the next
 * unrelated call does not report it again; a sticky one cannot be cleared
 * and is remembered.  Never called with cudaErrorNotReady (not an error:
 * clearing after it would drop an error the user has not read yet). */
static int cuda_status(struct cuda_ctx *c, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return MLO_OK;
  if (is_sticky(e)) {
    pthread_mutex_lock(&c->lock);
    bool first = !c->sticky;
    if (first) {
      c->sticky = true;
      snprintf(c->sticky_msg, sizeof c->sticky_msg, "%s: %s (%s)", what, cudaGetErrorString(e),
               cudaGetErrorName(e));
    }
    pthread_mutex_unlock(&c->lock);
    if (first)
      mlo_logf(MLO_LOG_ERROR,
               "cuda: %s failed: %s (%s); the device context is lost, every "
               "later call fails",
               what, cudaGetErrorString(e), cudaGetErrorName(e));
    return MLO_EPLATFORM;
  }
  (void)cudaGetLastError();
  if (e == cudaErrorMemoryAllocation) {
    mlo_logf(MLO_LOG_INFO, "cuda: %s: device out of memory", what);
    return MLO_ENOMEM_DEVICE;
  }
  mlo_logf(MLO_LOG_ERROR, "cuda: %s failed: %s (%s)", what, cudaGetErrorString(e),
           cudaGetErrorName(e));
  return MLO_EPLATFORM;
}

/* The current context is per host thread and belongs to the caller: every
 * entry point makes our device's primary context current if it is not and
 * puts back exactly what was current on the way out — no context for a
 * thread that had none (cuda_ctx.h: restoring "device 0" there would
 * create a context on GPU 0).  A lost context answers at once. */
static int enter(struct cuda_ctx *c, mlo_cu_guard *g) {
  g->switched = false;
  pthread_mutex_lock(&c->lock);
  bool lost = c->sticky;
  pthread_mutex_unlock(&c->lock);
  if (lost) return MLO_EPLATFORM;
  return cuda_status(c, mlo_cu_ctx_enter(c->primary, g), "making the device's context current");
}

static void leave(struct cuda_ctx *c, const mlo_cu_guard *g) {
  cuda_status(c, mlo_cu_ctx_leave(g), "restoring the caller's context");
}

/* ---- host waits that a sharded load's gather may hold up ----------------

 * A gather (NCCL, on COPY) completes only when every node rank's does: a
 * rank that never gets there, or a fabric error, would hold every host
 * wait behind it forever.  So while a gather may be pending, our host
 * waits poll: the thing waited for, the gather's event, and its
 * communicator's asynchronous error; after the gather's timeout of waiting
 * (the communicator's, mlo_comm_options.timeout_ms) or on an error the
 * communicator is aborted (ncclCommAbort ends what it has in flight) and
 * the wait fails with the reason.  Without a pending gather a wait blocks
 * in the runtime as before (events are BlockingSync: no core spins). */
#ifdef MLO_HAVE_NCCL
static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static bool was_aborted(struct cuda_ctx *c, void *comm) {
  for (int i = 0; i < c->naborted; i++)
    if (c->aborted[i] == comm) return true;
  return false;
}

/* Aborts comm (after a gather failed on it) and remembers why. */
static void abort_gather(struct cuda_ctx *c, void *comm, const char *why) {
  ncclResult_t r = ncclCommAbort((ncclComm_t)comm);
  pthread_mutex_lock(&c->lock);
  if (c->gather_comm == comm) c->gather_comm = NULL;
  if (c->naborted < (int)(sizeof c->aborted / sizeof c->aborted[0]))
    c->aborted[c->naborted++] = comm;
  snprintf(c->gather_msg, sizeof c->gather_msg, "%s; the NCCL communicator was aborted%s", why,
           r == ncclSuccess ? "" : " (ncclCommAbort failed too)");
  pthread_mutex_unlock(&c->lock);
  mlo_logf(MLO_LOG_ERROR, "cuda: a sharded load's all-gather failed: %s", c->gather_msg);
}

/* One look at the pending gather: MLO_OK (none, done, or still in time),
 * or MLO_EPLATFORM once it failed or ran past its timeout since t0_ms (the
 * communicator is then aborted, err says why). */
static int watch_gather(struct cuda_ctx *c, uint64_t t0_ms, char *err, size_t errlen) {
  pthread_mutex_lock(&c->lock);
  void *comm = c->gather_comm;
  unsigned timeout_ms = c->gather_timeout_ms;
  pthread_mutex_unlock(&c->lock);
  if (!comm) return MLO_OK;
  cudaError_t e = cudaEventQuery(c->gather_ev);
  if (e == cudaSuccess) {
    pthread_mutex_lock(&c->lock);
    if (c->gather_comm == comm) c->gather_comm = NULL;
    pthread_mutex_unlock(&c->lock);
    return MLO_OK;
  }
  if (e != cudaErrorNotReady) return cuda_status(c, e, "cudaEventQuery(the gather's event)");
  char why[256] = "";
  ncclResult_t async = ncclSuccess;
  ncclResult_t q = ncclCommGetAsyncError((ncclComm_t)comm, &async);
  if (q != ncclSuccess)
    snprintf(why, sizeof why, "ncclCommGetAsyncError failed: %s", ncclGetErrorString(q));
  else if (async != ncclSuccess && async != ncclInProgress)
    snprintf(why, sizeof why, "NCCL reported an error during the all-gather: %s",
             ncclGetErrorString(async));
  else if (mono_ms() - t0_ms >= timeout_ms)
    snprintf(why, sizeof why,
             "the all-gather did not complete within %.1f s (a node rank is missing, stalled "
             "or at another step)",
             timeout_ms / 1000.0);
  if (!why[0]) return MLO_OK;
  abort_gather(c, comm, why);
  pthread_mutex_lock(&c->lock);
  snprintf(err, errlen, "%s", c->gather_msg);
  pthread_mutex_unlock(&c->lock);
  return MLO_EPLATFORM;
}

static bool gather_pending(struct cuda_ctx *c) {
  pthread_mutex_lock(&c->lock);
  bool pending = c->gather_comm != NULL;
  pthread_mutex_unlock(&c->lock);
  return pending;
}
#endif

/* Waits on the host for an event (ev) or a stream's tail (s), in the
 * caller's context (entered), watching a pending gather as above. */
static int host_wait(struct cuda_ctx *c, cudaEvent_t ev, cudaStream_t s, const char *what,
                     char *err, size_t errlen) {
#ifdef MLO_HAVE_NCCL
  uint64_t t0 = mono_ms();
  while (gather_pending(c)) {
    cudaError_t e = ev ? cudaEventQuery(ev) : cudaStreamQuery(s);
    if (e == cudaSuccess) return MLO_OK;
    if (e != cudaErrorNotReady) return cuda_status(c, e, what);
    char why[400] = "";
    if (watch_gather(c, t0, why, sizeof why)) {
      snprintf(err, errlen, "%s: %s", what, why);
      return MLO_EPLATFORM;
    }
    struct timespec nap = {0, 500000}; /* 0.5 ms */
    nanosleep(&nap, NULL);
  }
#else
  (void)err, (void)errlen;
#endif
  return cuda_status(c, ev ? cudaEventSynchronize(ev) : cudaStreamSynchronize(s), what);
}

static int stream_sync(struct cuda_ctx *c, cudaStream_t s, const char *what) {
  char err[512];
  return host_wait(c, NULL, s, what, err, sizeof err);
}

/* An event: a cudaEvent_t and its completion stamp (event_time). */
struct mlo_event {
  cudaEvent_t e;
  mlo_stamp *stamp; /* when the copy queue reached the last copy-side record */
  pthread_mutex_t lock;
};

/* ---- device blocks ------------------------------------------------------ */

static int cu_dev_alloc(void *ctx, size_t bytes, void **block) {
  struct cuda_ctx *c = ctx;
  *block = NULL;
  mlo_cu_guard g;
  int rc = enter(c, &g);
  if (rc) return rc;
  /* Reserve against the capacity first (capacity= lets a big GPU stand in
   * for a smaller one), so two threads cannot both pass the check. */
  pthread_mutex_lock(&c->lock);
  bool fits = bytes <= c->capacity - c->used;
  if (fits) c->used += bytes;
  pthread_mutex_unlock(&c->lock);
  if (!fits) {
    leave(c, &g);
    return MLO_ENOMEM_DEVICE;
  }
  void *ptr = NULL;
  size_t n = bytes ? bytes : 1;
  cudaError_t e =
      c->pool ? cudaMallocFromPoolAsync(&ptr, n, c->pool, c->copy) : cudaMalloc(&ptr, n);
  if (e == cudaErrorMemoryAllocation && c->pool) {
    /* A block freed with cudaFreeAsync behind queued work may not count as
     * free until the host has seen the free complete: drain the release
     * stream and try once more before calling it out of memory. */
    (void)cudaGetLastError();
    if (stream_sync(c, c->release, "cudaStreamSynchronize(release)") == MLO_OK)
      e = cudaMallocFromPoolAsync(&ptr, n, c->pool, c->copy);
  }
  rc = cuda_status(c, e, "allocating a device block");
  if (!rc) {
    *block = ptr;
  } else {
    pthread_mutex_lock(&c->lock);
    c->used -= bytes;
    pthread_mutex_unlock(&c->lock);
  }
  leave(c, &g);
  return rc;
}

/* The bytes a block held stop counting once its free is queued: a free
 * that fails leaves them held, as they are. */
static int freed(struct cuda_ctx *c, size_t bytes, int rc) {
  if (rc) return rc;
  pthread_mutex_lock(&c->lock);
  c->used -= bytes;
  pthread_mutex_unlock(&c->lock);
  return MLO_OK;
}

/* RELEASE waits for the copy and readback tails (copies either way into
 * or out of the block) and for `used` — the compute tail (every kernel
 * already submitted) for dev_free, the block's own last-use event for
 * dev_free_after — then returns the block to the pool.  No host wait. */
static int release_after(struct cuda_ctx *c, void *block, size_t bytes, cudaEvent_t used) {
  mlo_cu_guard g;
  int rc = enter(c, &g);
  if (rc) return rc;
  if (!c->pool) { /* no stream-ordered allocator: drain, then free */
    stream_sync(c, c->copy, "cudaStreamSynchronize(copy)");
    stream_sync(c, c->readback, "cudaStreamSynchronize(readback)");
    stream_sync(c, c->compute, "cudaStreamSynchronize(compute)");
    rc = freed(c, bytes, cuda_status(c, cudaFree(block), "cudaFree"));
    leave(c, &g);
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
    cuda_status(c, e, "ordering a free");
    stream_sync(c, c->copy, "cudaStreamSynchronize(copy)");
    stream_sync(c, c->readback, "cudaStreamSynchronize(readback)");
    stream_sync(c, c->compute, "cudaStreamSynchronize(compute)");
  }
  rc = freed(c, bytes, cuda_status(c, cudaFreeAsync(block, c->release), "cudaFreeAsync"));
  leave(c, &g);
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
  int rc = enter(c, &g);
  if (rc) return rc;
  size_t f = 0, t = 0;
  rc = cuda_status(c, cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
  uint64_t reserved = 0, used = 0;
  if (!rc && c->pool &&
      cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrReservedMemCurrent, &reserved) ==
          cudaSuccess &&
      cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess &&
      reserved > used)
    f += (size_t)(reserved - used);
  leave(c, &g);
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
  int rc = enter(c, &g);
  if (rc) return rc;
  rc = cuda_status(c, cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrReservedMemHigh, bytes),
                   "cudaMemPoolGetAttribute(ReservedMemHigh)");
  leave(c, &g);
  return rc;
}

/* Setting the high-water attribute to 0 resets it (to the current reserve). */
static void cu_reset_reserved_peak(void *ctx) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  if (!c->pool || enter(c, &g)) return;
  uint64_t zero = 0;
  cuda_status(c, cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReservedMemHigh, &zero),
              "cudaMemPoolSetAttribute(ReservedMemHigh)");
  leave(c, &g);
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
  if (pinned && c->pinned && bytes && !enter(c, &g)) {
    /* Portable: the slab stays pinned for every device and context. */
    cudaError_t e = cudaHostAlloc(ptr, bytes, cudaHostAllocPortable);
    if (e == cudaSuccess) {
      *got_pinned = true;
      leave(c, &g);
      return MLO_OK;
    }
    *ptr = NULL;
    char why[160];
    snprintf(why, sizeof why, "cudaHostAlloc of %zu bytes failed (%s)", bytes,
             cudaGetErrorString(e));
    cuda_status(c, e, "cudaHostAlloc");
    leave(c, &g);
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
  bool in = !enter(c, &g);
  if (in) {
    stream_sync(c, c->copy, "cudaStreamSynchronize(copy)");
    stream_sync(c, c->readback, "cudaStreamSynchronize(readback)");
  }
  if (!pinned)
    free(ptr);
  else
    cuda_status(c, cudaFreeHost(ptr), "cudaFreeHost");
  if (in) leave(c, &g);
}

/* Pins caller-owned memory in place (portable; read-only where core says
 * nothing is ever copied into it and the device supports it: a write-back
 * into memory registered read-only fails).  Best effort. */
static int cu_host_register(void *ctx, void *ptr, size_t bytes, bool read_only) {
  struct cuda_ctx *c = ctx;
  if (!c->pinned || !bytes) return MLO_EUNSUPPORTED;
  mlo_cu_guard g;
  int rc = enter(c, &g);
  if (rc) return rc;
  int ro = 0;
  if (read_only && cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported,
                                          c->device) != cudaSuccess) {
    (void)cudaGetLastError();
    ro = 0;
  }
  unsigned flags = cudaHostRegisterPortable | (ro ? cudaHostRegisterReadOnly : 0);
  cudaError_t e = cudaHostRegister(ptr, bytes, flags);
  if (e != cudaSuccess && is_sticky(e)) {
    rc = cuda_status(c, e, "cudaHostRegister");
  } else if (e != cudaSuccess) { /* not page-aligned, already registered, no room: pageable */
    (void)cudaGetLastError();
    mlo_logf(MLO_LOG_INFO, "cuda: cudaHostRegister of %zu bytes failed (%s): left pageable", bytes,
             cudaGetErrorString(e));
    rc = MLO_EUNSUPPORTED;
  }
  leave(c, &g);
  return rc;
}

static void cu_host_unregister(void *ctx, void *ptr) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  if (enter(c, &g)) return;
  stream_sync(c, c->copy, "cudaStreamSynchronize(copy)");
  cuda_status(c, cudaHostUnregister(ptr), "cudaHostUnregister");
  leave(c, &g);
}

/* ---- copies ------------------------------------------------------------- */

/* Pinned sources copy asynchronously at link speed in any size; the chunk
 * only bounds each call (pageable ones the driver stages through its own
 * buffer, chunked or not, and the call returns once staged). */
static int copy_chunks(struct cuda_ctx *c, cudaStream_t stream, char *dst, const char *src,
                       size_t bytes, enum cudaMemcpyKind kind) {
  mlo_cu_guard g;
  int rc = enter(c, &g);
  if (rc) return rc;
  for (size_t done = 0; !rc && done < bytes; done += c->chunk) {
    size_t n = bytes - done < c->chunk ? bytes - done : c->chunk;
    rc =
        cuda_status(c, cudaMemcpyAsync(dst + done, src + done, n, kind, stream), "cudaMemcpyAsync");
  }
  leave(c, &g);
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

#ifdef MLO_HAVE_NCCL
/* A sharded load's gather, device to device over the node's fabric, on the
 * copy stream: after this rank's slice copy, before the load's event, so
 * compute waits for it as for any copy (C8) and a free waits for it too
 * (C9).  In place, as NCCL allows: the send buffer is this rank's slice of
 * the receive buffer.  gather_ev behind it lets our host waits watch it. */
static int cu_all_gather(void *ctx, void *block, size_t slice, int rank, void *coll,
                         unsigned timeout_ms) {
  struct cuda_ctx *c = ctx;
  pthread_mutex_lock(&c->lock);
  bool dead = was_aborted(c, coll);
  pthread_mutex_unlock(&c->lock);
  if (dead) {
    mlo_logf(MLO_LOG_ERROR, "cuda: all-gather on an aborted NCCL communicator refused (%s)",
             c->gather_msg);
    return MLO_ESTATE;
  }
  mlo_cu_guard g;
  int rc = enter(c, &g);
  if (rc) return rc;
  if (!c->gather_ev)
    rc = cuda_status(c, cudaEventCreateWithFlags(&c->gather_ev, cudaEventDisableTiming),
                     "cudaEventCreate(gather)");
  ncclResult_t r = ncclSuccess;
  if (!rc) {
    r = ncclAllGather((char *)block + (size_t)rank * slice, block, slice, ncclUint8,
                      (ncclComm_t)coll, c->copy);
    if (r == ncclSuccess) {
      pthread_mutex_lock(&c->lock);
      rc = cuda_status(c, cudaEventRecord(c->gather_ev, c->copy), "cudaEventRecord(gather)");
      if (!rc) {
        c->gather_comm = coll;
        c->gather_timeout_ms = timeout_ms ? timeout_ms : 60000u;
      }
      pthread_mutex_unlock(&c->lock);
    }
  }
  leave(c, &g);
  if (rc || r == ncclSuccess) return rc;
  mlo_logf(MLO_LOG_ERROR, "cuda: ncclAllGather of %zu bytes per rank failed: %s", slice,
           ncclGetErrorString(r));
  return MLO_EPLATFORM;
}

/* The communicator must be the node's, in node-rank order, on our device:
 * a larger one would gather past the block, another order would put every
 * rank's slice at another rank's place, silently. */
static int cu_coll_check(void *ctx, void *coll, int ranks, int rank, char *err, size_t errlen) {
  struct cuda_ctx *c = ctx;
  if (!coll) {
    snprintf(err, errlen, "no NCCL communicator");
    return MLO_EINVAL;
  }
  pthread_mutex_lock(&c->lock);
  bool dead = was_aborted(c, coll);
  if (dead)
    snprintf(err, errlen, "the NCCL communicator was aborted after a failed all-gather (%s)",
             c->gather_msg);
  pthread_mutex_unlock(&c->lock);
  if (dead) return MLO_ESTATE;
  int count = -1, me = -1, dev = -1;
  ncclResult_t r = ncclCommCount((ncclComm_t)coll, &count);
  const char *what = "ncclCommCount";
  if (r == ncclSuccess) r = ncclCommUserRank((ncclComm_t)coll, &me), what = "ncclCommUserRank";
  if (r == ncclSuccess) r = ncclCommCuDevice((ncclComm_t)coll, &dev), what = "ncclCommCuDevice";
  if (r != ncclSuccess) {
    snprintf(err, errlen, "the NCCL communicator cannot be checked: %s failed: %s", what,
             ncclGetErrorString(r));
    return MLO_EINVAL;
  }
  char diff[400] = "";
  size_t len = 0;
  if (count != ranks)
    len += (size_t)snprintf(diff + len, sizeof diff - len,
                            "it has %d ranks, this node %d (a gather would write past the "
                            "block)",
                            count, ranks);
  if (me != rank && len < sizeof diff)
    len += (size_t)snprintf(diff + len, sizeof diff - len,
                            "%sit puts this process at rank %d, the node at rank %d (the slices "
                            "would land at other ranks' places)",
                            len ? "; " : "", me, rank);
  if (dev != c->device && len < sizeof diff)
    len += (size_t)snprintf(diff + len, sizeof diff - len,
                            "%sit runs on cuda:%d, this platform on cuda:%d", len ? "; " : "", dev,
                            c->device);
  if (!len) return MLO_OK;
  snprintf(err, errlen,
           "the NCCL communicator is not the node's in node-rank order on this device: %s", diff);
  return MLO_EINVAL;
}

static int nccl_fail(char *err, size_t errlen, const char *what, ncclResult_t r) {
  snprintf(err, errlen, "%s failed: %s", what, ncclGetErrorString(r));
  return MLO_EPLATFORM;
}

static int cu_coll_id(void *ctx, void *id, size_t len, char *err, size_t errlen) {
  (void)ctx;
  if (len < sizeof(ncclUniqueId)) {
    snprintf(err, errlen, "an NCCL id needs %zu bytes, not %zu", sizeof(ncclUniqueId), len);
    return MLO_EINVAL;
  }
  ncclUniqueId u;
  ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess) return nccl_fail(err, errlen, "ncclGetUniqueId", r);
  memcpy(id, &u, sizeof u);
  return MLO_OK;
}

/* On our device: NCCL binds a communicator to the device current when it
 * is made. */
static int cu_coll_init(void *ctx, const void *id, size_t len, int ranks, int rank, void **coll,
                        char *err, size_t errlen) {
  struct cuda_ctx *c = ctx;
  *coll = NULL;
  if (len < sizeof(ncclUniqueId)) {
    snprintf(err, errlen, "an NCCL id needs %zu bytes, not %zu", sizeof(ncclUniqueId), len);
    return MLO_EINVAL;
  }
  ncclUniqueId u;
  memcpy(&u, id, sizeof u);
  mlo_cu_guard g;
  int rc = enter(c, &g);
  if (rc) {
    snprintf(err, errlen, "cuda:%d: the device's context is lost", c->device);
    return rc;
  }
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, ranks, u, rank);
  leave(c, &g);
  if (r != ncclSuccess) return nccl_fail(err, errlen, "ncclCommInitRank", r);
  *coll = comm;
  return MLO_OK;
}

static void cu_coll_destroy(void *ctx, void *coll) {
  struct cuda_ctx *c = ctx;
  pthread_mutex_lock(&c->lock);
  bool dead = false;
  for (int i = 0; i < c->naborted && !dead; i++)
    if (c->aborted[i] == coll) {
      dead = true;
      c->aborted[i] = c->aborted[--c->naborted];
    }
  if (c->gather_comm == coll) c->gather_comm = NULL;
  pthread_mutex_unlock(&c->lock);
  if (dead) return; /* ncclCommAbort freed it */
  mlo_cu_guard g;
  bool in = !enter(c, &g);
  ncclResult_t r = ncclCommDestroy((ncclComm_t)coll);
  if (r != ncclSuccess)
    mlo_logf(MLO_LOG_ERROR, "cuda: ncclCommDestroy failed: %s", ncclGetErrorString(r));
  if (in) leave(c, &g);
}

/* A sharded load's first wait: on the host, watching its gather. */
static int cu_coll_wait(void *ctx, mlo_event *ev, char *err, size_t errlen) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  int rc = enter(c, &g);
  if (rc) {
    snprintf(err, errlen, "cuda:%d: the device's context is lost", c->device);
    return rc;
  }
  rc = host_wait(c, ev->e, NULL, "waiting for a sharded load", err, errlen);
  leave(c, &g);
  return rc;
}
#endif

/* ---- events: a cudaEvent_t and its completion stamp --------------------- */

static int cu_event_create(void *ctx, mlo_event **ev) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  int rc = enter(c, &g);
  if (rc) return rc;
  mlo_event *m = mlo_calloc(1, sizeof *m);
  if (!m) {
    leave(c, &g);
    return MLO_ENOMEM;
  }
  /* BlockingSync: a host waiting on it sleeps instead of spinning a core. */
  rc = cuda_status(c,
                   cudaEventCreateWithFlags(&m->e, cudaEventDisableTiming | cudaEventBlockingSync),
                   "cudaEventCreate");
  leave(c, &g);
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
  bool in = !enter(c, &g);
  if (in) {
    cuda_status(c, cudaEventDestroy(ev->e), "cudaEventDestroy");
    leave(c, &g);
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
  int rc = enter(c, &g);
  if (!rc) rc = cuda_status(c, cudaEventRecord(ev->e, stream), what);
  mlo_stamp *stamp = NULL;
  if (!rc && stamped) {
    stamp = mlo_stamp_new();
    cudaError_t e = stamp ? cudaLaunchHostFunc(stream, stamp_host_fn, stamp) : cudaSuccess;
    if (e != cudaSuccess) {
      cuda_status(c, e, "cudaLaunchHostFunc"); /* a refused launch, unless the context is lost */
      mlo_stamp_put(stamp);
      mlo_stamp_put(stamp);
      stamp = NULL;
    }
  }
  leave(c, &g);
  if (rc || !stamped) return rc;
  pthread_mutex_lock(&ev->lock);
  mlo_stamp *old = ev->stamp;
  ev->stamp = stamp;
  pthread_mutex_unlock(&ev->lock);
  mlo_stamp_put(old);
  return MLO_OK;
}

static int cu_event_record_copy(void *ctx, mlo_event *ev) {
  struct cuda_ctx *c = ctx;
  return record_on(c, ev, c->copy, true, "cudaEventRecord(copy)");
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
  int rc = enter(c, &g);
  if (rc) return rc;
  rc = cuda_status(c, cudaStreamWaitEvent(stream, ev->e, 0), "cudaStreamWaitEvent");
  leave(c, &g);
  return rc;
}

static int cu_compute_wait(void *ctx, mlo_event *ev) {
  struct cuda_ctx *c = ctx;
  return stream_wait(c, c->compute, ev);
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
  int rc = enter(c, &g);
  if (rc) return rc;
  char err[512];
  rc = host_wait(c, ev->e, NULL, "cudaEventSynchronize", err, sizeof err);
  leave(c, &g);
  return rc;
}

/* cudaErrorNotReady is an answer, not an error: nothing is cleared after
 * it (that would drop an error the user's own work left to be read). */
static int cu_event_query(void *ctx, mlo_event *ev) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  int rc = enter(c, &g);
  if (rc) return rc;
  cudaError_t e = cudaEventQuery(ev->e);
  rc = e == cudaErrorNotReady ? MLO_EBUSY : cuda_status(c, e, "cudaEventQuery");
  leave(c, &g);
  return rc;
}

static int cu_synchronize(void *ctx) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  int rc = enter(c, &g);
  if (rc) return rc;
  cudaStream_t streams[] = {c->copy, c->readback, c->compute, c->release};
  for (int i = 0; i < 4 && !rc; i++) rc = stream_sync(c, streams[i], "cudaStreamSynchronize");
  leave(c, &g);
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
  mlo_cu_guard g;
  if (!enter(c, &g)) {
    cudaStream_t streams[] = {c->copy, c->readback, c->compute, c->release};
    for (int i = 0; i < 4; i++)
      if (streams[i]) {
        stream_sync(c, streams[i], "cudaStreamSynchronize");
        if (!(i == 2 && c->compute_external)) cudaStreamDestroy(streams[i]);
      }
    if (c->copy_tail) cudaEventDestroy(c->copy_tail);
    if (c->readback_tail) cudaEventDestroy(c->readback_tail);
    if (c->compute_tail) cudaEventDestroy(c->compute_tail);
    if (c->gather_ev) cudaEventDestroy(c->gather_ev);
    if (c->pool) cudaMemPoolDestroy(c->pool);
    (void)cudaGetLastError();
    leave(c, &g);
  }
  pthread_mutex_destroy(&c->lock);
  free(c);
}

static const struct mlo_platform_ops cuda_ops = {
    .name = "cuda",
    .destroy = cu_destroy,
    .get_caps = cu_get_caps,
    .get_memory = cu_get_memory,
    .reserved_peak = cu_reserved_peak,
    .reset_reserved_peak = cu_reset_reserved_peak,
    .dev_alloc = cu_dev_alloc,
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
    .synchronize = cu_synchronize,
    .compute_queue = cu_compute_queue,
#ifdef MLO_HAVE_NCCL
    .all_gather = cu_all_gather,
    .coll_check = cu_coll_check,
    .coll_id = cu_coll_id,
    .coll_init = cu_coll_init,
    .coll_destroy = cu_coll_destroy,
    .coll_wait = cu_coll_wait,
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
