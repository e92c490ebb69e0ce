/*
 * host.c — the host-backed device ("host:..."): a stand-in for a GPU that
 * runs everywhere, CI included, and keeps a GPU's semantics rather than
 * taking synchronous shortcuts, so that ordering bugs in core show up here.
 * It is also what the benchmarks measure on, so it must cost what a GPU
 * costs and nothing a GPU does not (docs/platforms.md).
 *
 *  - Device memory is one arena reserved at open, carved by a first-fit
 *    sub-allocator, as a GPU's caching allocator carves its pool: memory
 *    once touched stays mapped, so a block reused in the steady state never
 *    page-faults (fresh pages fault at 1.8-2 GB/s, a quarter of memcpy).
 *    prefault=1 touches it all at open, like memory a GPU driver backs.
 *  - srccheck=1 (for tests) hashes each host-to-device source when its copy
 *    is queued and again once it ran: a source rewritten before its copy
 *    completed (a missing wait) counts in mlo_host_sources_changed.
 *  - Copies run on one copy-engine thread per platform, in FIFO order, and
 *    complete later: optionally throttled to a link rate (bw=) and delayed
 *    at random (jitter=), so a missing wait reads stale data.
 *  - Events are sequence numbers on that queue.  Host "compute" runs on the
 *    caller's thread, so a compute-side event is complete when recorded.
 *  - dev_free is stream-ordered, as cudaFreeAsync is: the range is free at
 *    once for allocations whose copies queue after everything submitted so
 *    far (the FIFO keeps the old owner's copies first), and the caller never
 *    waits for it.
 *
 * With poison=1 (the default) a released range is filled with 0xA5 (and
 * ASan-poisoned in ASan builds) by a scrubber thread once the copies queued
 * before its release have run — off the copy queue, so a switch costs its
 * bytes over the link and no more.  A range handed out again before it was
 * scrubbed is simply not scrubbed; synchronize waits for the scrubber, so
 * after it a use-after-evict reads 0xA5 or another component's data.
 *
 * Accounting: used bytes are the requested sizes of live blocks; the bytes
 * of a freed block count as free as soon as dev_free returns.  The arena's
 * address range is twice the capacity (reserved, untouched pages cost
 * nothing) so that fragmentation does not refuse an allocation the
 * accounting allows; first fit keeps what is touched near the low end.
 */
#include "base/sysio.h"
#include "platform/host_internal.h"

#include "base/hash.h"
#include "base/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define now_ns mlo_now_ns /* base/: the monotonic clock, and sleeping to a point on it */
#define sleep_until_ns mlo_sleep_until_ns

/* ---- the copy engine ------------------------------------------------- */

/* Copies at most copy_bps bytes per second (bw=, or the rank's share of its
 * group's uplink where that is less): after each chunk, sleeps until the
 * time the link would have needed for the bytes so far.
 *
 * The link keeps a clock of its own, *link_end: when it would have finished
 * the copies so far.  A copy starts on it when it was queued or when the
 * copy before it finished there, whichever is later, as a DMA engine takes
 * a queued copy the moment the link is free, and not when the engine thread
 * woke from its last sleep: each wake-up's lateness (about 90 us a copy on
 * a loaded 2-core machine, measured back to back at 1.3 MB a copy) would
 * otherwise add up over a streamed forward's hundreds of copies and make
 * the link 3% slower than its rate.  Since no copy starts before it was
 * queued, idle time is never banked: no stretch of copies beats the rate. */
static void throttled_copy(const struct host_ctx *ctx, const struct host_op *op, bool delayed,
                           uint64_t *link_end) {
  if (!(ctx->opt.copy_bps > 0)) {
    memcpy(op->dst, op->src, op->bytes);
    return;
  }
  uint64_t start = op->queued_ns > *link_end ? op->queued_ns : *link_end;
  uint64_t now = now_ns();
  if (delayed || start > now) start = now; /* jitter held it: it starts after the delay */
  for (size_t done = 0; done < op->bytes;) {
    size_t n = op->bytes - done < HOST_CHUNK_BYTES ? op->bytes - done : HOST_CHUNK_BYTES;
    memcpy((char *)op->dst + done, (const char *)op->src + done, n);
    done += n;
    sleep_until_ns(start + (uint64_t)((double)done * 1e9 / ctx->opt.copy_bps));
  }
  *link_end = start + (uint64_t)((double)op->bytes * 1e9 / ctx->opt.copy_bps);
}

