/*
 * sim.c — the simulated platform behind `mlo plan`: a device that stores no
 * bytes and keeps time on a virtual clock, so that the residency machinery,
 * the policies and the trace run unchanged and a 60 GB pipeline projects in
 * milliseconds with no host memory spent on it (docs/plan.md).
 *
 * The model is the host platform's, with time made up instead of spent:
 *
 *  - one clock, NOW, for the calling thread and the compute queue (on host
 *    compute runs on the calling thread, so they are the same timeline);
 *    mlo_sim_compute advances it by a forward's modelled duration;
 *  - one copy queue, busy until COPY_FREE: a copy enqueued at NOW starts at
 *    max(NOW, COPY_FREE) and takes bytes / link;
 *  - an event is a time: recorded on the copy queue it completes at
 *    max(NOW, COPY_FREE), on the compute queue at NOW;
 *  - waiting is moving a clock: compute_wait and event_sync set NOW to at
 *    least the event's time (that difference is the stall core measures),
 *    copy_wait sets COPY_FREE to at least it, synchronize sets NOW to at
 *    least COPY_FREE;
 *  - one disk, busy until DISK_FREE: a read of a disk-tier load (core's
 *    disk.c, through mlo_sim_disk_read) issued at NOW ends at
 *    max(NOW, DISK_FREE) + bytes / disk, and the copy queue takes nothing
 *    after it before then (the reader queues a chunk's copy once it is
 *    read; chunk by chunk, reads and copies overlap);
 *  - device memory is a counter against the capacity; a block is a small
 *    handle.  Host memory is address space reserved with PROT_NONE: a slab
 *    of 28 GB costs nothing, and reading one faults rather than returning
 *    bytes that were never there (core fills none on this platform);
 *  - several devices (one pipeline over several, docs/placement.md): each
 *    sim platform has its own memory and copy queue, and those joined by
 *    mlo_sim_share_clock share NOW and the disk: one calling thread runs
 *    every device's forwards one after another, as on two host stand-ins,
 *    and one host's disk feeds them; a copy on one device's link overlaps
 *    another's.  A run's wall is then NOW on any of them.
 *
 * Not modelled: the host's own time (the library's bookkeeping is
 * microseconds per switch), page faults, a link shared with other traffic,
 * and copies slower than the link for pageable memory (slabs count as
 * pinned).  Frees are immediate: on host they are ordered after queued work,
 * which the single copy queue orders anyway.
 */
#include "base/sysio.h"
#include "platform/fault.h"
#include "platform/platform.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define SIM_DEFAULT_CAPACITY (80ull << 30)
#define SIM_DEFAULT_LINK 25000000000ull /* a PCIe 4.0 x16 link, pinned */
#define SIM_MIN_LINK 1000000ull         /* as the host platform's bw= */
#define SIM_DEFAULT_DISK 3000000000ull  /* a PCIe 4.0 NVMe SSD's sustained read */
#define SIM_MAX_CAPACITY (1ull << 46)   /* 64 TiB: past any device */
#define SIM_EPOCH_NS 1000000000ull      /* the clock starts at 1 s, never 0 */

struct mlo_event {
  uint64_t t; /* completes at this virtual time */
};

/* The calling thread's time and the disk: one per sim platform, or one
 * for those joined by mlo_sim_share_clock.  Its lock guards every field of
 * the contexts that share it. */
struct sim_clock {
  pthread_mutex_t lock;
  unsigned refs;
  uint64_t now, disk_free; /* ns */
};

struct sim_ctx {
  struct sim_clock *clk;
  uint64_t capacity, used, link, disk;
  uint64_t copy_free; /* ns: this device's copy queue */
};

static struct sim_clock *clock_new(void) {
  struct sim_clock *c = mlo_calloc(1, sizeof *c);
  if (!c) return NULL;
  pthread_mutex_init(&c->lock, NULL);
  c->refs = 1;
  c->now = c->disk_free = SIM_EPOCH_NS;
  return c;
}

