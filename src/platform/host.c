/*
 * host.c — the host-backed device ("host:..."): a stand-in for a GPU that
 * runs everywhere, CI included, and keeps a GPU's semantics rather than
 * taking synchronous shortcuts, so that ordering bugs in core show up here.
 *
 *  - Device memory is a separate allocation per block, accounted against a
 *    capacity, so out-of-memory and peak figures are real.
 *  - Copies run on one copy-engine thread per platform, in FIFO order, and
 *    complete later: optionally throttled to a link rate (bw=) and delayed
 *    at random (jitter=), so a missing wait reads stale data.
 *  - Events are sequence numbers on that queue.  Host "compute" runs on the
 *    caller's thread, so a compute-side event is complete when recorded.
 *  - dev_free is stream-ordered: the block is released (and poisoned) by
 *    the engine after every copy submitted before it, never by the caller.
 *
 * Accounting choice: the bytes of a freed block count as free as soon as
 * dev_free returns (free_bytes and the wrapper's used_bytes agree, and an
 * allocation of free_bytes succeeds).  The memory itself is released when
 * the queued free runs; dev_alloc waits for pending frees when it needs
 * their room, the way a stream-ordered pool reuses memory.
 *
 * With poison=1 released blocks are kept (filled with 0xA5, and
 * ASan-poisoned in ASan builds) and handed out again for an allocation of
 * the same size, like a device pool: a use-after-evict reads 0xA5 or
 * another component's data, and under ASan it is reported.  The pool only
 * holds room that is not allocated, so host memory stays within capacity.
 */
#include "base/sysio.h"
#include "platform/platform.h"

#include "base/hash.h"
#include "base/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define HOST_MIN_BW 1000000u /* bytes per second */
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
  bool jitter, poison, blocking_d2h;
};

enum host_op_kind { HOST_OP_H2D, HOST_OP_D2H, HOST_OP_FREE };

struct host_op {
  enum host_op_kind kind;
  uint64_t seq;
  void *dst;
  const void *src;
  size_t bytes;
  struct host_block *block; /* HOST_OP_FREE */
  struct host_op *next;
};

/* Sits in the first HOST_ALIGN bytes of each allocation; the handle given
 * out is the address just past it.  The free op is embedded so that
 * dev_free never allocates and cannot fail. */
struct host_block {
  size_t bytes;                   /* as requested: what is accounted */
  size_t padded;                  /* usable size, multiple of HOST_ALIGN */
  struct host_block *prev, *next; /* live list or pool list */
  struct host_op free_op;
};
_Static_assert(sizeof(struct host_block) <= HOST_ALIGN, "block header must fit its slot");

struct host_ctx {
  struct host_options opt;
  pthread_mutex_t lock;
  pthread_cond_t work_cv; /* the engine: an op arrived or we are stopping */
  pthread_cond_t done_cv; /* waiters: completed_seq advanced, room released */
  struct host_op *head, *tail;
  uint64_t submitted_seq, completed_seq;
  /* when each of the last HOST_TIMES ops completed, for event_time */
  uint64_t done_seq[HOST_TIMES], done_ns[HOST_TIMES];
  uint64_t live_bytes;     /* allocated and not yet freed by the caller */
  uint64_t physical_bytes; /* live plus freed blocks whose free has not run */
  uint64_t pooled_bytes;   /* poisoned blocks kept for reuse (padded) */
  struct host_block *live, *pool;
  bool stopping;
  bool pinned_ok;
  pthread_t engine;
  uint64_t rng; /* touched by the engine thread only */
};

struct mlo_event {
  uint64_t seq;         /* complete once completed_seq >= seq; 0 is always complete */
  uint64_t recorded_ns; /* when it was recorded (its time if nothing was pending) */
};

