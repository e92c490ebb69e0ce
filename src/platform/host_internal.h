/*
 * host_internal.h — the host-backed device's shared state (host.c: copy
 * engine, events, options, lifetime; host_arena.c: device memory, its
 * first-fit ranges and the scrubber).  Nothing outside src/platform/host*.c
 * includes it.
 */
#ifndef MLO_PLATFORM_HOST_INTERNAL_H
#define MLO_PLATFORM_HOST_INTERNAL_H

#include "platform/platform.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HOST_MIN_BW 1000000u /* bytes per second */
#define HOST_MAX_BW 1e15     /* a modelled link's rate at most (1 PB/s) */
#define HOST_MLOCK_ONFAULT 1 /* linux/mman.h's MLOCK_ONFAULT */
#define HOST_TIMES 1024      /* completion times kept for event_time */

#if defined(__SANITIZE_ADDRESS__)
#define HOST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HOST_ASAN 1
#endif
#endif
#ifdef HOST_ASAN
#include <sanitizer/asan_interface.h>
#define HOST_ASAN_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define HOST_ASAN_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define HOST_ASAN_POISON(p, n) ((void)(p), (void)(n))
#define HOST_ASAN_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define HOST_ALIGN 256 /* block alignment, as cudaMalloc gives */
#define HOST_POISON_BYTE 0xA5
#define HOST_CHUNK_BYTES ((size_t)4 << 20) /* throttling granularity */
#define HOST_JITTER_MAX_US 2000
#define HOST_DEFAULT_CAPACITY ((uint64_t)8 << 30)

struct host_options {
  uint64_t capacity;
  uint64_t bw; /* bytes per second; 0 = unlimited */
  uint64_t seed;
  bool jitter, poison, blocking_d2h, prefault;
  bool srccheck; /* hash each host-to-device source at its queueing and after its copy */
  /* the node it stands in for (group=, uplink=, fabric=, pcie_p2p=) */
  bool node;              /* any of them given: the topology is modelled */
  mlo_node_topology topo; /* link_bps is bw */
  double copy_bps;        /* what copies are held to: bw, or the uplink's share */
};

enum host_op_kind { HOST_OP_H2D, HOST_OP_D2H };

struct host_op {
  enum host_op_kind kind;
  uint64_t seq;
  void *dst;
  const void *src;
  size_t bytes;
  uint64_t queued_ns; /* when it was queued: the link cannot start it sooner */
  uint64_t src_hash;  /* srccheck=1: the source's bytes when the copy was queued */
  struct host_op *next;
};

/* A range of the arena: a live block, or free room (the free list is sorted
 * by offset and coalesced). */
struct host_range {
  size_t off, len;   /* in the arena; len is a multiple of HOST_ALIGN */
  size_t bytes;      /* live: as requested (what is accounted) */
  uint64_t free_seq; /* free: copies up to this sequence number may still use it */
  bool dirty;        /* free: not yet poisoned */
  bool scrubbing;    /* free: the scrubber is filling it (not to be handed out) */
  struct host_range *prev, *next;
};

struct host_ctx {
  struct host_options opt;
  pthread_mutex_t lock;
  pthread_cond_t work_cv; /* the engine: an op arrived or we are stopping */
  pthread_cond_t done_cv; /* waiters and the scrubber: completed_seq advanced,
                             a range was released or scrubbed */
  struct host_op *head, *tail;
  uint64_t submitted_seq, completed_seq;
  /* when each of the last HOST_TIMES ops completed, for event_time */
  uint64_t done_seq[HOST_TIMES], done_ns[HOST_TIMES];
  uint64_t live_bytes; /* allocated and not yet freed by the caller */
  char *arena;
  size_t arena_len;
  size_t touched_end; /* no block ever reached past this offset: all that can be poisoned */
  struct host_range *live, *free_list;
  bool stopping;
  bool pinned_ok;
  bool scrub; /* released ranges are poisoned (poison=1, or ASan) */
  pthread_t engine, scrubber;
  bool scrubber_started;
  uint64_t rng; /* touched by the engine thread only */
  /* a gather that crosses the host links (a node with no fabric of its own,
   * or PCIe peer-to-peer between groups) holds them until then: no copy
   * starts on them before (host_gather_pace); and until when the copy the
   * engine runs now holds them (lock) */
  uint64_t links_busy_until, link_booked;
  uint64_t src_changed; /* srccheck=1: copies whose source changed while queued (lock) */
};

struct mlo_event {
  uint64_t seq;         /* complete once completed_seq >= seq; 0 is always complete */
  uint64_t recorded_ns; /* when it was recorded (its time if nothing was pending) */
};

/* Device memory (host_arena.c).  Called with ctx->lock held where the
 * platform contract says so; the ops-table slots take it themselves. */
int mlo_host_dev_alloc(void *vctx, size_t bytes, void **block);
int mlo_host_dev_free(void *vctx, void *block, size_t bytes);
int mlo_host_get_memory(void *vctx, uint64_t *total, uint64_t *free_bytes);
/* The live block that starts at handle, or NULL (lock held). */
struct host_range *mlo_host_find_live(struct host_ctx *ctx, const void *handle);
/* The scrubber thread: poisons released ranges once their copies ran. */
void *mlo_host_scrubber_main(void *arg);
/* Whether a released range still waits for its scrub (lock held). */
bool mlo_host_scrub_pending(const struct host_ctx *ctx);
/* Frees a list of ranges' bookkeeping (not their memory). */
void mlo_host_free_ranges(struct host_range *b);

#endif