static void clock_drop(struct sim_clock *c) {
  pthread_mutex_lock(&c->lock);
  bool last = --c->refs == 0;
  pthread_mutex_unlock(&c->lock);
  if (!last) return;
  pthread_mutex_destroy(&c->lock);
  free(c);
}

static uint64_t max_u64(uint64_t a, uint64_t b) {
  return a > b ? a : b;
}

static void sim_destroy(void *ctx) {
  struct sim_ctx *s = ctx;
  clock_drop(s->clk);
  free(s);
}

static void sim_get_caps(void *ctx, mlo_platform_caps *caps) {
  (void)ctx;
  memset(caps, 0, sizeof *caps);
  caps->async_copy = true;
  caps->events = true;
  caps->pinned_host = true;
  caps->simulated = true;
}

static int sim_get_memory(void *ctx, uint64_t *total, uint64_t *free_bytes) {
  struct sim_ctx *s = ctx;
  pthread_mutex_lock(&s->clk->lock);
  *total = s->capacity;
  *free_bytes = s->capacity - s->used;
  pthread_mutex_unlock(&s->clk->lock);
  return MLO_OK;
}

static int sim_dev_alloc(void *ctx, size_t bytes, void **block) {
  struct sim_ctx *s = ctx;
  pthread_mutex_lock(&s->clk->lock);
  bool fits = bytes <= s->capacity - s->used;
  if (fits) s->used += bytes;
  pthread_mutex_unlock(&s->clk->lock);
  if (!fits) return MLO_ENOMEM_DEVICE;
  *block = mlo_malloc(16); /* a unique handle; never read */
  if (*block) return MLO_OK;
  pthread_mutex_lock(&s->clk->lock);
  s->used -= bytes;
  pthread_mutex_unlock(&s->clk->lock);
  return MLO_ENOMEM;
}

static int sim_dev_free(void *ctx, void *block, size_t bytes) {
  struct sim_ctx *s = ctx;
  free(block);
  pthread_mutex_lock(&s->clk->lock);
  s->used -= bytes;
  pthread_mutex_unlock(&s->clk->lock);
  return MLO_OK;
}

