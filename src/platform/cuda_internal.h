/*
 * cuda_internal.h — what the files of the CUDA platform share (cuda.c:
 * memory, copies, events, the ops table; cuda_open.c: the spec, the device,
 * its memory pool and streams; cuda_nccl.c: the node's collectives and the
 * host waits that watch them; cuda_bounce.c: loads from pageable memory
 * through a pinned ring; cuda_ctx.c: the caller's context kept).
 */
#ifndef MLO_PLATFORM_CUDA_INTERNAL_H
#define MLO_PLATFORM_CUDA_INTERNAL_H

#include "platform/cuda_ctx.h"
#include "platform/platform.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* Copies are cut into pieces this large: each cudaMemcpyAsync call stays
 * bounded (a pinned source copies asynchronously at link speed in any
 * size).  A pageable source of a load goes through the platform's pinned
 * staging ring instead (cuda_bounce.c), in slots of this size or 4 MiB;
 * core still registers a slab that fell back to pageable memory (slab.c),
 * since a copy that needs no staging is the cheaper one. */
#define DEFAULT_CHUNK ((uint64_t)64 << 20)

/* A memory pool maps physical memory in whole granules (the allocation
 * granularity, 2 MiB on the GPUs CUDA 12 and 13 support), and its maxSize
 * (capacity=) bounds what it has mapped, not the bytes asked for: each
 * block counts against the capacity as the granules it may take, so that a
 * size the capacity says is free is one the pool can map (issue D4). */
#define CU_GRANULE ((uint64_t)2 << 20)

struct cuda_options {
  unsigned long index;
  int pinned;        /* -1: on unless MLO_NO_PINNED=1 */
  uint64_t chunk;    /* bytes per cudaMemcpyAsync */
  uint64_t capacity; /* 0: the whole device */
  uintptr_t stream;  /* stream=: the caller's compute stream (not ours to destroy) */
  bool stream_given; /* stream= was given: 0 is then the legacy default stream */
};

struct cuda_ctx {
  int device;
  void *primary; /* the device's primary context (CUcontext), current in every call */
  /* COPY: loads; READBACK: write-backs (so an evicted component's
   * write-back, which waits for its compute, never holds up the next load);
   * COMPUTE: the user's queue; RELEASE: frees. */
  cudaStream_t copy, readback, compute, release;
  bool compute_external; /* compute is the caller's stream (stream=): never destroyed */
  cudaEvent_t copy_tail, readback_tail, compute_tail; /* free ordering; guarded by lock */
  cudaMemPool_t pool;                                 /* NULL: no pool support, plain cudaMalloc */
  size_t chunk;
  bool pinned, host_register;
  pthread_mutex_t lock;
  bool warned_pageable;
  int stamp_users;   /* traces that want event_time's stamps (want_stamps); guarded by lock */
  uint64_t capacity; /* bytes mlo may hand out: capacity= or the device's total */
  uint64_t used;     /* live blocks, in whole granules (CU_GRANULE); guarded by lock */
  /* host_register of memory its owner had page-locked already: counted as
   * pinned, never unregistered by us (one entry per register); guarded by
   * lock. */
  void **foreign;
  size_t nforeign, foreign_cap;
  /* A sticky error (an illegal address, a kernel fault) poisons the context
   * for good: every later call fails the same way.  The first one is kept
   * and every entry point answers MLO_EPLATFORM with it, without calling
   * the runtime again.  Guarded by lock. */
  bool sticky;
  char sticky_msg[256];
  /* Sharded loads' gathers (NCCL, cuda_nccl.c): gather_ev is recorded on COPY
   * after the last one; while gather_comm is set it may not have completed,
   * and every host wait of ours watches it (its communicator's errors, and
   * gather_timeout_ms of waiting) instead of blocking blind.  Communicators
   * this platform aborted are remembered so that they are refused, and
   * not destroyed a second time.  Guarded by lock. */
  cudaEvent_t gather_ev;
  void *gather_comm;
  uint64_t gather_seq; /* counts gathers recorded: a watch clears only its own */
  /* Records on COPY are numbered (copy_records, under lock with the
   * record): gather_first is the number of the oldest gather not yet seen
   * complete, so compute_wait settles only for an event recorded after it
   * (one recorded before depends on no pending gather). */
  uint64_t copy_records, gather_first;
  uint64_t gather_settles; /* compute_waits that waited for a pending gather */
  /* NCCL communicators are not thread-safe: an enqueue and an abort on the
   * same one never overlap (taken before lock, never inside it). */
  pthread_mutex_t nccl_lock;
  unsigned gather_timeout_ms;
  unsigned coll_timeout_ms;  /* the last communicator mlo made: how long its destroy may poll */
  uint64_t nccl_in_progress; /* NCCL calls that answered ncclInProgress (polled to an end) */
  void *aborted[8];
  int naborted;
  char gather_msg[320]; /* why the last communicator was aborted */
  /* The pinned ring pageable loads are staged through (cuda_bounce.c):
   * made at the first one; refused for good if it could not be.  Guarded
   * by bounce_lock (taken inside no other lock of ours). */
  pthread_mutex_t bounce_lock;
  struct cu_bounce *bounce;
  bool bounce_refused;
};

