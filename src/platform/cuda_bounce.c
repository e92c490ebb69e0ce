/*
 * cuda_bounce.c — host-to-device copies from pageable memory, through a
 * small pinned ring the platform owns (review D8).
 *
 * Why: the driver stages a pageable source itself, and the runtime API
 * ("API synchronization behavior") says it may synchronize with the stream
 * to do so.  A load queued on COPY behind a cudaStreamWaitEvent (a joined
 * switch's gated copies, a streamed block's) then holds the calling thread,
 * the forward's, until compute reaches the gate: the forward stops queuing
 * kernels and the overlap the gate was for collapses.
 *
 * Here nothing of such a copy runs on the calling thread.  It is cut into
 * pieces of one ring slot, and for each:
 *  - STAGE, a stream of the ring's own, waits until the slot's previous
 *    copy to the device is done (`drained`, recorded on COPY after it),
 *    then copies the piece from the source into the slot in a host
 *    function (a memcpy: it makes no CUDA call) and records `staged`;
 *  - COPY waits for `staged` and copies the slot to the device: a pinned
 *    source's copy, asynchronous at link speed.
 * So the caller only queues; STAGE fills the next slot while COPY moves
 * this one; and a gate on COPY holds STAGE, at most a ring ahead, never
 * the caller.  Every piece is queued under one lock, so a slot's uses come
 * in the order they were issued on both streams.
 *
 * The source must stay readable until an event recorded on COPY after the
 * copy has completed (platform.h asks it of every copy): the staging reads
 * it then.  The ring is made at the first pageable copy (slabs are pinned:
 * most runs never make it) and freed at destroy, never mid-run
 * (cudaFreeHost synchronizes the device, review D5).  With pinning turned
 * off (pinned=0, MLO_NO_PINNED=1) there is no ring: such copies are the
 * driver's, and so is the wait.
 */
#include "base/log.h"
#include "base/sysio.h"
#include "platform/cuda_internal.h"

#include <stdlib.h>
#include <string.h>

#define BOUNCE_SLOTS 4
#define BOUNCE_SLOT_MAX ((size_t)4 << 20)

struct cu_bounce {
  cudaStream_t stage;
  char *ring;
  size_t slot_bytes;
  bool registered; /* ring is aligned_alloc'd memory registered in place (else cudaHostAlloc'd) */
  cudaEvent_t staged[BOUNCE_SLOTS], drained[BOUNCE_SLOTS];
  unsigned next; /* the slot the next piece takes */
};

/* One piece's staging, owned by its host function (which frees it). */
struct piece {
  char *slot;
  const char *src;
  size_t bytes;
};

/* On the driver's callback thread, once STAGE reaches it. */
static void CUDART_CB stage_piece(void *user) {
  struct piece *p = user;
  memcpy(p->slot, p->src, p->bytes);
  free(p);
}

/* Whether the runtime knows p as page-locked host memory
 * (cudaPointerGetAttributes: type cudaMemoryTypeHost for memory from
 * cudaHostAlloc/cudaMallocHost or registered with cudaHostRegister, by
 * anyone in the process; cudaMemoryTypeUnregistered, with cudaSuccess, for
 * plain host memory since CUDA 11 — an error, on an older runtime, is
 * taken as "not known", and cleared: the call just returned it). */
