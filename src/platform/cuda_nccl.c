/*
 * cuda_nccl.c — the CUDA platform's part in a node's collectives: a
 * sharded load's all-gather over NCCL, the checks that a communicator is
 * the node's, the communicator mlo makes for the tool (its id, init and
 * destroy), and the host waits that watch a pending gather, so that a rank
 * that never arrives or a fabric error ends in an error within the
 * communicator's timeout instead of a wait that lasts forever
 * (docs/distributed.md).  Without NCCL only the waits are here, and they
 * block in the runtime.
 */
#include "base/log.h"
#include "platform/cuda_internal.h"

#ifdef MLO_HAVE_NCCL
#include <nccl.h>
#endif
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

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

/* A call on a non-blocking communicator (every one mlo makes: cu_coll_init)
 * may return ncclInProgress: NCCL's user guide (communicators, the
 * "blocking" config option) says the operation is then still being
 * issued, and the caller must poll ncclCommGetAsyncError until it no
 * longer answers ncclInProgress before using the communicator again (a
 * collective is enqueued on its stream only then).  Polls for at most
 * timeout_ms; returns the final state: ncclSuccess, an error, or
 * ncclInProgress after the timeout.  Counted in c->nccl_in_progress (a
 * test's evidence that the poll ran). */
static ncclResult_t nccl_settle(struct cuda_ctx *c, ncclComm_t comm, ncclResult_t r,
                                unsigned timeout_ms) {
  if (r != ncclInProgress || !comm) return r;
  pthread_mutex_lock(&c->lock);
  c->nccl_in_progress++;
  pthread_mutex_unlock(&c->lock);
  uint64_t t0 = mono_ms();
  unsigned limit = timeout_ms ? timeout_ms : 60000u;
  for (;;) {
    ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) return q;
    if (r != ncclInProgress || mono_ms() - t0 >= limit) return r;
    struct timespec nap = {0, 100000}; /* 0.1 ms */
    nanosleep(&nap, NULL);
  }
}

/* Aborts comm (after a gather failed on it) and remembers why; nccl_lock
 * held (not while another thread enqueues on it).  ncclCommAbort frees
 * the communicator: nothing may be asked of it afterwards, so its
 * ncclInProgress is not polled (it is no failure). */
static void abort_gather_locked(struct cuda_ctx *c, void *comm, const char *why) {
  ncclResult_t r = ncclCommAbort((ncclComm_t)comm);
  if (r == ncclInProgress) r = ncclSuccess;
  pthread_mutex_lock(&c->lock);
  if (c->gather_comm == comm) c->gather_comm = NULL;
  if (c->naborted < (int)(sizeof c->aborted / sizeof c->aborted[0]))
    c->aborted[c->naborted++] = comm;
  snprintf(c->gather_msg, sizeof c->gather_msg, "%s; the NCCL communicator was aborted%s", why,
           r == ncclSuccess ? "" : " (ncclCommAbort failed too)");
  pthread_mutex_unlock(&c->lock);
  mlo_logf(MLO_LOG_ERROR, "cuda: a sharded load's all-gather failed: %s", c->gather_msg);
}

static void abort_gather(struct cuda_ctx *c, void *comm, const char *why) {
  pthread_mutex_lock(&c->nccl_lock);
  abort_gather_locked(c, comm, why);
  pthread_mutex_unlock(&c->nccl_lock);
}

/* One look at the pending gather: MLO_OK (none, done, or still in time),
 * or MLO_EPLATFORM once it failed or ran past its timeout since t0_ms (the
 * communicator is then aborted, err says why). */