/* Three copies in four wait 0-2 ms first, so the moment a copy lands
 * varies from run to run (per seed) and an unordered read sees old data.
 * Returns whether it waited. */
static bool jitter_delay(struct host_ctx *ctx) {
  if (!ctx->opt.jitter) return false;
  uint64_t r = mlo_mix64(ctx->rng); /* splitmix64: hash, then step */
  ctx->rng += MLO_GOLDEN_GAMMA;
  if ((r & 3) == 0) return false;
  uint64_t us = (r >> 8) % (HOST_JITTER_MAX_US + 1);
  sleep_until_ns(now_ns() + us * 1000);
  return true;
}

/* Runs on the engine thread, without the lock: the memory it touches
 * belongs to the queue until the op completes. */
static void run_copy(struct host_ctx *ctx, struct host_op *op, uint64_t *link_end) {
  bool delayed = jitter_delay(ctx);
  throttled_copy(ctx, op, delayed, link_end);
  /* srccheck=1: a DMA reads the source while the copy runs, so a caller
   * that rewrites it before the copy completed (a missing wait) is caught
   * here, whatever bytes happened to land */
  if (ctx->opt.srccheck && op->kind == HOST_OP_H2D &&
      mlo_fnv1a(MLO_FNV_BASIS, op->src, op->bytes) != op->src_hash) {
    pthread_mutex_lock(&ctx->lock);
    ctx->src_changed++;
    pthread_mutex_unlock(&ctx->lock);
  }
}

static void *engine_main(void *arg) {
  struct host_ctx *ctx = arg;
  uint64_t link_end = 0; /* the link's clock (throttled_copy) */
  pthread_mutex_lock(&ctx->lock);
  for (;;) {
    while (!ctx->head && !ctx->stopping) pthread_cond_wait(&ctx->work_cv, &ctx->lock);
    struct host_op *op = ctx->head;
    if (!op) break; /* stopping, and the queue is drained */
    ctx->head = op->next;
    if (!ctx->head) ctx->tail = NULL;
    if (ctx->links_busy_until > link_end) link_end = ctx->links_busy_until; /* a gather's */
    if (ctx->opt.copy_bps > 0) /* what a gather must wait behind (host_gather_pace) */
      ctx->link_booked = (op->queued_ns > link_end ? op->queued_ns : link_end) +
                         (uint64_t)((double)op->bytes * 1e9 / ctx->opt.copy_bps);
    pthread_mutex_unlock(&ctx->lock);
    run_copy(ctx, op, &link_end);
    pthread_mutex_lock(&ctx->lock);
    ctx->completed_seq = op->seq;
    ctx->done_seq[op->seq % HOST_TIMES] = op->seq;
    ctx->done_ns[op->seq % HOST_TIMES] = now_ns();
    free(op);
    pthread_cond_broadcast(&ctx->done_cv);
  }
  pthread_mutex_unlock(&ctx->lock);
  return NULL;
}