/* An event: a cudaEvent_t and its completion stamp (event_time). */
struct mlo_event {
  cudaEvent_t e;
  /* its last record's number on COPY (cuda_ctx.copy_records); 0: recorded
   * on COMPUTE, or never (depends on no gather compute has not settled);
   * UINT64_MAX: on READBACK (may depend on anything: settled as before).
   * Guarded by the platform's lock. */
  uint64_t copy_seq;
  mlo_stamp *stamp; /* when the copy queue reached the last copy-side record */
  pthread_mutex_t lock;
};

/* The runtime's status as ours (a sticky error remembered, others cleared),
 * and our device's context made current and the caller's put back (cuda.c). */
/* cuda_status.c: whether e leaves the context unusable for good. */
bool cu_is_sticky(cudaError_t e);
int cu_status(struct cuda_ctx *c, cudaError_t e, const char *what);
int cu_enter(struct cuda_ctx *c, mlo_cu_guard *g);
/* cudaEventQuery(ev), or cudaStreamQuery(s) with ev NULL, leaving no
 * cudaErrorNotReady behind in the thread's last error (cuda.c). */
cudaError_t cu_query(cudaEvent_t ev, cudaStream_t s);
void cu_leave(struct cuda_ctx *c, const mlo_cu_guard *g);

/* Host waits, for an event (ev) or a stream's tail (s), in our entered
 * context, that watch a pending gather (cuda_nccl.c). */
int cu_host_wait(struct cuda_ctx *c, cudaEvent_t ev, cudaStream_t s, const char *what, char *err,
                 size_t errlen);
int cu_stream_sync(struct cuda_ctx *c, cudaStream_t s, const char *what);
/* Where a gather may be pending: waits for it on the host, watched, so
 * that no compute is queued behind a gather nobody watches (a replicated
 * load's copies queue behind it on COPY too).  MLO_OK at once otherwise. */
int cu_gather_settle(struct cuda_ctx *c);
/* Whether an event numbered copy_seq (struct mlo_event) was recorded after
 * a gather still pending (cuda_nccl.c). */
bool cu_gather_before(struct cuda_ctx *c, uint64_t copy_seq);
#ifdef MLO_HAVE_NCCL
/* The collective slots of the ops table (platform.h), over NCCL (cuda_nccl.c). */
int cu_all_gather(void *ctx, void *block, size_t offset, size_t slice, int rank, void *coll,
                  unsigned timeout_ms);
int cu_coll_check(void *ctx, void *coll, int ranks, int rank, char *err, size_t errlen);
int cu_coll_id(void *ctx, void *id, size_t len, char *err, size_t errlen);
int cu_coll_init(void *ctx, const void *id, size_t len, int ranks, int rank, unsigned timeout_ms,
                 void **coll, char *err, size_t errlen);
void cu_coll_destroy(void *ctx, void *coll);
int cu_coll_wait(void *ctx, mlo_event *ev, char *err, size_t errlen);
#endif

/* Loads from pageable memory (cuda_bounce.c).  Whether [p, p+bytes) is
 * page-locked as the runtime knows it (both ends; by anyone in the
 * process). */
bool cu_page_locked(const void *p, size_t bytes);
/* Queues a host-to-device copy on COPY from a pageable source through the
 * platform's pinned staging ring, never waiting on the host; the context
 * entered.  MLO_EUNSUPPORTED where the source is page-locked or there is
 * no ring (pinning off, or refused): the caller copies directly. */
int cu_bounce_h2d(struct cuda_ctx *c, char *dst, const char *src, size_t bytes);
/* Frees the ring, once COPY has drained (at destroy; lost: the context is,
 * so nothing is waited for). */
void cu_bounce_destroy(struct cuda_ctx *c, bool lost);

/* Opening a device (cuda_open.c). */
int cu_parse_spec(const char *args, struct cuda_options *o, char *err, size_t errlen);
int cu_find_device(unsigned long index, char *err, size_t errlen);
int cu_create_streams(struct cuda_ctx *c, char *err, size_t errlen);
void cu_describe(struct cuda_ctx *c, mlo_platform *p);

#endif
