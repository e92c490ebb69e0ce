/*
 * platform.h — the internal platform vtable (ggml-backend style).
 *
 * Core talks to a device only through this table; platforms never know
 * about roles or components.  One `static const struct mlo_platform_ops` per
 * platform, designated initializers, optional slots documented with the
 * default the wrappers below apply when a slot is NULL.
 *
 * Model of a device: two queues, COPY and COMPUTE.  Copies are enqueued on
 * the copy queue and may complete later (a platform may give device-to-host
 * copies a queue of their own, READBACK; it is the copy queue otherwise); events recorded on a
 * queue complete when everything enqueued on it before them has.  Compute is whatever the user's
 * forward submits: on CUDA/OpenCL it goes to the native compute queue, on host it runs on the
 * calling thread (so "the compute queue waits for an event" means "the calling thread waits").
 *
 * Device memory is handed out as BLOCKS: an opaque handle (an address on
 * pointer platforms, a cl_mem on OpenCL) plus byte offsets into it.
 */
#ifndef MLO_PLATFORM_H
#define MLO_PLATFORM_H

#include "mlo/mlo.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct mlo_event mlo_event; /* opaque, platform-defined */

/* The collective group: a platform that gathers sharded loads on its own
 * device, on its copy queue (core's gathers go through mlo_plat_all_gather
 * and the mlo_plat_coll_* wrappers).  Every slot is required.  Split from
 * the core table (issue 40) so a platform without collectives leaves one
 * pointer NULL instead of six slots, and the wrappers ask once. */
struct mlo_platform_coll_ops {
  /* gather: an in-place all-gather of a region of a block over the
   * node's ranks, on the copy queue: rank r's bytes [offset + r*slice,
   * offset + (r+1)*slice) reach every rank's block (the region: a whole
   * sharded load's block, or one piece of one loaded block by block), after
   * the copies queued before it and before anything
   * recorded after it (CUDA: ncclAllGather on the copy stream with the
   * caller's NCCL communicator, `coll`).  The
   * platform watches the gather until it completes: a host wait of its own
   * that the gather holds up (wait, event_sync, synchronize, a host
   * free) polls coll's errors and gives up after timeout_ms of waiting,
   * aborting coll, so no wait on a stalled gather lasts forever. */
  int (*gather)(void *ctx, void *block, size_t offset, size_t slice, int rank, void *coll,
                unsigned timeout_ms);
  /* The device communicators themselves.
   * check: whether coll spans `ranks` ranks, puts this process at
   * `rank` and runs on this platform's device (MLO_EINVAL naming what
   * differs; one the platform aborted is refused too).  id: a new
   * communicator's id (at most MLO_COLL_ID_BYTES) into id, on the rank that
   * creates it; init: this rank's communicator from that id, on this
   * platform's device, made without blocking and given up (aborted) after
   * timeout_ms if the other ranks never complete it; destroy: frees
   * one init made (a communicator the platform aborted is gone
   * already: nothing).
   * wait: waits on the host for ev, recorded after a gather,
   * watching the gather as above; on an error or the timeout the
   * communicator is aborted and err says why. */
  int (*check)(void *ctx, void *coll, int ranks, int rank, char *err, size_t errlen);
  int (*id)(void *ctx, void *id, size_t len, char *err, size_t errlen);
  int (*init)(void *ctx, const void *id, size_t len, int ranks, int rank, unsigned timeout_ms,
              void **coll, char *err, size_t errlen);
  void (*destroy)(void *ctx, void *coll);
  int (*wait)(void *ctx, mlo_event *ev, char *err, size_t errlen);
};

/* The model group: a platform that models time or a node instead of
 * measuring a device (the simulated device's clock; the host platform's
 * node paths).  Each slot optional. */