static int sim_host_alloc(void *ctx, size_t bytes, bool pinned, void **ptr, bool *got_pinned) {
  (void)ctx;
  void *m =
      mmap(NULL, bytes ? bytes : 1, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return MLO_ENOMEM;
  *ptr = m;
  *got_pinned = pinned;
  return MLO_OK;
}

static void sim_host_free(void *ctx, void *ptr, size_t bytes, bool pinned) {
  (void)ctx;
  (void)pinned;
  munmap(ptr, bytes ? bytes : 1);
}

/* A copy of bytes queued now: the link's time, after what is queued. */
static void enqueue_copy(struct sim_ctx *s, size_t bytes) {
  pthread_mutex_lock(&s->clk->lock);
  uint64_t start = max_u64(s->clk->now, s->copy_free);
  s->copy_free = start + (uint64_t)((double)bytes * 1e9 / (double)s->link + 0.5);
  pthread_mutex_unlock(&s->clk->lock);
}

static int sim_copy_h2d(void *ctx, void *block, size_t offset, const void *src, size_t bytes) {
  (void)block;
  (void)offset;
  (void)src;
  enqueue_copy(ctx, bytes);
  return MLO_OK;
}

static int sim_copy_d2h(void *ctx, void *dst, const void *block, size_t offset, size_t bytes) {
  (void)dst;
  (void)block;
  (void)offset;
  enqueue_copy(ctx, bytes);
  return MLO_OK;
}

static int sim_event_create(void *ctx, mlo_event **ev) {
  (void)ctx;
  *ev = mlo_calloc(1, sizeof **ev);
  return *ev ? MLO_OK : MLO_ENOMEM;
}

static void sim_event_destroy(void *ctx, mlo_event *ev) {
  (void)ctx;
  free(ev);
}

static int sim_event_record_copy(void *ctx, mlo_event *ev) {
  struct sim_ctx *s = ctx;
  pthread_mutex_lock(&s->clk->lock);
  ev->t = max_u64(s->clk->now, s->copy_free);
  pthread_mutex_unlock(&s->clk->lock);
  return MLO_OK;
}

static int sim_event_record_compute(void *ctx, mlo_event *ev) {
  struct sim_ctx *s = ctx;
  pthread_mutex_lock(&s->clk->lock);
  ev->t = s->clk->now;
  pthread_mutex_unlock(&s->clk->lock);
  return MLO_OK;
}

/* The calling thread (and with it the compute queue) waits for ev. */
static int sim_host_wait(void *ctx, mlo_event *ev) {
  struct sim_ctx *s = ctx;
  pthread_mutex_lock(&s->clk->lock);
  s->clk->now = max_u64(s->clk->now, ev->t);
  pthread_mutex_unlock(&s->clk->lock);
  return MLO_OK;
}

static int sim_copy_wait(void *ctx, mlo_event *ev) {
  struct sim_ctx *s = ctx;
  pthread_mutex_lock(&s->clk->lock);
  s->copy_free = max_u64(s->copy_free, ev->t);
  pthread_mutex_unlock(&s->clk->lock);
  return MLO_OK;
}

static int sim_event_query(void *ctx, mlo_event *ev) {
  struct sim_ctx *s = ctx;
  pthread_mutex_lock(&s->clk->lock);
  bool done = ev->t <= s->clk->now;
  pthread_mutex_unlock(&s->clk->lock);
  return done ? MLO_OK : MLO_EBUSY;
}

static int sim_event_time(void *ctx, mlo_event *ev, uint64_t *t_ns) {
  int rc = sim_event_query(ctx, ev);
  if (!rc) *t_ns = ev->t;
  return rc;
}

static int sim_synchronize(void *ctx) {
  struct sim_ctx *s = ctx;
  pthread_mutex_lock(&s->clk->lock);
  s->clk->now = max_u64(s->clk->now, s->copy_free);
  pthread_mutex_unlock(&s->clk->lock);
  return MLO_OK;
}

static uint64_t sim_now_ns(void *ctx) {
  struct sim_ctx *s = ctx;
  pthread_mutex_lock(&s->clk->lock);
  uint64_t t = s->clk->now;
  pthread_mutex_unlock(&s->clk->lock);
  return t;
}

static const struct mlo_platform_model_ops sim_model_ops = {.now_ns = sim_now_ns};

static const struct mlo_platform_ops sim_ops = {
    .name = "sim",
    .destroy = sim_destroy,
    .get_caps = sim_get_caps,
    .get_memory = sim_get_memory,
    .dev_alloc = sim_dev_alloc,
    .dev_free = sim_dev_free,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .copy_h2d = sim_copy_h2d,
    .copy_d2h = sim_copy_d2h,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record_copy = sim_event_record_copy,
    .event_record_compute = sim_event_record_compute,
    .compute_wait = sim_host_wait,
    .copy_wait = sim_copy_wait,
    .event_sync = sim_host_wait,
    .event_query = sim_event_query,
    .event_time = sim_event_time,
    .synchronize = sim_synchronize,
    .model = &sim_model_ops,
};

int mlo_sim_compute(mlo_platform *p, uint64_t ns) {
  if (mlo_fault_is(p)) p = mlo_fault_inner(p); /* a fault sweep over a projection */
  if (!p || p->ops != &sim_ops) return MLO_EINVAL;
  struct sim_ctx *s = p->ctx;
  pthread_mutex_lock(&s->clk->lock);
  s->clk->now += ns;
  pthread_mutex_unlock(&s->clk->lock);
  return MLO_OK;
}

int mlo_sim_disk_read(mlo_platform *p, uint64_t bytes) {
  if (mlo_fault_is(p)) p = mlo_fault_inner(p);
  if (!p || p->ops != &sim_ops) return MLO_EINVAL;
  struct sim_ctx *s = p->ctx;
  pthread_mutex_lock(&s->clk->lock);
  s->clk->disk_free = max_u64(s->clk->now, s->clk->disk_free) +
                      (uint64_t)((double)bytes * 1e9 / (double)s->disk + 0.5);
  s->copy_free = max_u64(s->copy_free, s->clk->disk_free);
  pthread_mutex_unlock(&s->clk->lock);
  return MLO_OK;
}

int mlo_sim_share_clock(mlo_platform *p, mlo_platform *with) {
  if (p && mlo_fault_is(p)) p = mlo_fault_inner(p);
  if (with && mlo_fault_is(with)) with = mlo_fault_inner(with);
  if (!p || !with || p->ops != &sim_ops || with->ops != &sim_ops) return MLO_EINVAL;
  struct sim_ctx *s = p->ctx, *w = with->ctx;
  if (s->clk == w->clk) return MLO_OK;
  pthread_mutex_lock(&s->clk->lock);
  bool fresh = s->clk->refs == 1 && s->clk->now == SIM_EPOCH_NS &&
               s->clk->disk_free == SIM_EPOCH_NS && s->copy_free == SIM_EPOCH_NS && !s->used;
  pthread_mutex_unlock(&s->clk->lock);
  if (!fresh) return MLO_ESTATE; /* its time has begun: joining would rewrite it */
  pthread_mutex_lock(&w->clk->lock);
  w->clk->refs++;
  s->copy_free = w->clk->now > s->copy_free ? w->clk->now : s->copy_free;
  pthread_mutex_unlock(&w->clk->lock);
  clock_drop(s->clk);
  s->clk = w->clk;
  return MLO_OK;
}

struct sim_options {
  uint64_t capacity, link, disk;
};

static int sim_option(const char *key, const char *value, void *user, char *err, size_t errlen) {
  struct sim_options *o = user;
  if (!strcmp(key, "capacity")) {
    if (mlo_parse_size(value, false, &o->capacity) || o->capacity > SIM_MAX_CAPACITY) {
      snprintf(err, errlen, "sim platform option capacity=%s: expected a size such as 80G", value);
      return MLO_EINVAL;
    }
    return MLO_OK;
  }
  if (!strcmp(key, "disk")) {
    if (mlo_parse_size(value, false, &o->disk) || o->disk < SIM_MIN_LINK) {
      snprintf(err, errlen,
               "sim platform option disk=%s: expected the disk's read rate in bytes per second, "
               "at least 1e6, such as 3e9",
               value);
      return MLO_EINVAL;
    }
    return MLO_OK;
  }
  if (!strcmp(key, "link") || !strcmp(key, "bw")) {
    if (mlo_parse_size(value, false, &o->link) || o->link < SIM_MIN_LINK) {
      snprintf(err, errlen,
               "sim platform option %s=%s: expected bytes per second of at least 1e6, such as "
               "55e9",
               key, value);
      return MLO_EINVAL;
    }
    return MLO_OK;
  }
  snprintf(err, errlen, "unknown sim platform option %s=%s (known: capacity, link, disk)", key,
           value);
  return MLO_EINVAL;
}

int mlo_sim_platform_create(const char *spec_args, mlo_platform *p, char *err, size_t errlen) {
  struct sim_options o = {SIM_DEFAULT_CAPACITY, SIM_DEFAULT_LINK, SIM_DEFAULT_DISK};
  int rc = mlo_spec_parse_kv(spec_args, sim_option, &o, err, errlen);
  if (rc) return rc;
  struct sim_ctx *s = mlo_calloc(1, sizeof *s);
  if (!s) return MLO_ENOMEM;
  if (!(s->clk = clock_new())) {
    free(s);
    return MLO_ENOMEM;
  }
  s->capacity = o.capacity;
  s->link = o.link;
  s->disk = o.disk;
  s->copy_free = SIM_EPOCH_NS;
  p->ops = &sim_ops;
  p->ctx = s;
  char cap[32];
  snprintf(p->description, sizeof p->description,
           "simulated, capacity %s, link %.2f GB/s, disk %.2f GB/s",
           mlo_format_size(o.capacity, cap, sizeof cap), (double)o.link / 1e9,
           (double)o.disk / 1e9);
  return MLO_OK;
}