static void *block_data(struct host_block *b) {
  return (char *)b + HOST_ALIGN;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until_ns(uint64_t deadline) {
  struct timespec ts = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

/* ---- the copy engine ------------------------------------------------- */

/* Copies at most bw bytes per second: after each chunk, sleeps until the
 * time the link would have needed for the bytes so far. */
static void throttled_copy(const struct host_ctx *ctx, void *dst, const void *src, size_t bytes) {
  if (!ctx->opt.bw) {
    memcpy(dst, src, bytes);
    return;
  }
  uint64_t start = now_ns();
  for (size_t done = 0; done < bytes;) {
    size_t n = bytes - done < HOST_CHUNK_BYTES ? bytes - done : HOST_CHUNK_BYTES;
    memcpy((char *)dst + done, (const char *)src + done, n);
    done += n;
    sleep_until_ns(start + (uint64_t)((double)done * 1e9 / (double)ctx->opt.bw));
  }
}

/* Three copies in four wait 0-2 ms first, so the moment a copy lands
 * varies from run to run (per seed) and an unordered read sees old data. */
static void jitter_delay(struct host_ctx *ctx) {
  if (!ctx->opt.jitter) return;
  uint64_t r = mlo_mix64(ctx->rng); /* splitmix64: hash, then step */
  ctx->rng += MLO_GOLDEN_GAMMA;
  if ((r & 3) == 0) return;
  uint64_t us = (r >> 8) % (HOST_JITTER_MAX_US + 1);
  sleep_until_ns(now_ns() + us * 1000);
}

/* Runs on the engine thread, without the lock: the memory it touches
 * belongs to the queue until the op completes. */
static void run_copy(struct host_ctx *ctx, struct host_op *op) {
  jitter_delay(ctx);
  throttled_copy(ctx, op->dst, op->src, op->bytes);
}

/* Called with the lock held: releases a freed block's memory to the pool
 * (poisoned) or to the system. */
static void release_block(struct host_ctx *ctx, struct host_block *b) {
  ctx->physical_bytes -= b->bytes;
  if (!ctx->opt.poison) {
    free(b);
    return;
  }
  b->prev = NULL;
  b->next = ctx->pool;
  if (ctx->pool) ctx->pool->prev = b;
  ctx->pool = b;
  ctx->pooled_bytes += b->padded;
}

static void *engine_main(void *arg) {
  struct host_ctx *ctx = arg;
  pthread_mutex_lock(&ctx->lock);
  for (;;) {
    while (!ctx->head && !ctx->stopping) pthread_cond_wait(&ctx->work_cv, &ctx->lock);
    struct host_op *op = ctx->head;
    if (!op) break; /* stopping, and the queue is drained */
    ctx->head = op->next;
    if (!ctx->head) ctx->tail = NULL;
    pthread_mutex_unlock(&ctx->lock);

    if (op->kind == HOST_OP_FREE && ctx->opt.poison) {
      memset(block_data(op->block), HOST_POISON_BYTE, op->block->padded);
      HOST_ASAN_POISON(block_data(op->block), op->block->padded);
    } else if (op->kind != HOST_OP_FREE) {
      run_copy(ctx, op);
    }

    pthread_mutex_lock(&ctx->lock);
    ctx->completed_seq = op->seq;
    ctx->done_seq[op->seq % HOST_TIMES] = op->seq;
    ctx->done_ns[op->seq % HOST_TIMES] = now_ns();
    if (op->kind == HOST_OP_FREE)
      release_block(ctx, op->block); /* op lives in it */
    else
      free(op);
    pthread_cond_broadcast(&ctx->done_cv);
  }
  pthread_mutex_unlock(&ctx->lock);
  return NULL;
}

/* Called with the lock held. */
static void enqueue(struct host_ctx *ctx, struct host_op *op) {
  op->seq = ++ctx->submitted_seq;
  op->next = NULL;
  if (ctx->tail)
    ctx->tail->next = op;
  else
    ctx->head = op;
  ctx->tail = op;
  pthread_cond_signal(&ctx->work_cv);
}

static void wait_seq(struct host_ctx *ctx, uint64_t seq) {
  while (ctx->completed_seq < seq) pthread_cond_wait(&ctx->done_cv, &ctx->lock);
}

/* ---- device memory ----------------------------------------------------- */

/* Called with the lock held; NULL if handle is not a live block. */
static struct host_block *find_live(struct host_ctx *ctx, const void *handle) {
  for (struct host_block *b = ctx->live; b; b = b->next)
    if (block_data(b) == handle) return b;
  return NULL;
}

static void unlink_block(struct host_block **list, struct host_block *b) {
  if (b->prev)
    b->prev->next = b->next;
  else
    *list = b->next;
  if (b->next) b->next->prev = b->prev;
}

/* Called with the lock held: a pooled block of exactly this size, or room
 * made for a new one by returning pooled blocks to the system. */
static struct host_block *take_pooled(struct host_ctx *ctx, size_t padded) {
  for (struct host_block *b = ctx->pool; b; b = b->next) {
    if (b->padded != padded) continue;
    unlink_block(&ctx->pool, b);
    ctx->pooled_bytes -= padded;
    HOST_ASAN_UNPOISON(block_data(b), padded);
    return b;
  }
  while (ctx->pool && ctx->physical_bytes + ctx->pooled_bytes > ctx->opt.capacity) {
    struct host_block *b = ctx->pool;
    unlink_block(&ctx->pool, b);
    ctx->pooled_bytes -= b->padded;
    HOST_ASAN_UNPOISON(block_data(b), b->padded);
    free(b);
  }
  return NULL;
}

static int host_dev_alloc(void *vctx, size_t bytes, void **block) {
  struct host_ctx *ctx = vctx;
  *block = NULL;
  if (bytes > SIZE_MAX - 2 * HOST_ALIGN) return MLO_ENOMEM_DEVICE;
  size_t padded = bytes ? (bytes + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN : HOST_ALIGN;

  pthread_mutex_lock(&ctx->lock);
  if (bytes > ctx->opt.capacity - ctx->live_bytes) {
    pthread_mutex_unlock(&ctx->lock);
    return MLO_ENOMEM_DEVICE;
  }
  ctx->live_bytes += bytes;
  /* The room is ours (live fits), but a queued free may still hold it:
   * wait for the engine to release it rather than overcommit. */
  while (ctx->physical_bytes + bytes > ctx->opt.capacity)
    pthread_cond_wait(&ctx->done_cv, &ctx->lock);
  ctx->physical_bytes += bytes;
  struct host_block *b = take_pooled(ctx, padded);
  pthread_mutex_unlock(&ctx->lock);

  if (!b) b = mlo_aligned_alloc(HOST_ALIGN, HOST_ALIGN + padded);
  pthread_mutex_lock(&ctx->lock);
  if (!b) {
    /* The host ran out before the modelled device did: that is host memory
     * (MLO_ENOMEM), not a device too small, and must be reported as such. */
    ctx->live_bytes -= bytes;
    ctx->physical_bytes -= bytes;
    pthread_cond_broadcast(&ctx->done_cv);
    pthread_mutex_unlock(&ctx->lock);
    return MLO_ENOMEM;
  }
  b->bytes = bytes;
  b->padded = padded;
  b->prev = NULL;
  b->next = ctx->live;
  if (ctx->live) ctx->live->prev = b;
  ctx->live = b;
  pthread_mutex_unlock(&ctx->lock);
  *block = block_data(b);
  return MLO_OK;
}

static void host_dev_free(void *vctx, void *block, size_t bytes) {
  struct host_ctx *ctx = vctx;
  pthread_mutex_lock(&ctx->lock);
  struct host_block *b = find_live(ctx, block);
  if (!b) {
    pthread_mutex_unlock(&ctx->lock);
    mlo_logf(MLO_LOG_ERROR, "host platform: dev_free of %p, which is not a live block", block);
    return;
  }
  if (b->bytes != bytes)
    mlo_logf(MLO_LOG_WARN, "host platform: dev_free of a %zu-byte block as %zu bytes", b->bytes,
             bytes);
  unlink_block(&ctx->live, b);
  ctx->live_bytes -= b->bytes;
  b->free_op = (struct host_op){.kind = HOST_OP_FREE, .block = b};
  enqueue(ctx, &b->free_op);
  pthread_mutex_unlock(&ctx->lock);
}

static int host_get_memory(void *vctx, uint64_t *total, uint64_t *free_bytes) {
  struct host_ctx *ctx = vctx;
  pthread_mutex_lock(&ctx->lock);
  *total = ctx->opt.capacity;
  *free_bytes = ctx->opt.capacity - ctx->live_bytes;
  pthread_mutex_unlock(&ctx->lock);
  return MLO_OK;
}

/* ---- host memory ------------------------------------------------------- */

static size_t page_round(size_t bytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (bytes > SIZE_MAX - page) return 0;
  return bytes ? (bytes + page - 1) / page * page : page;
}

/* There is no DMA to pin for; "pinned" means mlock succeeded, which is what
 * page-locked means, and nothing is claimed when it did not. */
static int host_host_alloc(void *vctx, size_t bytes, bool pinned, void **ptr, bool *got_pinned) {
  (void)vctx;
  *ptr = NULL;
  *got_pinned = false;
  size_t rounded = page_round(bytes);
  if (!rounded) return MLO_ENOMEM;
  *ptr = mlo_aligned_alloc((size_t)sysconf(_SC_PAGESIZE), rounded);
  if (!*ptr) return MLO_ENOMEM;
  if (pinned) *got_pinned = mlock(*ptr, rounded) == 0;
  return MLO_OK;
}

static void host_host_free(void *vctx, void *ptr, size_t bytes, bool pinned) {
  (void)vctx;
  if (pinned) munlock(ptr, page_round(bytes)); /* harmless if mlock had failed */
  free(ptr);
}

/* ---- copies ------------------------------------------------------------ */

/* Validates a block range and queues a copy; the lock covers the lookup so
 * a concurrent dev_free cannot slip between check and enqueue. */
static int queue_copy(struct host_ctx *ctx, enum host_op_kind kind, const void *handle,
                      size_t offset, void *host_ptr, size_t bytes) {
  if (!host_ptr) return MLO_EINVAL;
  if (!bytes) return MLO_OK;
  struct host_op *op = mlo_calloc(1, sizeof *op);
  if (!op) return MLO_ENOMEM;
  pthread_mutex_lock(&ctx->lock);
  struct host_block *b = find_live(ctx, handle);
  if (!b || offset > b->bytes || bytes > b->bytes - offset) {
    pthread_mutex_unlock(&ctx->lock);
    free(op);
    return MLO_EINVAL;
  }
  char *device_ptr = (char *)block_data(b) + offset;
  op->kind = kind;
  op->dst = kind == HOST_OP_H2D ? (void *)device_ptr : host_ptr;
  op->src = kind == HOST_OP_H2D ? (const void *)host_ptr : device_ptr;
  op->bytes = bytes;
  enqueue(ctx, op);
  pthread_mutex_unlock(&ctx->lock);
  return MLO_OK;
}

/* The source is only read, by the engine, until the copy completes. */
static int host_copy_h2d(void *vctx, void *block, size_t offset, const void *src, size_t bytes) {
  return queue_copy(vctx, HOST_OP_H2D, block, offset, (void *)(uintptr_t)src, bytes);
}

static int host_copy_d2h(void *vctx, void *dst, const void *block, size_t offset, size_t bytes) {
  return queue_copy(vctx, HOST_OP_D2H, block, offset, dst, bytes);
}

/* ---- events ------------------------------------------------------------ */

static int host_event_create(void *vctx, mlo_event **ev) {
  (void)vctx;
  *ev = mlo_calloc(1, sizeof **ev);
  return *ev ? MLO_OK : MLO_ENOMEM;
}

/* The queue never points at an event (records are sequence numbers), so a
 * pending event can be freed at once. */
static void host_event_destroy(void *vctx, mlo_event *ev) {
  (void)vctx;
  free(ev);
}

/* Completes when everything queued so far has: the same as a marker op. */
static int host_event_record_copy(void *vctx, mlo_event *ev) {
  struct host_ctx *ctx = vctx;
  pthread_mutex_lock(&ctx->lock);
  ev->seq = ctx->submitted_seq > ctx->completed_seq ? ctx->submitted_seq : 0;
  ev->recorded_ns = now_ns();
  pthread_mutex_unlock(&ctx->lock);
  return MLO_OK;
}

/* Host compute ran synchronously on the caller's thread: already done. */
static int host_event_record_compute(void *vctx, mlo_event *ev) {
  struct host_ctx *ctx = vctx;
  pthread_mutex_lock(&ctx->lock);
  ev->seq = 0;
  ev->recorded_ns = now_ns();
  pthread_mutex_unlock(&ctx->lock);
  return MLO_OK;
}

/* The compute queue is the calling thread, so it waits like the host. */
static int host_event_sync(void *vctx, mlo_event *ev) {
  struct host_ctx *ctx = vctx;
  pthread_mutex_lock(&ctx->lock);
  wait_seq(ctx, ev->seq);
  pthread_mutex_unlock(&ctx->lock);
  return MLO_OK;
}

/* Nothing to queue: an event is either compute-side (complete when
 * recorded) or a point earlier on this same FIFO queue, which every later
 * op already follows. */
static int host_copy_wait(void *vctx, mlo_event *ev) {
  (void)vctx;
  (void)ev;
  return MLO_OK;
}

/* The engine stamps each op as it completes; an event is the op it follows. */
static int host_event_time(void *vctx, mlo_event *ev, uint64_t *t_ns) {
  struct host_ctx *ctx = vctx;
  pthread_mutex_lock(&ctx->lock);
  int rc = MLO_OK;
  if (!ev->seq)
    *t_ns = ev->recorded_ns;
  else if (ctx->completed_seq < ev->seq)
    rc = MLO_EBUSY;
  else if (ctx->done_seq[ev->seq % HOST_TIMES] == ev->seq)
    *t_ns = ctx->done_ns[ev->seq % HOST_TIMES];
  else
    rc = MLO_EUNSUPPORTED; /* long gone from the ring */
  pthread_mutex_unlock(&ctx->lock);
  return rc;
}

static int host_event_query(void *vctx, mlo_event *ev) {
  struct host_ctx *ctx = vctx;
  pthread_mutex_lock(&ctx->lock);
  int rc = ctx->completed_seq >= ev->seq ? MLO_OK : MLO_EBUSY;
  pthread_mutex_unlock(&ctx->lock);
  return rc;
}

static int host_synchronize(void *vctx) {
  struct host_ctx *ctx = vctx;
  pthread_mutex_lock(&ctx->lock);
  wait_seq(ctx, ctx->submitted_seq);
  pthread_mutex_unlock(&ctx->lock);
  return MLO_OK;
}

/* ---- lifetime ---------------------------------------------------------- */

static void host_get_caps(void *vctx, mlo_platform_caps *caps) {
  struct host_ctx *ctx = vctx;
  *caps = (mlo_platform_caps){
      .async_copy = true,
      .events = true,
      .pinned_host = ctx->pinned_ok,
      .host_register = false,
      .blocking_d2h = ctx->opt.blocking_d2h,
      .device_pointers = true,
      .host_addressable = true,
  };
}

static void free_list(struct host_block *b, bool asan_poisoned) {
  while (b) {
    struct host_block *next = b->next;
    if (asan_poisoned) HOST_ASAN_UNPOISON(block_data(b), b->padded);
    free(b);
    b = next;
  }
}

static void host_destroy(void *vctx) {
  struct host_ctx *ctx = vctx;
  pthread_mutex_lock(&ctx->lock);
  ctx->stopping = true;
  pthread_cond_signal(&ctx->work_cv);
  pthread_mutex_unlock(&ctx->lock);
  pthread_join(ctx->engine, NULL); /* the engine drains the queue first */
  free_list(ctx->live, false);     /* blocks the caller leaked */
  free_list(ctx->pool, true);
  pthread_cond_destroy(&ctx->done_cv);
  pthread_cond_destroy(&ctx->work_cv);
  pthread_mutex_destroy(&ctx->lock);
  free(ctx);
}

static const struct mlo_platform_ops host_ops = {
    .name = "host",
    .destroy = host_destroy,
    .get_caps = host_get_caps,
    .get_memory = host_get_memory,
    .dev_alloc = host_dev_alloc,
    .dev_free = host_dev_free,
    .host_alloc = host_host_alloc,
    .host_free = host_host_free,
    .copy_h2d = host_copy_h2d,
    .copy_d2h = host_copy_d2h,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record_copy = host_event_record_copy,
    .event_record_compute = host_event_record_compute,
    .compute_wait = host_event_sync,
    .copy_wait = host_copy_wait,
    .event_sync = host_event_sync,
    .event_query = host_event_query,
    .event_time = host_event_time,
    .synchronize = host_synchronize,
    .compute_queue = NULL, /* host compute runs on the calling thread */
};

/* ---- options ----------------------------------------------------------- */

static int bad_value(char *err, size_t errlen, const char *key, const char *value,
                     const char *expected) {
  snprintf(err, errlen, "host platform option %s=%s: expected %s", key, value, expected);
  return MLO_EINVAL;
}

static int parse_flag(const char *key, const char *value, bool *out, char *err, size_t errlen) {
  if (!strcmp(value, "0") || !strcmp(value, "1")) {
    *out = value[0] == '1';
    return MLO_OK;
  }
  return bad_value(err, errlen, key, value, "0 or 1");
}

static int host_option(const char *key, const char *value, void *user, char *err, size_t errlen) {
  struct host_options *o = user;
  if (!strcmp(key, "capacity")) {
    if (mlo_parse_size(value, false, &o->capacity) || o->capacity > SIZE_MAX / 2)
      return bad_value(err, errlen, key, value, "a size such as 8G or 512M");
    return MLO_OK;
  }
  if (!strcmp(key, "bw")) {
    /* Below 1 MB/s a modelled link is not a link: bw=1 would take a day per
     * 100 KB and look like a hang. */
    if (mlo_parse_size(value, false, &o->bw) || o->bw < HOST_MIN_BW)
      return bad_value(err, errlen, key, value,
                       "bytes per second of at least 1e6, such as 25e9 or 25G");
    return MLO_OK;
  }
  if (!strcmp(key, "seed")) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(value, &end, 10);
    if (value[0] < '0' || value[0] > '9' || *end || errno)
      return bad_value(err, errlen, key, value, "a non-negative integer");
    o->seed = v;
    return MLO_OK;
  }
  if (!strcmp(key, "jitter")) return parse_flag(key, value, &o->jitter, err, errlen);
  if (!strcmp(key, "poison")) return parse_flag(key, value, &o->poison, err, errlen);
  if (!strcmp(key, "blocking_d2h")) return parse_flag(key, value, &o->blocking_d2h, err, errlen);
  snprintf(err, errlen,
           "unknown host platform option %s=%s (known: capacity, bw, jitter, seed, poison, "
           "blocking_d2h)",
           key, value);
  return MLO_EINVAL;
}

/* Whether page-locking works here at all (RLIMIT_MEMLOCK, privileges). */
static bool probe_mlock(void) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  void *p = mlo_aligned_alloc(page, page);
  if (!p) return false;
  bool ok = mlock(p, page) == 0;
  if (ok) munlock(p, page);
  free(p);
  return ok;
}

static void describe(mlo_platform *p, const struct host_options *o) {
  char cap[32], bw[48] = "unlimited";
  mlo_format_size(o->capacity, cap, sizeof cap);
  if (o->bw) snprintf(bw, sizeof bw, "%.2f GB/s", (double)o->bw / 1e9);
  snprintf(p->description, sizeof p->description, "host-backed, capacity %s, bw %s%s%s", cap, bw,
           o->jitter ? ", jitter" : "", o->blocking_d2h ? ", blocking d2h" : "");
}

int mlo_host_platform_create(const char *spec_args, mlo_platform *p, char *err, size_t errlen) {
  struct host_options opt = {.capacity = HOST_DEFAULT_CAPACITY, .poison = true};
  int rc = mlo_spec_parse_kv(spec_args, host_option, &opt, err, errlen);
  if (rc) return rc;
  struct host_ctx *ctx = mlo_calloc(1, sizeof *ctx);
  if (!ctx) return MLO_ENOMEM;
  ctx->opt = opt;
  ctx->rng = opt.seed;
  ctx->pinned_ok = probe_mlock();
  pthread_mutex_init(&ctx->lock, NULL);
  pthread_cond_init(&ctx->work_cv, NULL);
  pthread_cond_init(&ctx->done_cv, NULL);
  rc = pthread_create(&ctx->engine, NULL, engine_main, ctx);
  if (rc) {
    snprintf(err, errlen, "host platform: cannot start the copy engine thread: %s", strerror(rc));
    goto out_destroy_sync;
  }
  p->ops = &host_ops;
  p->ctx = ctx;
  describe(p, &opt);
  return MLO_OK;

out_destroy_sync:
  pthread_cond_destroy(&ctx->done_cv);
  pthread_cond_destroy(&ctx->work_cv);
  pthread_mutex_destroy(&ctx->lock);
  free(ctx);
  return MLO_EPLATFORM;
}