struct mlo_platform_model_ops {
  /* The platform's clock in nanoseconds, for every duration core
   * measures (waits, forwards) and every trace stamp.  NULL: mlo_now_ns.
   * The simulated platform answers its virtual clock, so a projected run's
   * stall and wall time come out of the same accounting as a real one's. */
  uint64_t (*now_ns)(void *ctx);
  /* For a platform that models a node (host: group=, uplink=,
   * fabric=): the node's copy paths as it models them.  NULL or
   * MLO_EUNSUPPORTED: not modelled (a real device's are what they are). */
  int (*topology)(void *ctx, mlo_node_topology *t);
  /* With topology: core has just all-gathered `ranks` slices of
   * `slice` bytes, starting at t0_ns (mlo_plat_now), by some means faster
   * than the modelled fabric (host: MPI through shared memory); returns no
   * sooner than the modelled gather would have ended. */
  void (*gather_pace)(void *ctx, size_t slice, int ranks, uint64_t t0_ns);
};

struct mlo_platform_ops {
  const char *name; /* "host", "cuda", "opencl" */

  /* Frees the context.  Every block, host buffer and event is gone by now. */
  void (*destroy)(void *ctx);
  void (*get_caps)(void *ctx, mlo_platform_caps *caps);
  /* total/free from the device; used/peak are tracked by the wrapper. */
  int (*get_memory)(void *ctx, uint64_t *total, uint64_t *free_bytes);
  /* Optional: the allocator's reserved high-water mark, and its reset (for
   * mlo_platform_memory.reserved_peak_bytes).  NULL: the used peak. */
  int (*reserved_peak)(void *ctx, uint64_t *bytes);
  void (*reset_reserved_peak)(void *ctx);

  /* Device blocks.  alloc returns MLO_ENOMEM_DEVICE when the device is full
   * (never aborts).  free is ordered after all work already submitted to
   * either queue: it never frees memory that a queued copy or compute still
   * uses, and where the device allows it never blocks the host (CUDA:
   * cudaFreeAsync on the release stream).  free returns MLO_OK once the
   * block is released or its release is queued; an error means the device
   * still holds it (its bytes keep counting as used). */
  int (*dev_alloc)(void *ctx, size_t bytes, void **block);
  int (*dev_free)(void *ctx, void *block, size_t bytes);
  /* Optional: a free ordered after `used` — an event recorded on the
   * compute queue after the last compute that reads the block — and after
   * every copy already submitted to either copy queue, but NOT after
   * compute submitted since `used` was recorded: a load that reuses the
   * memory may then run beside that later compute (a prefetch overlapping
   * the current forward) instead of behind it.  The caller promises that
   * no compute submitted after `used` touches the block.  NULL: dev_free,
   * ordered after everything (the wrapper falls back to it). */
  int (*dev_free_after)(void *ctx, void *block, size_t bytes, mlo_event *used);
  /* Optional: a block for compute only (a workload's scratch), allocated in
   * the compute queue's order (CUDA: from the pool on the compute stream),
   * so compute submitted after it uses it without waiting for anything
   * queued on the copy queues (dev_alloc's blocks are ordered on COPY).
   * Counted against the capacity as dev_alloc's are; freed with dev_free.
   * NULL: the wrapper answers MLO_EUNSUPPORTED (review D10). */
  int (*dev_alloc_compute)(void *ctx, size_t bytes, void **block);

  /* Host memory.  pinned asks for page-locked memory; *got_pinned says
   * whether it was (best effort: pageable on failure).  Optional: NULL means
   * aligned_alloc and never pinned. */
  int (*host_alloc)(void *ctx, size_t bytes, bool pinned, void **ptr, bool *got_pinned);
  void (*host_free)(void *ctx, void *ptr, size_t bytes, bool pinned);
  /* Optional (caps.host_register): page-locks memory the caller owns, in
   * place, for copies at link speed; MLO_EUNSUPPORTED (or any error) leaves
   * it pageable.  read_only: nothing is ever copied into the range (no
   * write-back), so the platform may register it so (CUDA:
   * cudaHostRegisterReadOnly where the device supports it); otherwise it
   * must not.  unregister waits for copies that may still read it. */
  int (*host_register)(void *ctx, void *ptr, size_t bytes, bool read_only);
  void (*host_unregister)(void *ctx, void *ptr);