/* Called with the lock held. */
static void enqueue(struct host_ctx *ctx, struct host_op *op) {
  op->seq = ++ctx->submitted_seq;
  op->queued_ns = now_ns();
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
  if (!pinned) return MLO_OK;
  /* mlock would fault every page in on this thread before a byte is read.
   * Locked on fault instead, the pages come in as the loader's threads
   * write them, in parallel with the reads (huge pages where cheap). */
  mlo_offer_huge_pages(*ptr, rounded);
#ifdef SYS_mlock2 /* the syscall: glibc declares mlock2 only under _GNU_SOURCE */
  if (syscall(SYS_mlock2, *ptr, rounded, HOST_MLOCK_ONFAULT) == 0) {
    *got_pinned = true;
    return MLO_OK;
  }
#endif
  mlo_touch_pages(*ptr, rounded); /* an older kernel: fault in on several threads, then lock */
  *got_pinned = mlock(*ptr, rounded) == 0;
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
  if (ctx->opt.srccheck && kind == HOST_OP_H2D)
    op->src_hash = mlo_fnv1a(MLO_FNV_BASIS, host_ptr, bytes);
  pthread_mutex_lock(&ctx->lock);
  struct host_range *b = mlo_host_find_live(ctx, handle);
  if (!b || offset > b->bytes || bytes > b->bytes - offset) {
    pthread_mutex_unlock(&ctx->lock);
    free(op);
    return MLO_EINVAL;
  }
  char *device_ptr = ctx->arena + b->off + offset;
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

/* Both queues drain, and so does the scrubber: after it, released memory
 * reads 0xA5 (tests rely on it to see a use-after-evict). */
static int host_synchronize(void *vctx) {
  struct host_ctx *ctx = vctx;
  pthread_mutex_lock(&ctx->lock);
  wait_seq(ctx, ctx->submitted_seq);
  while (mlo_host_scrub_pending(ctx)) pthread_cond_wait(&ctx->done_cv, &ctx->lock);
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

static void host_destroy(void *vctx) {
  struct host_ctx *ctx = vctx;
  pthread_mutex_lock(&ctx->lock);
  ctx->stopping = true;
  pthread_cond_signal(&ctx->work_cv);
  pthread_cond_broadcast(&ctx->done_cv);
  pthread_mutex_unlock(&ctx->lock);
  pthread_join(ctx->engine, NULL); /* the engine drains the queue first */
  if (ctx->scrubber_started) pthread_join(ctx->scrubber, NULL);
  mlo_host_free_ranges(ctx->live); /* blocks the caller leaked */
  mlo_host_free_ranges(ctx->free_list);
  /* Only what blocks ever covered can be poisoned: unpoisoning the whole
   * reserve would write shadow for twice the capacity at every close. */
  HOST_ASAN_UNPOISON(ctx->arena, ctx->touched_end);
  munmap(ctx->arena, ctx->arena_len);
  pthread_cond_destroy(&ctx->done_cv);
  pthread_cond_destroy(&ctx->work_cv);
  pthread_mutex_destroy(&ctx->lock);
  free(ctx);
}

/* ---- the node it stands in for ------------------------------------------ */

static int host_topology(void *vctx, mlo_node_topology *t) {
  struct host_ctx *ctx = vctx;
  if (!ctx->opt.node) return MLO_EUNSUPPORTED;
  *t = ctx->opt.topo;
  return MLO_OK;
}

/* The MPI all-gather through shared memory outruns most fabrics it stands
 * for: hold it to the modelled one (docs/distributed.md, "Topology"). */
static void host_gather_pace(void *vctx, size_t slice, int ranks, uint64_t t0_ns) {
  struct host_ctx *ctx = vctx;
  mlo_load_plan plan = MLO_LOAD_PLAN_INIT;
  if (!ctx->opt.node || ranks < 1 ||
      mlo_node_plan_loads(&ctx->opt.topo, (unsigned)ranks, (uint64_t)slice * (uint64_t)ranks,
                          &plan))
    return;
  /* where the gather's bytes cross the host links (the model's
   * gather_links_s), the copies queued behind it wait for the links too, as
   * on a real node; a fabric of its own leaves them free */
  double on_links = plan.gather_links_s;
  uint64_t end = t0_ns + (uint64_t)(plan.gather_s * 1e9);
  if (on_links > 0) { /* after the copy on the links now, and before the next */
    pthread_mutex_lock(&ctx->lock);
    uint64_t from = ctx->links_busy_until > t0_ns ? ctx->links_busy_until : t0_ns;
    if (ctx->link_booked > from) from = ctx->link_booked;
    ctx->links_busy_until = from + (uint64_t)(on_links * 1e9);
    if (ctx->links_busy_until > end) end = ctx->links_busy_until;
    pthread_mutex_unlock(&ctx->lock);
  }
  sleep_until_ns(end);
}

static const struct mlo_platform_model_ops host_model_ops = {
    .topology = host_topology,
    .gather_pace = host_gather_pace,
};

static const struct mlo_platform_ops host_ops = {
    .name = "host",
    .destroy = host_destroy,
    .get_caps = host_get_caps,
    .get_memory = mlo_host_get_memory,
    .dev_alloc = mlo_host_dev_alloc,
    .dev_free = mlo_host_dev_free,
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
    .model = &host_model_ops,
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
  if (!strcmp(key, "group")) {
    char *end = NULL;
    errno = 0;
    unsigned long v = strtoul(value, &end, 10);
    if (value[0] < '1' || value[0] > '9' || *end || errno || v > 4096)
      return bad_value(err, errlen, key, value, "the ranks behind one uplink, 1 to 4096");
    o->topo.group = (unsigned)v;
    o->node = true;
    return MLO_OK;
  }
  if (!strcmp(key, "uplink") || !strcmp(key, "fabric")) {
    uint64_t v = 0;
    bool fabric = key[0] == 'f';
    if (mlo_parse_size(value, fabric, &v) || (v && (v < HOST_MIN_BW || v > HOST_MAX_BW)))
      return bad_value(err, errlen, key, value,
                       fabric ? "bytes per second from 1e6 to 1e15, or 0 for no peer path"
                              : "bytes per second from 1e6 to 1e15, such as 25e9 or 25G");
    *(fabric ? &o->topo.fabric_bps : &o->topo.uplink_bps) = (double)v;
    o->node = true;
    return MLO_OK;
  }
  if (!strcmp(key, "pcie_p2p")) {
    o->node = true;
    return parse_flag(key, value, &o->topo.fabric_via_uplinks, err, errlen);
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
  if (!strcmp(key, "prefault")) return parse_flag(key, value, &o->prefault, err, errlen);
  if (!strcmp(key, "srccheck")) return parse_flag(key, value, &o->srccheck, err, errlen);
  snprintf(err, errlen,
           "unknown host platform option %s=%s (known: capacity, bw, jitter, seed, poison, "
           "blocking_d2h, prefault, srccheck, group, uplink, fabric, pcie_p2p)",
           key, value);
  return MLO_EINVAL;
}

/* The node options model links, so they need one (bw=); a PCIe fabric
 * needs a rate.  Sets what copies are held to. */
static int node_options(struct host_options *o, char *err, size_t errlen) {
  o->copy_bps = (double)o->bw;
  if (!o->node) return MLO_OK;
  if (!o->bw) {
    snprintf(err, errlen,
             "host platform options group=, uplink=, fabric= and pcie_p2p= model a node's "
             "links: give each rank's link too (bw=)");
    return MLO_EINVAL;
  }
  if (o->topo.fabric_via_uplinks &&
      (!(o->topo.fabric_bps > 0) || !(o->topo.uplink_bps > 0) || o->topo.group < 2)) {
    snprintf(err, errlen,
             "host platform option pcie_p2p=1 models a PCIe fabric through the groups' "
             "uplinks: it needs fabric=, uplink= and group= of 2 or more");
    return MLO_EINVAL;
  }
  o->topo.size = sizeof o->topo;
  o->topo.link_bps = (double)o->bw;
  mlo_load_plan plan = MLO_LOAD_PLAN_INIT; /* the group's ranks all loading: each one's share */
  unsigned group = o->topo.group ? o->topo.group : 1;
  if (mlo_node_plan_loads(&o->topo, group, 0, &plan)) {
    snprintf(err, errlen, "host platform: the node options do not form a topology");
    return MLO_EINVAL;
  }
  if (plan.link_bps < HOST_MIN_BW) { /* a link slower than that looks like a hang */
    snprintf(err, errlen,
             "host platform options uplink=%.0f and group=%u leave each rank %.0f bytes per "
             "second, below 1e6",
             o->topo.uplink_bps, group, plan.link_bps);
    return MLO_EINVAL;
  }
  o->copy_bps = plan.link_bps;
  return MLO_OK;
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
  char node[160] = "";
  if (o->node) {
    const mlo_node_topology *t = &o->topo;
    int n = 0;
    if (t->group > 1 && t->uplink_bps > 0)
      n = snprintf(node, sizeof node, ", %u per uplink of %.2f GB/s", t->group,
                   t->uplink_bps / 1e9);
    if (!(t->fabric_bps > 0))
      snprintf(node + n, sizeof node - (size_t)n, ", no peer path");
    else
      snprintf(node + n, sizeof node - (size_t)n, ", fabric %.2f GB/s%s", t->fabric_bps / 1e9,
               t->fabric_via_uplinks ? " (PCIe peer-to-peer)" : "");
  }
  snprintf(p->description, sizeof p->description, "host-backed, capacity %s, bw %s%s%s%s%s", cap,
           bw, node, o->jitter ? ", jitter" : "", o->blocking_d2h ? ", blocking d2h" : "",
           o->prefault ? ", prefaulted" : "");
}

/* Reserves the arena (twice the capacity of address space, untouched) and
 * with prefault=1 touches the capacity's worth of it now. */
static int map_arena(struct host_ctx *ctx, char *err, size_t errlen) {
  size_t cap = (size_t)((ctx->opt.capacity + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN);
  ctx->arena_len = 2 * cap;
  void *m = mmap(NULL, ctx->arena_len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    char size[32];
    snprintf(err, errlen, "host platform: cannot reserve %s of address space for capacity=%s: %s",
             mlo_format_size(ctx->arena_len, size, sizeof size),
             mlo_format_size(ctx->opt.capacity, (char[32]){0}, 32), strerror(errno));
    return MLO_ENOMEM;
  }
  ctx->arena = m;
  struct host_range *all = mlo_calloc(1, sizeof *all);
  if (!all) {
    munmap(m, ctx->arena_len);
    snprintf(err, errlen, "host platform: out of host memory");
    return MLO_ENOMEM;
  }
  all->len = ctx->arena_len;
  ctx->free_list = all;
  if (ctx->opt.prefault) mlo_touch_pages(ctx->arena, cap);
  return MLO_OK;
}

int mlo_host_platform_create(const char *spec_args, mlo_platform *p, char *err, size_t errlen) {
  struct host_options opt = {.capacity = HOST_DEFAULT_CAPACITY, .poison = true};
  int rc = mlo_spec_parse_kv(spec_args, host_option, &opt, err, errlen);
  if (!rc) rc = node_options(&opt, err, errlen);
  if (rc) return rc;
  struct host_ctx *ctx = mlo_calloc(1, sizeof *ctx);
  if (!ctx) return MLO_ENOMEM;
  ctx->opt = opt;
  ctx->rng = opt.seed;
  ctx->pinned_ok = probe_mlock();
#ifdef HOST_ASAN
  ctx->scrub = true; /* ASan-poison released ranges even without the fill */
#else
  ctx->scrub = opt.poison;
#endif
  rc = map_arena(ctx, err, errlen);
  if (rc) {
    free(ctx);
    return rc;
  }
  pthread_mutex_init(&ctx->lock, NULL);
  pthread_cond_init(&ctx->work_cv, NULL);
  pthread_cond_init(&ctx->done_cv, NULL);
  rc = pthread_create(&ctx->engine, NULL, engine_main, ctx);
  if (!rc && ctx->scrub) {
    rc = pthread_create(&ctx->scrubber, NULL, mlo_host_scrubber_main, ctx);
    if (rc) { /* stop the engine again */
      pthread_mutex_lock(&ctx->lock);
      ctx->stopping = true;
      pthread_cond_signal(&ctx->work_cv);
      pthread_mutex_unlock(&ctx->lock);
      pthread_join(ctx->engine, NULL);
    }
    ctx->scrubber_started = !rc;
  }
  if (rc) {
    snprintf(err, errlen, "host platform: cannot start its threads: %s", strerror(rc));
    pthread_cond_destroy(&ctx->done_cv);
    pthread_cond_destroy(&ctx->work_cv);
    pthread_mutex_destroy(&ctx->lock);
    mlo_host_free_ranges(ctx->free_list);
    munmap(ctx->arena, ctx->arena_len);
    free(ctx);
    return MLO_EPLATFORM;
  }
  p->ops = &host_ops;
  p->ctx = ctx;
  describe(p, &opt);
  return MLO_OK;
}

int mlo_host_sources_changed(mlo_platform *p, uint64_t *n) {
  if (!p || p->ops != &host_ops) return MLO_EINVAL;
  struct host_ctx *ctx = p->ctx;
  pthread_mutex_lock(&ctx->lock);
  *n = ctx->src_changed;
  pthread_mutex_unlock(&ctx->lock);
  return MLO_OK;
}