static int watch_gather(struct cuda_ctx *c, uint64_t t0_ms, char *err, size_t errlen) {
  pthread_mutex_lock(&c->lock);
  void *comm = c->gather_comm;
  uint64_t seq = c->gather_seq;
  unsigned timeout_ms = c->gather_timeout_ms;
  pthread_mutex_unlock(&c->lock);
  if (!comm) return MLO_OK;
  cudaError_t e = cu_query(c->gather_ev, NULL);
  if (e == cudaSuccess) { /* that gather is done; one recorded since is still watched */
    pthread_mutex_lock(&c->lock);
    if (c->gather_comm == comm && c->gather_seq == seq) c->gather_comm = NULL;
    pthread_mutex_unlock(&c->lock);
    return MLO_OK;
  }
  if (e != cudaErrorNotReady) return cu_status(c, e, "cudaEventQuery(the gather's event)");
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
int cu_host_wait(struct cuda_ctx *c, cudaEvent_t ev, cudaStream_t s, const char *what, char *err,
                 size_t errlen) {
#ifdef MLO_HAVE_NCCL
  uint64_t t0 = mono_ms();
  while (gather_pending(c)) {
    cudaError_t e = cu_query(ev, s);
    if (e == cudaSuccess) return MLO_OK;
    if (e != cudaErrorNotReady) return cu_status(c, e, what);
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
  return cu_status(c, ev ? cudaEventSynchronize(ev) : cudaStreamSynchronize(s), what);
}

int cu_stream_sync(struct cuda_ctx *c, cudaStream_t s, const char *what) {
  char err[512];
  return cu_host_wait(c, NULL, s, what, err, sizeof err);
}

bool cu_gather_before(struct cuda_ctx *c, uint64_t copy_seq) {
#ifdef MLO_HAVE_NCCL
  pthread_mutex_lock(&c->lock);
  bool after = c->gather_comm && copy_seq > c->gather_first;
  pthread_mutex_unlock(&c->lock);
  return after;
#else
  (void)c, (void)copy_seq;
  return false;
#endif
}

int cu_gather_settle(struct cuda_ctx *c) {
#ifdef MLO_HAVE_NCCL
  if (!gather_pending(c)) return MLO_OK;
  char err[512] = "";
  int rc = cu_host_wait(c, c->gather_ev, NULL, "waiting for a pending all-gather", err, sizeof err);
  /* done: one more look clears the mark (its event has completed), so
   * later waits block in the runtime again instead of polling */
  if (!rc) rc = watch_gather(c, mono_ms(), err, sizeof err);
  if (rc && err[0]) mlo_logf(MLO_LOG_ERROR, "cuda: %s", err);
  return rc;
#else
  (void)c;
  return MLO_OK;
#endif
}

#ifdef MLO_HAVE_NCCL
/* A sharded load's gather, device to device over the node's fabric, on the
 * copy stream: after this rank's slice copy, before the load's event, so
 * compute waits for it as for any copy (C8) and a free waits for it too
 * (C9).  In place, as NCCL allows: the send buffer is this rank's slice of
 * the receive buffer.  gather_ev behind it lets our host waits watch it. */
int cu_all_gather(void *ctx, void *block, size_t offset, size_t slice, int rank, void *coll,
                  unsigned timeout_ms) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  int rc = cu_enter(c, &g);
  if (rc) return rc;
  pthread_mutex_lock(&c->nccl_lock); /* an abort waits for the enqueue, or goes first */
  pthread_mutex_lock(&c->lock);
  bool dead = was_aborted(c, coll);
  char why[sizeof c->gather_msg];
  snprintf(why, sizeof why, "%s", c->gather_msg);
  pthread_mutex_unlock(&c->lock);
  if (dead) {
    pthread_mutex_unlock(&c->nccl_lock);
    cu_leave(c, &g);
    mlo_logf(MLO_LOG_ERROR, "cuda: all-gather on an aborted NCCL communicator refused (%s)", why);
    return MLO_ESTATE;
  }
  if (!c->gather_ev)
    rc = cu_status(c, cudaEventCreateWithFlags(&c->gather_ev, cudaEventDisableTiming),
                   "cudaEventCreate(gather)");
  ncclResult_t r = ncclSuccess;
  if (!timeout_ms) timeout_ms = 60000u;
  if (!rc) {
    char *region = (char *)block + offset; /* a block is its device pointer */
    r = ncclAllGather(region + (size_t)rank * slice, region, slice, ncclUint8, (ncclComm_t)coll,
                      c->copy);
    /* on mlo's non-blocking communicators: issued once the state settles;
     * only then is the event behind it recorded */
    bool issuing = r == ncclInProgress;
    r = nccl_settle(c, (ncclComm_t)coll, r, timeout_ms);
    if (issuing && r != ncclSuccess) {
      /* may be half issued: ended by an abort, as a failed gather is */
      char failed[256];
      snprintf(failed, sizeof failed, "ncclAllGather of %zu bytes per rank %s", slice,
               r == ncclInProgress ? "was still being issued after the timeout"
                                   : ncclGetErrorString(r));
      abort_gather_locked(c, coll, failed);
    }
    if (r == ncclSuccess) {
      /* recorded and published together, so a watch sees this gather's
       * event with its communicator (cu_status after the lock: a sticky
       * error takes the lock itself) */
      pthread_mutex_lock(&c->lock);
      cudaError_t e = cudaEventRecord(c->gather_ev, c->copy);
      if (e == cudaSuccess) {
        c->copy_records++;
        if (!c->gather_comm) c->gather_first = c->copy_records;
        c->gather_comm = coll;
        c->gather_seq++;
        c->gather_timeout_ms = timeout_ms;
      }
      pthread_mutex_unlock(&c->lock);
      rc = cu_status(c, e, "cudaEventRecord(gather)");
    }
  }
  pthread_mutex_unlock(&c->nccl_lock);
  cu_leave(c, &g);
  if (rc || r == ncclSuccess) return rc;
  mlo_logf(MLO_LOG_ERROR, "cuda: ncclAllGather of %zu bytes per rank failed: %s", slice,
           ncclGetErrorString(r));
  return MLO_EPLATFORM;
}

/* The communicator must be the node's, in node-rank order, on our device:
 * a larger one would gather past the block, another order would put every
 * rank's slice at another rank's place, silently. */
int cu_coll_check(void *ctx, void *coll, int ranks, int rank, char *err, size_t errlen) {
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

int cu_coll_id(void *ctx, void *id, size_t len, char *err, size_t errlen) {
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
int cu_coll_init(void *ctx, const void *id, size_t len, int ranks, int rank, unsigned timeout_ms,
                 void **coll, char *err, size_t errlen) {
  struct cuda_ctx *c = ctx;
  *coll = NULL;
  if (len < sizeof(ncclUniqueId)) {
    snprintf(err, errlen, "an NCCL id needs %zu bytes, not %zu", sizeof(ncclUniqueId), len);
    return MLO_EINVAL;
  }
  ncclUniqueId u;
  memcpy(&u, id, sizeof u);
  mlo_cu_guard g;
  int rc = cu_enter(c, &g);
  if (rc) {
    snprintf(err, errlen, "cuda:%d: the device's context is lost", c->device);
    return rc;
  }
  /* Non-blocking: a blocking init waits in NCCL's bootstrap for every rank,
   * forever if one failed before it got there.  Polled, and aborted after
   * the communicator's timeout, as a gather is. */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, ranks, u, rank, &config);
  uint64_t t0 = mono_ms();
  unsigned limit = timeout_ms ? timeout_ms : 60000u;
  while (r == ncclInProgress && comm) {
    ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) r = q;
    if (r != ncclInProgress) break;
    if (mono_ms() - t0 >= limit) {
      ncclCommAbort(comm);
      cu_leave(c, &g);
      snprintf(err, errlen,
               "ncclCommInitRankConfig did not complete within %.1f s (a node rank never "
               "joined); the communicator was aborted",
               limit / 1000.0);
      return MLO_EPLATFORM;
    }
    struct timespec nap = {0, 1000000}; /* 1 ms */
    nanosleep(&nap, NULL);
  }
  if (r != ncclSuccess && comm) ncclCommAbort(comm);
  cu_leave(c, &g);
  if (r != ncclSuccess) return nccl_fail(err, errlen, "ncclCommInitRankConfig", r);
  pthread_mutex_lock(&c->lock);
  c->coll_timeout_ms = limit;
  pthread_mutex_unlock(&c->lock);
  *coll = comm;
  return MLO_OK;
}

void cu_coll_destroy(void *ctx, void *coll) {
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
  bool in = !cu_enter(c, &g);
  /* Non-blocking (cu_coll_init): nccl.h's ncclCommFinalize "flushes all
   * issued communications, and marks communicator state as
   * ncclInProgress", polled until ncclSuccess; then ncclCommDestroy frees
   * the rest without blocking.  One that does not settle within the
   * communicator's timeout (a peer gone) is aborted instead. */
  pthread_mutex_lock(&c->lock);
  unsigned timeout_ms = c->coll_timeout_ms;
  pthread_mutex_unlock(&c->lock);
  ncclResult_t r = nccl_settle(c, (ncclComm_t)coll, ncclCommFinalize((ncclComm_t)coll), timeout_ms);
  const char *what = "ncclCommFinalize";
  if (r == ncclSuccess) {
    what = "ncclCommDestroy";
    r = nccl_settle(c, (ncclComm_t)coll, ncclCommDestroy((ncclComm_t)coll), timeout_ms);
  } else {
    ncclCommAbort((ncclComm_t)coll); /* frees it: nothing more to ask */
  }
  if (r != ncclSuccess)
    mlo_logf(MLO_LOG_ERROR, "cuda: %s failed: %s%s", what,
             r == ncclInProgress ? "it did not complete within the timeout" : ncclGetErrorString(r),
             strcmp(what, "ncclCommFinalize") ? "" : "; the communicator was aborted");
  if (in) cu_leave(c, &g);
}

/* A sharded load's first wait: on the host, watching its gather. */
int cu_coll_wait(void *ctx, mlo_event *ev, char *err, size_t errlen) {
  struct cuda_ctx *c = ctx;
  mlo_cu_guard g;
  int rc = cu_enter(c, &g);
  if (rc) {
    snprintf(err, errlen, "cuda:%d: the device's context is lost", c->device);
    return rc;
  }
  rc = cu_host_wait(c, ev->e, NULL, "waiting for a sharded load", err, errlen);
  cu_leave(c, &g);
  return rc;
}
#endif