  /* Asynchronous copies on the copy queue.  The source/destination host
   * memory must stay valid until an event recorded after the copy has
   * completed. */
  int (*copy_h2d)(void *ctx, void *block, size_t offset, const void *src, size_t bytes);
  /* On the READBACK queue (the copy queue where there is no other). */
  int (*copy_d2h)(void *ctx, void *dst, const void *block, size_t offset, size_t bytes);

  /* Events.  Optional as a set (caps.events false): the wrappers then fall
   * back to synchronize, never to nothing. */
  int (*event_create)(void *ctx, mlo_event **ev);
  void (*event_destroy)(void *ctx, mlo_event *ev);
  int (*event_record_copy)(void *ctx, mlo_event *ev);    /* on the copy queue */
  int (*event_record_compute)(void *ctx, mlo_event *ev); /* on the compute queue */
  int (*compute_wait)(void *ctx, mlo_event *ev);         /* compute queue waits */
  int (*copy_wait)(void *ctx, mlo_event *ev);            /* copy queue waits */
  int (*event_sync)(void *ctx, mlo_event *ev);           /* the host waits */
  /* Optional, for a separate READBACK queue (CUDA: write-backs do not queue
   * behind loads, nor loads behind a write-back waiting for compute): record
   * on it, make it wait.  NULL: the copy queue's slots, which order d2h
   * copies already (one queue). */
  int (*event_record_readback)(void *ctx, mlo_event *ev);
  int (*readback_wait)(void *ctx, mlo_event *ev);
  /* MLO_OK if complete, MLO_EBUSY if pending. */
  int (*event_query)(void *ctx, mlo_event *ev);
  /* Optional, for traces: when a copy-queue event completed, on the clock
   * of mlo_now_ns (the device's own completion, not when someone waited).
   * MLO_OK with *t_ns, MLO_EBUSY if not complete yet, MLO_EUNSUPPORTED if
   * the platform cannot tell.  Never blocks; never a fault point. */
  int (*event_time)(void *ctx, mlo_event *ev, uint64_t *t_ns);
  /* Optional, with event_time: delta +1 when a trace is attached to a
   * pipeline on this platform, -1 when it goes.  A platform whose stamps
   * cost something on its copy queue (CUDA: a host function behind each
   * copy-side record) takes them only while some trace wants them. */
  void (*want_stamps)(void *ctx, int delta);

  /* Optional, for platforms that build large blocks from segments
   * (caps.max_block_bytes): the native handle and offset within it of a
   * byte of a block.  NULL: the block and offset themselves. */
  void (*resolve)(void *ctx, void *block, size_t offset, void **handle, size_t *local);

  /* Waits for both queues to drain. */
  int (*synchronize)(void *ctx);
  /* The native compute queue (NULL for host).  Optional: NULL -> NULL. */
  void *(*compute_queue)(void *ctx);
  /* Optional: the native context the compute queue lives in (CUDA: the
   * device's primary CUcontext), for a back-end whose compute queue is a
   * handle that names no context of its own (CUDA's legacy default stream,
   * 0: the runtime resolves it in whichever context the calling thread has
   * current, review D11).  NULL -> NULL. */
  void *(*compute_context)(void *ctx);
  /* The optional groups, NULL where the platform has none of them. */
  const struct mlo_platform_coll_ops *coll;   /* gathers on the device (cuda with NCCL) */
  const struct mlo_platform_model_ops *model; /* a modelled clock or node (sim, host) */
};

/* The handle behind the public mlo_platform. */
struct mlo_platform {
  const struct mlo_platform_ops *ops;
  void *ctx;
  char description[320]; /* sized for the longest device names: never truncated */
  mlo_platform_caps caps;
  /* Accounting done by the wrappers, not by each platform. */
  void *acct_lock; /* pthread_mutex_t*, opaque here to keep headers light */
  uint64_t used_bytes, peak_bytes;
  uint64_t calls;         /* every wrapper call: C13 counts these */
  mlo_framework_cache fw; /* another allocator's cache (mlo_platform_set_framework_cache) */
};

/* Constructors of the platforms built into libmlo (cuda and opencl are
 * modules: module.h).  spec_args is what follows "name:" (may
 * be ""); on failure they write a message naming the bad part to err. */