static bool known_pinned(const void *p) {
  struct cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

bool cu_page_locked(const void *p, size_t bytes) {
  return bytes && known_pinned(p) && known_pinned((const char *)p + bytes - 1);
}

static void free_ring(struct cu_bounce *b, bool lost) {
  if (b->stage) {
    if (!lost) (void)cudaStreamSynchronize(b->stage);
    (void)cudaStreamDestroy(b->stage);
  }
  for (int i = 0; i < BOUNCE_SLOTS; i++) {
    if (b->staged[i]) (void)cudaEventDestroy(b->staged[i]);
    if (b->drained[i]) (void)cudaEventDestroy(b->drained[i]);
  }
  if (b->ring && b->registered) {
    (void)cudaHostUnregister(b->ring);
    free(b->ring);
  } else if (b->ring) {
    (void)cudaFreeHost(b->ring);
  }
  (void)cudaGetLastError(); /* best effort: nothing here is the caller's */
  free(b);
}

/* Page-locked memory for the ring: cudaHostAlloc, else memory of ours
 * registered in place (as core does for a slab that fell back).  A
 * failure is the host's page-locked memory running out, never the
 * device's; a sticky error is the context's. */
static int pin_ring(struct cuda_ctx *c, struct cu_bounce *b, size_t bytes) {
  cudaError_t e = cudaHostAlloc((void **)&b->ring, bytes, cudaHostAllocPortable);
  if (e == cudaSuccess) return MLO_OK;
  b->ring = NULL;
  if (cu_is_sticky(e)) return cu_status(c, e, "cudaHostAlloc (staging ring)");
  (void)cudaGetLastError();
  if (!c->host_register) return MLO_ENOMEM;
  b->ring = mlo_aligned_alloc(4096, bytes);
  if (!b->ring) return MLO_ENOMEM;
  e = cudaHostRegister(b->ring, bytes, cudaHostRegisterPortable);
  if (e == cudaSuccess) {
    b->registered = true;
    return MLO_OK;
  }
  free(b->ring);
  b->ring = NULL;
  if (cu_is_sticky(e)) return cu_status(c, e, "cudaHostRegister (staging ring)");
  (void)cudaGetLastError();
  return MLO_ENOMEM;
}

/* The ring, made on first use; NULL where it cannot be had (said once).
 * bounce_lock held, context entered. */
static struct cu_bounce *ring(struct cuda_ctx *c) {
  if (c->bounce || c->bounce_refused) return c->bounce;
  struct cu_bounce *b = mlo_calloc(1, sizeof *b);
  if (!b) return NULL; /* out of host memory: tried again next time */
  b->slot_bytes = c->chunk < BOUNCE_SLOT_MAX ? c->chunk : BOUNCE_SLOT_MAX;
  const unsigned fast = cudaEventDisableTiming;
  int rc = pin_ring(c, b, b->slot_bytes * BOUNCE_SLOTS);
  if (!rc)
    rc = cu_status(c, cudaStreamCreateWithFlags(&b->stage, cudaStreamNonBlocking),
                   "cudaStreamCreate (staging)");
  for (int i = 0; i < BOUNCE_SLOTS && !rc; i++) {
    rc = cu_status(c, cudaEventCreateWithFlags(&b->staged[i], fast), "cudaEventCreate (staging)");
    if (!rc)
      rc =
          cu_status(c, cudaEventCreateWithFlags(&b->drained[i], fast), "cudaEventCreate (staging)");
  }
  if (rc) {
    free_ring(b, false);
    c->bounce_refused = true;
    mlo_logf(MLO_LOG_WARN,
             "cuda: no pinned staging ring (%s): a copy from pageable memory holds the calling "
             "thread until the copy stream reaches it",
             rc == MLO_ENOMEM ? "out of page-locked host memory" : "the runtime refused it");
    return NULL;
  }
  c->bounce = b;
  return b;
}

/* Queues one piece: staged into slot k on STAGE once the slot's previous
 * copy is out, then copied from the slot on COPY.  bounce_lock held. */
static int bounce_piece(struct cuda_ctx *c, struct cu_bounce *b, char *dst, const char *src,
                        size_t bytes) {
  unsigned k = b->next;
  b->next = (k + 1) % BOUNCE_SLOTS;
  struct piece *p = mlo_malloc(sizeof *p);
  if (!p) return MLO_ENOMEM;
  *p = (struct piece){b->ring + (size_t)k * b->slot_bytes, src, bytes};
  const char *what = "cudaStreamWaitEvent (staging slot drained)";
  cudaError_t e = cudaStreamWaitEvent(b->stage, b->drained[k], 0);
  if (e == cudaSuccess) {
    what = "cudaLaunchHostFunc (staging)";
    e = cudaLaunchHostFunc(b->stage, stage_piece, p);
    if (e != cudaSuccess) free(p); /* not queued: still ours */
  } else {
    free(p);
  }
  if (e == cudaSuccess) {
    what = "cudaEventRecord (staged)";
    e = cudaEventRecord(b->staged[k], b->stage);
  }
  if (e == cudaSuccess) {
    what = "cudaStreamWaitEvent (staged)";
    e = cudaStreamWaitEvent(c->copy, b->staged[k], 0);
  }
  if (e == cudaSuccess) {
    what = "cudaMemcpyAsync (from staging)";
    e = cudaMemcpyAsync(dst, b->ring + (size_t)k * b->slot_bytes, bytes, cudaMemcpyHostToDevice,
                        c->copy);
  }
  if (e == cudaSuccess) {
    what = "cudaEventRecord (staging slot drained)";
    e = cudaEventRecord(b->drained[k], c->copy);
  }
  return cu_status(c, e, what);
}

int cu_bounce_h2d(struct cuda_ctx *c, char *dst, const char *src, size_t bytes) {
  if (!c->pinned || !bytes || cu_page_locked(src, bytes)) return MLO_EUNSUPPORTED;
  pthread_mutex_lock(&c->bounce_lock);
  struct cu_bounce *b = ring(c);
  int rc = b ? MLO_OK : MLO_EUNSUPPORTED;
  for (size_t done = 0; b && !rc && done < bytes; done += b->slot_bytes) {
    size_t n = bytes - done < b->slot_bytes ? bytes - done : b->slot_bytes;
    rc = bounce_piece(c, b, dst + done, src + done, n);
  }
  pthread_mutex_unlock(&c->bounce_lock);
  return rc;
}

void cu_bounce_destroy(struct cuda_ctx *c, bool lost) {
  if (c->bounce) free_ring(c->bounce, lost);
  c->bounce = NULL;
}