int mlo_host_platform_create(const char *spec_args, mlo_platform *p, char *err, size_t errlen);
int mlo_sim_platform_create(const char *spec_args, mlo_platform *p, char *err, size_t errlen);
/* The host platform opened with srccheck=1: how many host-to-device copies
 * found their source changed between their queueing and their end (a host
 * buffer rewritten without waiting for the copies out of it).  MLO_EINVAL
 * for another platform. */
int mlo_host_sources_changed(mlo_platform *p, uint64_t *n);
/* The simulated platform's compute: the calling thread (its compute queue,
 * as on host) spends ns of virtual time.  MLO_EINVAL for another platform. */
int mlo_sim_compute(mlo_platform *p, uint64_t ns);
/* The simulated platform's disk (the disk tier's reads, docs/disk.md): a
 * read of bytes from now, at its disk= rate, before which the copy queue
 * starts nothing more.  MLO_EINVAL for another platform. */
int mlo_sim_disk_read(mlo_platform *p, uint64_t bytes);
/* Several simulated devices of one host (one pipeline over several, `mlo
 * plan --devices`): p takes with's clock and disk, keeping its own memory
 * and copy queue, so that one calling thread's forwards on either advance
 * one time.  Before p is used (MLO_ESTATE after).  MLO_EINVAL unless both
 * are sim platforms. */
int mlo_sim_share_clock(mlo_platform *p, mlo_platform *with);

/* Wrappers used by core: apply defaults for NULL slots, count calls, keep
 * used/peak accounting.  Same contracts as the slots above. */
int mlo_plat_dev_alloc(mlo_platform *p, size_t bytes, void **block);
/* The compute_context slot, or NULL without one.  Not a platform call. */
void *mlo_plat_compute_context(mlo_platform *p);
/* The dev_alloc_compute slot, accounted as dev_alloc; MLO_EUNSUPPORTED
 * without it (the caller then orders a dev_alloc block itself). */
int mlo_plat_dev_alloc_compute(mlo_platform *p, size_t bytes, void **block);
/* The block's bytes stop counting as used only if the platform released
 * it (MLO_OK); a failed free leaves them counted, as the device does. */
int mlo_plat_dev_free(mlo_platform *p, void *block, size_t bytes);
/* The dev_free_after slot; dev_free without it, without events, or with
 * used NULL. */
int mlo_plat_dev_free_after(mlo_platform *p, void *block, size_t bytes, mlo_event *used);
/* Whether dev_free_after is more than dev_free here (core records the
 * event it needs only then). */
bool mlo_plat_has_dev_free_after(const mlo_platform *p);
int mlo_plat_host_alloc(mlo_platform *p, size_t bytes, bool pinned, void **ptr, bool *got_pinned);
/* MLO_EUNSUPPORTED without the slot. */
int mlo_plat_host_register(mlo_platform *p, void *ptr, size_t bytes, bool read_only);
void mlo_plat_host_unregister(mlo_platform *p, void *ptr);
void mlo_plat_host_free(mlo_platform *p, void *ptr, size_t bytes, bool pinned);
int mlo_plat_copy_h2d(mlo_platform *p, void *block, size_t offset, const void *src, size_t bytes);
int mlo_plat_copy_d2h(mlo_platform *p, void *dst, const void *block, size_t offset, size_t bytes);
int mlo_plat_event_create(mlo_platform *p, mlo_event **ev);
void mlo_plat_event_destroy(mlo_platform *p, mlo_event *ev);
int mlo_plat_event_record_copy(mlo_platform *p, mlo_event *ev);
int mlo_plat_event_record_compute(mlo_platform *p, mlo_event *ev);
int mlo_plat_compute_wait(mlo_platform *p, mlo_event *ev);
int mlo_plat_copy_wait(mlo_platform *p, mlo_event *ev);
int mlo_plat_event_record_readback(mlo_platform *p, mlo_event *ev);
int mlo_plat_readback_wait(mlo_platform *p, mlo_event *ev);
/* Whether d2h copies have a queue of their own: then a load must wait for
 * a pending write-back into the same host memory explicitly. */
bool mlo_plat_separate_readback(const mlo_platform *p);
int mlo_plat_event_sync(mlo_platform *p, mlo_event *ev);
int mlo_plat_event_query(mlo_platform *p, mlo_event *ev);
/* A completion stamp for device platforms' event_time: a device callback
 * (cudaLaunchHostFunc, clSetEventCallback) fires it when the copy queue
 * reaches it; the event keeps one reference, the pending callback another,
 * so neither can free it under the other. */
typedef struct mlo_stamp mlo_stamp;
mlo_stamp *mlo_stamp_new(void);                   /* two references; NULL if out of memory */
void mlo_stamp_fire(mlo_stamp *s);                /* the callback's: records now, drops its ref */
void mlo_stamp_put(mlo_stamp *s);                 /* drops a reference (NULL: nothing) */
int mlo_stamp_time(mlo_stamp *s, uint64_t *t_ns); /* MLO_OK, MLO_EBUSY; NULL: MLO_EUNSUPPORTED */

/* The event_time slot, or MLO_EUNSUPPORTED without one (not counted as a
 * platform call: it only feeds the trace). */
int mlo_plat_event_time(mlo_platform *p, mlo_event *ev, uint64_t *t_ns);
/* The want_stamps slot (nothing without one).  Not a platform call. */
void mlo_plat_want_stamps(mlo_platform *p, int delta);
int mlo_plat_synchronize(mlo_platform *p);
/* The resolve slot, or identity.  Not a platform call (never fails). */
void mlo_plat_resolve(mlo_platform *p, void *block, size_t offset, void **handle, size_t *local);
/* The all_gather slot; MLO_EUNSUPPORTED without one. */
int mlo_plat_all_gather(mlo_platform *p, void *block, size_t offset, size_t slice, int rank,
                        void *coll, unsigned timeout_ms);
bool mlo_plat_has_all_gather(const mlo_platform *p);
/* The coll_* slots (MLO_EUNSUPPORTED, with a message, without them). */
#define MLO_COLL_ID_BYTES 128
int mlo_plat_coll_check(mlo_platform *p, void *coll, int ranks, int rank, char *err, size_t errlen);
int mlo_plat_coll_id(mlo_platform *p, void *id, size_t len, char *err, size_t errlen);
int mlo_plat_coll_init(mlo_platform *p, const void *id, size_t len, int ranks, int rank,
                       unsigned timeout_ms, void **coll, char *err, size_t errlen);
void mlo_plat_coll_destroy(mlo_platform *p, void *coll);
bool mlo_plat_has_coll(const mlo_platform *p);
int mlo_plat_coll_wait(mlo_platform *p, mlo_event *ev, char *err, size_t errlen);
/* The gather_pace slot (nothing without one).  Not a platform call. */
void mlo_plat_gather_pace(mlo_platform *p, size_t slice, int ranks, uint64_t t0_ns);
/* The platform's clock (the now_ns slot, or mlo_now_ns).  Not a platform
 * call: it is never counted and never fails. */
uint64_t mlo_plat_now(const mlo_platform *p);
/* Number of wrapper calls made so far (for tests: C13). */
uint64_t mlo_plat_call_count(mlo_platform *p);

/* Parses "key=value,key=value" option lists for platform specs.  Calls
 * fn(key, value, user) for each; stops at the first non-zero return.  A
 * malformed item gives MLO_EINVAL with the item named in err. */
typedef int (*mlo_spec_kv_fn)(const char *key, const char *value, void *user, char *err,
                              size_t errlen);
int mlo_spec_parse_kv(const char *args, mlo_spec_kv_fn fn, void *user, char *err, size_t errlen);
/* Parses the arguments of an indexed device spec, "" | "N" | "N:opts" |
 * "opts" (a first item with '=' is an option): *index gets N (default
 * untouched), options go to fn.  A bad index (not digits, or above
 * max_index) is MLO_EINVAL with "<name>: bad device index" in err. */
int mlo_spec_parse_indexed(const char *name, const char *args, unsigned long max_index,
                           unsigned long *index, mlo_spec_kv_fn fn, void *user, char *err,
                           size_t errlen);

#endif /* MLO_PLATFORM_H */
